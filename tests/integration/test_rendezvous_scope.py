"""A quorum id reused after a lighthouse restart must not meet a dead peer's rendezvous keys.

Round 1 leaves two ranks' gloo rendezvous keys in a store under torchft's prefix for
quorum 2 (as a quorum that included a now-dead group does). In round 2, new
processes rendezvous under the same quorum id, the new rank 1 arriving first, as
when a survivor is slower than a joining group. With torchft's prefix as is, the new
ranks read the dead ones' addresses and the full-mesh connect fails; with the
membership-scoped prefix (the quorum's replica ids, each carrying its process's
uuid) they meet.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch._C._distributed_c10d import TCPStore

from tests.harness import ROOT

pytestmark = pytest.mark.integration

RANK = Path(__file__).with_name("rendezvous_rank.py")


def rendezvous(port: int, scoped: bool, ids: list[str], stagger: float) -> list[str]:
    """Start rank 1, then (after `stagger` s) rank 0; return what each printed."""
    procs = {}
    for rank in (1, 0):
        argv = [
            sys.executable,
            str(RANK),
            str(port),
            str(rank),
            "1" if scoped else "0",
            ",".join(ids),
        ]
        procs[rank] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT
        )
        time.sleep(stagger)
    return [procs[r].communicate(timeout=120)[0].strip() for r in (0, 1)]


@pytest.mark.parametrize("scoped", [False, True], ids=["torchft-prefix", "membership-scoped"])
def test_a_reused_quorum_id_meets_fresh_peers_only_when_scoped(scoped: bool) -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert rendezvous(store.port, scoped, ["g0:aaaa", "g1:bbbb"], 0) == ["ok", "ok"]
    again = rendezvous(store.port, scoped, ["g0:cccc", "g1:dddd"], 3)
    if scoped:
        assert again == ["ok", "ok"]
    else:  # why Phalanx scopes the prefix: torchft's own prefix meets the dead peers' keys
        assert again == ["failed: RuntimeError", "failed: RuntimeError"]
