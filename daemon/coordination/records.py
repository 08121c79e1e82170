"""Reading what etcd holds without trusting it: keys as text, values as bounded JSON.

Anything with write access to the job's prefix (an operator with etcdctl, another
tool, a corrupted restore) can put a key that is not UTF-8 or a value nested thousands
deep. Neither may stop a daemon or `phalanx status`: such a record reads as absent, and
each bad key is reported once per process (``etcd_record_skipped``).
"""

from __future__ import annotations

import json
from typing import Any

from trainer import logs
from trainer.config.limits import MAX_DEPTH, value_depth

log = logs.get()

_reported: set[bytes] = set()
_REPORT_AT_MOST = 1000  # keys remembered, so a flood of bad keys cannot grow memory


def key_text(key: bytes) -> str | None:
    """The key as text; None (reported) when it is not UTF-8."""
    try:
        return key.decode()
    except UnicodeDecodeError:
        skipped(key, "the key is not UTF-8")
        return None


def load_value(raw: bytes | str, key: bytes | None = None) -> tuple[bool, Any]:
    """(True, value) for JSON nested at most MAX_DEPTH deep; (False, None) otherwise
    (reported when ``key`` is given)."""
    try:
        value = json.loads(raw)
    except ValueError:  # includes a value that is not UTF-8
        why = "the value is not JSON"
    except RecursionError:
        why = f"the value nests more than {MAX_DEPTH} levels deep"
    else:
        if value_depth(value) <= MAX_DEPTH:
            return True, value
        why = f"the value nests more than {MAX_DEPTH} levels deep"
    if key is not None:
        skipped(key, why)
    return False, None


def skipped(key: bytes, why: str) -> None:
    """Report a record that is read as absent, once per key."""
    if key in _reported:
        return
    if len(_reported) < _REPORT_AT_MOST:
        _reported.add(key)
    log.warning(
        "etcd_record_skipped",
        key=key.decode("utf-8", "backslashreplace")[:200],
        reason=why,
        fix="delete or rewrite the key (etcdctl del KEY)",
    )
