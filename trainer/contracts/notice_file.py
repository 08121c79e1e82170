"""``<run_dir>/notice.json`` (``PHALANX_NOTICE``): the daemon's last few notices to its
ranks, written by the daemon (``daemon/supervision/rank_notice.py``) and read by every
rank while it waits on a collective (``trainer.ft.notice``). Both sides use this module.

``{"notices": [{"seq", "lighthouse", "reason"}, ...]}``, oldest first, plus
``quorum_id`` and ``replicas`` for members lost from a quorum; replaced whole (a rename,
so a reader never sees half of it). Torch-free.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NAME = "notice.json"  # in the node's run directory


@dataclass(frozen=True)
class Told:
    """One notice: ``seq`` one more each time."""

    seq: int
    lighthouse: str
    reason: str
    quorum_id: int | None = None  # members lost from this quorum; None: the lighthouse moved
    replicas: tuple[str, ...] = ()  # the members lost

    @property
    def moved(self) -> bool:
        return self.quorum_id is None

    def fields(self) -> dict[str, Any]:
        """As written (and logged): a move has no quorum_id or replicas."""
        out = asdict(self)
        if self.moved:
            del out["quorum_id"], out["replicas"]
        else:
            out["replicas"] = list(self.replicas)
        return out


def write(path: Path, notices: Sequence[Told]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"notices": [t.fields() for t in notices]}))
    os.replace(tmp, path)


def read(path: Path) -> tuple[Told, ...]:
    """The notices, oldest first; OSError or ValueError (with its subclasses) when the file
    is missing or malformed."""
    raw = json.loads(path.read_text())
    try:
        return tuple(_told(n) for n in raw["notices"])
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a notice file ({e})") from None


def _told(raw: dict[str, Any]) -> Told:
    quorum_id = raw.get("quorum_id")
    return Told(
        int(raw["seq"]),
        str(raw["lighthouse"]),
        str(raw.get("reason", "")),
        None if quorum_id is None else int(quorum_id),
        tuple(str(r) for r in raw.get("replicas", ())),
    )
