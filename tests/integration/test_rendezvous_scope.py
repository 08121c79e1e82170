"""A quorum id reused after a lighthouse restart must not meet a dead peer's rendezvous keys.

Round 1: two real rank processes configure torchft's Gloo process group for quorum 2
and all-reduce; they leave gloo's rendezvous keys (one address per rank) in the
store, as a quorum that included a now-dead group does. Round 2 is a new quorum
that reuses id 2 with other members (a restarted lighthouse numbers from 1 again).

The test asserts the mechanism, not a race: it opens the store exactly as torchft
does for round 2's address (``create_store_client``) and looks for round 1's keys.
Under torchft's own prefix they are there, so a new rank would read a dead rank's
address instead of waiting for its live peer (whether that bites depends on who
arrives first). Under the membership-scoped prefix they are not, and round 2's
ranks meet each other, whatever the order in which they start.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torchft.process_group import create_store_client

from tests.support.harness import ROOT
from trainer.ft.torchft_adapter import scoped_process_group
from trainer.ft.torchft_group import membership_token

pytestmark = pytest.mark.integration

RANK = Path(__file__).with_name("rendezvous_rank.py")
# What gloo's full-mesh connect writes under the process group's prefix: device 0,
# one key per rank holding that rank's address.
GLOO_KEYS = ["0/0", "0/1"]
ROUND_1 = ["g0:aaaa", "g1:bbbb"]
ROUND_2 = ["g0:cccc", "g1:dddd"]


def rendezvous(port: int, scoped: bool, ids: list[str]) -> list[str]:
    """Run ranks 0 and 1 of one quorum to completion; return what each printed."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(RANK),
                str(port),
                str(rank),
                "1" if scoped else "0",
                ",".join(ids),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
        for rank in (1, 0)
    ]
    out = {
        rank: p.communicate(timeout=120)[0].strip() for rank, p in zip((1, 0), procs, strict=True)
    }
    return [out[0], out[1]]


class _AddressOnly:
    """Stands in for torchft's process group: keeps the address configure() is given."""

    def __init__(self, **_: Any) -> None:
        self.address = ""

    def configure(self, store_addr: str, *_: Any, **__: Any) -> None:
        self.address = store_addr


def address(port: int, scoped: bool, ids: list[str]) -> str:
    """The store address rank 0 of quorum 2 with members `ids` configures its process group at."""
    unscoped = f"127.0.0.1:{port}/torchft/2/0"  # what torchft's manager passes
    if not scoped:
        return unscoped
    pg = scoped_process_group(_AddressOnly)()
    pg.membership = lambda: membership_token(ids, step=0)
    pg.configure(unscoped, ids[0], 0, len(ids))
    return str(pg.address)


def stale_keys(address: str) -> list[str]:
    """Which of round 1's gloo keys a rank configured at `address` would read."""
    store = create_store_client(address, timeout=timedelta(seconds=5))
    return [key for key in GLOO_KEYS if store.check([key])]


@pytest.mark.parametrize("scoped", [False, True], ids=["torchft-prefix", "membership-scoped"])
def test_a_reused_quorum_id_meets_the_dead_peers_keys_only_unscoped(scoped: bool) -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert rendezvous(store.port, scoped, ROUND_1) == ["ok", "ok"]
    # Round 1's ranks (now gone) left their addresses where they configured.
    assert stale_keys(address(store.port, scoped, ROUND_1)) == GLOO_KEYS
    if scoped:
        # Round 2's prefix is fresh: nothing stale to read, and both ranks meet.
        assert stale_keys(address(store.port, scoped, ROUND_2)) == []
        assert rendezvous(store.port, scoped, ROUND_2) == ["ok", "ok"]
    else:
        # Why Phalanx scopes the prefix: round 2 configures at round 1's address, so its
        # ranks would read the dead ranks' addresses rather than wait for each other.
        assert address(store.port, scoped, ROUND_2) == address(store.port, scoped, ROUND_1)
        assert stale_keys(address(store.port, scoped, ROUND_2)) == GLOO_KEYS
