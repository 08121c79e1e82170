"""A new lighthouse numbers quorums from 1 again: a rank whose last quorum had the same id
with other members must rebuild its process group, or its collectives and its peers'
wait on each other until the timeout (trainer.ft.torchft_adapter.QuorumRecorder).

Real torchft Managers (two one-rank groups in this process, each with its own store),
a real torchft lighthouse killed and started again on its address, real Gloo.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torchft.process_group import ProcessGroupGloo

from daemon.leadership.lighthouse_status import heard, read_status
from tests.support.ft_managers import one_rank_manager, running_lighthouse
from tests.support.harness import wait_for
from tests.support.ports import free_port
from trainer.ft import torchft_adapter as ft
from trainer.ft.torchft_group import membership_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TIMEOUT = timedelta(seconds=8)


class Group:
    """One one-rank replica group: a Manager with a scoped Gloo group and its recorder."""

    def __init__(self, index: int, lighthouse: str) -> None:
        self.store: Any = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.pg = ft.scoped_process_group(ProcessGroupGloo)(timeout=TIMEOUT)
        self.manager = one_rank_manager(
            lighthouse,
            self.store,
            TIMEOUT,
            group=index,
            pg=self.pg,
            quorum_retries=3,  # the first call may meet the dead lighthouse's connection
            quorum_timeout=4 * TIMEOUT,  # room for those retries (the trainer's: 60 s)
        )
        self.recorder = recorder = ft.record_quorums(self.manager)
        self.pg.membership = lambda: membership_token(
            recorder.replica_ids or [], step=recorder.max_step
        )

    @property
    def replica(self) -> str:
        """The group's replica id; the lighthouse lists it with the manager's uuid after it."""
        return str(self.manager._replica_id)

    def close(self) -> None:
        """Stop the manager and drop the store at once: a later test in this process
        counts the listeners it finds."""
        self.manager.shutdown(wait=True)
        self.store = None

    def step(self, value: float) -> tuple[float, bool]:
        """One step: quorum, an all-reduce (the average over the quorum) of `value`, commit."""
        self.manager.start_quorum()
        t = torch.full((1,), value)
        self.manager.allreduce(t).wait()
        return float(t.item()), self.manager.should_commit()


def heard_recently(port: int, replicas: list[str]) -> bool:
    """The lighthouse on `port` heard each of `replicas` (a group's id, before the
    manager's uuid) within the last second."""
    page = read_status(port)
    seen = heard(page) if page is not None else {}
    ages = {
        r: min((a for i, a in seen.items() if i.startswith(f"{r}:")), default=math.inf)
        for r in replicas
    }
    return all(age < 1.0 for age in ages.values())


def test_a_quorum_renumbered_by_a_restarted_lighthouse_rebuilds_the_process_group() -> None:
    port = free_port()
    groups: list[Group] = []
    try:
        with running_lighthouse(port=port) as address:
            a = Group(0, address)
            groups.append(a)
            assert a.step(1.0) == (1.0, True)  # quorum 1: a alone
            first = ft.quorum_id(a.manager)
        # The lighthouse goes and comes back on its address (a leader's, after a fence).
        with running_lighthouse(port=port):
            b = Group(1, address)
            groups.append(b)
            # Both managers must be heard by the new lighthouse before either asks: b's
            # heartbeats from its start, a's once its client reconnects (which took over
            # 1 s on a loaded CI machine, so b made quorum 1 alone and a's request waited
            # out its timeout). Heard, a alone cannot make a quorum, nor b.
            wait_for(
                lambda: heard_recently(port, [a.replica, b.replica]),
                30,
                "the restarted lighthouse to hear both groups' heartbeats",
            )
            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(Group.step, [a, b], [1.0, 3.0]))
            # Its first quorum, a and b, is numbered 1 again: a's last id, other members.
            assert ft.quorum_id(a.manager) == first == ft.quorum_id(b.manager)
            # Both met in one two-member group. Without the rebuild, a all-reduces on its
            # old one-member group and commits a wrong average (0.5: its own 1.0 over the
            # two participants), while b's step fails after waiting for a.
            assert results == [(2.0, True), (2.0, True)], results
            assert a.manager.errored() is None and b.manager.errored() is None
            assert a.recorder.renumbered == 1 and b.recorder.renumbered == 0
    finally:
        for g in groups:
            g.close()
