"""trainer.ft.torchft_adapter's process group against the installed torchft: the reach-ins
that set a stuck collective's group aside, scope each quorum's rendezvous, give its store
a deadline, and give up a gloo build a notice concerns.

Nothing here mocks torchft: the tests inspect the real installed classes (and the source
of the methods that use them) and run real gloo process groups and stores.
"""

from __future__ import annotations

import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

from trainer.ft import torchft_adapter as ft


def source(function: Callable[..., object]) -> str:
    return inspect.getsource(function)


def test_managed_work_keeps_the_process_groups_work() -> None:
    """pending_work reads _ManagedWork._work: the process group's own Work, whose future
    says whether the collective still runs."""
    from torchft.manager import _ManagedWork

    assert "self._work = work" in source(_ManagedWork.__init__)

    class Managed:
        _work = "the process group's"

    assert ft.pending_work(Managed()) == "the process group's"
    assert ft.pending_work("plain") == "plain"


def test_a_buried_process_group_is_not_aborted_by_the_next_configure() -> None:
    """bury_process_group empties ProcessGroupWrapper._pg, which configure aborts first
    (gloo's abort waits for a collective a cut-off peer never finishes); the buried group
    is kept referenced for its timeout."""
    from torchft.process_group import ProcessGroupWrapper

    assert "self.abort(errored=False)" in source(ProcessGroupWrapper.configure)
    assert "pg = self._pg" in source(ProcessGroupWrapper.abort)

    class Inner:
        aborted = False

        def abort(self) -> None:
            self.aborted = True

    wrapper, inner = ProcessGroupWrapper(), Inner()
    wrapper._pg = inner
    ft.bury_process_group(wrapper, keep_s=60.0)
    wrapper.abort(errored=False)
    assert wrapper._pg is None and not inner.aborted
    assert any(p is inner for _, p in ft._BURIED)


@pytest.mark.parametrize("base", [ProcessGroupGloo, ProcessGroupNCCL])
def test_process_group_configure(base: type[Any]) -> None:
    """Scoped.configure takes store_addr first, and the manager passes it first, positionally."""
    params = list(inspect.signature(base.configure).parameters)
    assert params[:2] == ["self", "store_addr"]
    assert "self._pg.configure(\n                        store_prefixed_addr," in source(
        Manager._async_quorum
    )
    scoped = ft.scoped_process_group(base)
    assert issubclass(scoped, base) and scoped.__name__ == f"Scoped{base.__name__}"


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_configure_gives_up_on_a_paused_store_at_the_timeout() -> None:
    """The quorum's store belongs to a member that may be paused (SIGSTOP: a fenced node).
    Its kernel still accepts the connection, and TCPStore's constructor then waits for the
    answer to its ping with no deadline; the scoped group gives up after its timeout."""
    import torchft.process_group

    code = (
        "import time; from torch.distributed import TCPStore; "
        "s = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); "
        "print(s.port, flush=True); time.sleep(120)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    original = torchft.process_group.create_store_client
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        os.kill(server.pid, signal.SIGSTOP)
        pg = ft.scoped_process_group(ProcessGroupGloo)(timeout=timedelta(seconds=2))
        with pytest.raises(TimeoutError, match=r"127\.0\.0\.1:\d+ did not answer within 2s"):
            pg.configure(f"127.0.0.1:{port}/torchft/1/0", "phalanx_group_00000:x", 0, 1)
    finally:
        server.kill()
        server.wait()
    assert torchft.process_group.create_store_client is original
    # The connecting thread ends once the store's process is gone.
    deadline = time.monotonic() + 30
    while any(t.name == "torchft-store-connect" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the connecting thread outlived the store"
        time.sleep(0.1)


@pytest.mark.timeout(60)
def test_configure_gives_up_at_once_on_a_store_whose_process_is_gone() -> None:
    """A store whose process died (its group's rank killed just after the quorum formed)
    refuses connections; torch's store client would retry them until the timeout (30 s by
    default, every other group held that long). The scoped group gives up at once."""
    with socket.socket() as s:  # a port nothing listens on: what a dead store leaves
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pg = ft.scoped_process_group(ProcessGroupGloo)(timeout=timedelta(seconds=30))
    # The probe's refusal, not the store client's 30 s deadline ("did not answer within").
    with pytest.raises(TimeoutError, match=rf"127\.0\.0\.1:{port} does not answer \("):
        pg.configure(f"127.0.0.1:{port}/torchft/1/0", "phalanx_group_00000:x", 0, 1)


@pytest.mark.timeout(60)
def test_a_gloo_build_waiting_on_a_silent_member_is_given_up_when_told() -> None:
    """The quorum thread's configure of a quorum whose other member never connects (cut
    off just after the quorum formed): gloo's connect would wait out the timeout (20 s
    here); the interrupter's reason ends it at once, and nothing is installed."""
    from torchft.process_group import ProcessGroupWrapper

    assert "self._pg = self._create_pg(store, rank, world_size)" in source(
        ProcessGroupWrapper.configure
    )
    assert list(inspect.signature(ProcessGroupGloo._create_pg).parameters)[1:] == [
        "store",
        "rank",
        "world_size",
    ]
    store = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    pg = ft.scoped_process_group(ProcessGroupGloo, interruptible=True)(
        timeout=timedelta(seconds=20)
    )
    told_at = time.monotonic() + 0.3
    builds: list[float] = []

    def interrupter() -> Callable[[], str | None]:
        builds.append(time.monotonic())
        return lambda: "member g1 lost" if time.monotonic() > told_at else None

    pg.interrupter = interrupter
    with pytest.raises(ft.ConfigureAbandoned, match="member g1 lost"):
        pg.configure(f"127.0.0.1:{store.port}/torchft/1/0", "phalanx_group_00000:x", 0, 2)
    assert len(builds) == 1 and time.monotonic() - told_at < 5.0  # not the 20 s timeout
    assert pg._pg is None  # the build left behind installs nothing
    # Not interruptible (NCCL: its build does not wait on peers): built on the caller's thread.
    plain = ft.scoped_process_group(ProcessGroupGloo)(timeout=timedelta(seconds=5))
    plain.interrupter = interrupter
    plain.configure(f"127.0.0.1:{store.port}/torchft/2/0", "phalanx_group_00000:x", 0, 1)
    assert len(builds) == 1 and plain._pg is not None
