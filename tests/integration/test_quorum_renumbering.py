"""A new lighthouse numbers quorums from 1 again: a rank whose last quorum had the same id
with other members must rebuild its process group, or its collectives and its peers'
wait on each other until the timeout (trainer.torchft_adapter.QuorumRecorder).

Real torchft Managers (two one-rank groups in this process, each with its own store),
a real torchft lighthouse killed and started again on its address, real Gloo.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

from tests.harness import wait_for
from tests.ports import free_port
from trainer import torchft_adapter as ft
from trainer.torchft_group import membership_token
from trainer.transport import checkpoint_transport

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TIMEOUT = timedelta(seconds=8)


@contextmanager
def lighthouse_on(port: int) -> Iterator[None]:
    argv = [str(Path(sys.executable).parent / "torchft_lighthouse"), "--bind", f"127.0.0.1:{port}"]
    argv += ["--min_replicas", "1", "--join_timeout_ms", "2000", "--quorum_tick_ms", "20"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import socket

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 10, "the lighthouse to listen")
        yield
    finally:
        proc.kill()
        proc.wait(10)


class Group:
    """One one-rank replica group: a Manager with a scoped Gloo group and its recorder."""

    def __init__(self, index: int, lighthouse: str) -> None:
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.pg = ft.scoped_process_group(ProcessGroupGloo)(timeout=TIMEOUT)
        with ft.manager_server_bound_to("127.0.0.1"):
            self.manager = Manager(
                pg=self.pg,
                load_state_dict=lambda _: None,
                state_dict=lambda: {},
                min_replica_size=1,
                use_async_quorum=False,
                timeout=TIMEOUT,
                quorum_timeout=TIMEOUT,
                connect_timeout=TIMEOUT,
                quorum_retries=3,
                rank=0,
                world_size=1,
                store_addr="127.0.0.1",
                store_port=self.store.port,
                lighthouse_addr=lighthouse,
                replica_id=f"phalanx_group_{index:05d}",
                hostname="127.0.0.1",
                checkpoint_transport=checkpoint_transport(TIMEOUT),
                init_sync=False,
            )
        self.recorder = recorder = ft.record_quorums(self.manager)
        self.pg.membership = lambda: membership_token(
            recorder.replica_ids or [], step=recorder.max_step
        )

    def step(self, value: float) -> tuple[float, bool]:
        """One step: quorum, an all-reduce (the average over the quorum) of `value`, commit."""
        self.manager.start_quorum()
        t = torch.full((1,), value)
        self.manager.allreduce(t).wait()
        return float(t.item()), self.manager.should_commit()


def test_a_quorum_renumbered_by_a_restarted_lighthouse_rebuilds_the_process_group() -> None:
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    groups: list[Group] = []
    try:
        with lighthouse_on(port):
            a = Group(0, address)
            groups.append(a)
            assert a.step(1.0) == (1.0, True)  # quorum 1: a alone
            first = ft.quorum_id(a.manager)
        # The lighthouse goes and comes back on its address (a leader's, after a fence).
        with lighthouse_on(port):
            b = Group(1, address)
            groups.append(b)
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
            g.manager.shutdown(wait=False)
