"""trainer/ft/transport.py's SnapshotTransport against torchft's HTTPTransport: a healer reads
the state as it was sent while the sender commits and steps; reads stop at the sender's
next step. Real HTTP on the loopback, no mocks."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
from torchft.checkpointing.http_transport import HTTPTransport

from trainer.ft.transport import SafeHTTPTransport, SnapshotTransport

TIMEOUT = timedelta(seconds=10)


def transport(kind: type[SafeHTTPTransport], timeout: timedelta = TIMEOUT) -> SafeHTTPTransport:
    return kind(timeout=timeout, num_chunks=0, host="127.0.0.1", bind_host="127.0.0.1")


def test_a_healer_reads_the_sent_state_while_the_sender_commits_and_steps() -> None:
    sender = transport(SnapshotTransport)
    assert isinstance(sender, SnapshotTransport)
    receiver = transport(SafeHTTPTransport)
    weights = torch.ones(1000)
    live = {"model": {"w": weights}, "scalars": {"step": 3}}
    try:
        sender.send_checkpoint(dst_ranks=[1], step=3, state_dict=live, timeout=TIMEOUT)
        # torchft's should_commit; with torchft's transport the read below would then block.
        sender.disallow_checkpoint()
        weights.add_(1.0)  # the optimizer step after the commit
        got = receiver.recv_checkpoint(
            src_rank=0, metadata=sender.metadata(), step=3, timeout=TIMEOUT
        )
        assert isinstance(got, dict)
        assert torch.equal(got["model"]["w"], torch.ones(1000)) and got["scalars"] == {"step": 3}

        sender.close()  # the sender's next step: no more reads of step 3
        late = transport(SafeHTTPTransport, timedelta(seconds=1))
        with pytest.raises(Exception, match=r"(?i)timed out"):
            late.recv_checkpoint(
                src_rank=0, metadata=sender.metadata(), step=3, timeout=timedelta(seconds=1)
            )
        late.shutdown(wait=True)
    finally:
        sender.shutdown(wait=True)
        receiver.shutdown(wait=True)


def test_torchfts_transport_serves_the_live_tensors_and_its_commit_waits_for_the_read() -> None:
    """Why the copy: torchft's sender serves what the optimizer then changes, and its
    commit (disallow_checkpoint) blocks while a read is under way."""
    sender: HTTPTransport[object] = HTTPTransport(timeout=TIMEOUT, num_chunks=0)
    live = {"w": torch.ones(4)}
    try:
        sender.send_checkpoint(dst_ranks=[1], step=3, state_dict=live, timeout=TIMEOUT)
        live["w"].add_(1.0)
        got = transport(SafeHTTPTransport).recv_checkpoint(
            src_rank=0, metadata=sender.metadata(), step=3, timeout=TIMEOUT
        )
        assert isinstance(got, dict) and torch.equal(got["w"], torch.full((4,), 2.0))
        with sender._checkpoint_lock.r_lock():  # a read under way
            done = threading.Event()

            def commit() -> None:
                sender.disallow_checkpoint()
                done.set()

            committer = threading.Thread(target=commit)
            committer.start()
            assert not done.wait(0.5)
        assert done.wait(5)
        committer.join()
    finally:
        sender.shutdown(wait=True)
        # torchft's server listens on every interface and shutdown leaves its socket
        # open; later tests in this process check that nothing else does.
        sender._server.server_close()
