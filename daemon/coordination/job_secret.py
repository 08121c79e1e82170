"""The job's secret: 32 random bytes under ``/phalanx/<job>/secret``, made once.

The first daemon of a job creates it (a transaction that only creates); every later
one reads it. It opens the leader's lighthouse gate (``daemon.leadership.gate``):
only a holder of the job's etcd credentials learns it, so only the job's own nodes
reach its lighthouse. It is never logged, and never part of the job's view.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from pyetcd import transactions as txn

from daemon.coordination.etcd_client import CoordinationError
from daemon.coordination.records import load_value

Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]
SECRET_BYTES = 32


def get_or_make_secret(do_txn: Txn, key: str) -> bytes:
    """The job's secret (made now if there is none). `do_txn` is the coordinator's."""
    token = secrets.token_bytes(SECRET_BYTES)
    mine = json.dumps(token.hex())
    for _ in range(5):
        ok, responses = do_txn([txn.Create(key) == 0], [txn.Put(key, mine)], [txn.Get(key)])
        if ok:
            return token
        if responses and responses[0]:
            value, meta = responses[0][0]
            ok, text = load_value(value)  # what etcd holds is not trusted (records.py)
            try:
                stored = bytes.fromhex(text) if ok and isinstance(text, str) else b""
            except ValueError:
                stored = b""
            if len(stored) == SECRET_BYTES:
                return stored
            # Not a secret we made (garbage written there): replace it, unless changed since.
            do_txn([txn.Mod(key) == meta.mod_revision], [txn.Put(key, mine)], [])
    raise CoordinationError(f"the job's secret at {key} keeps changing; try again.")
