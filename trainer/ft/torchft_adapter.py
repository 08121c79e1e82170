"""Every place Phalanx relies on torchft's (and one of torch's) private internals.

torchft 0.2.0 offers no public way to read the quorum id or the healing flag,
to see a quorum's members, to choose the process group's rendezvous prefix, to
harden the checkpoint transport's loader, to choose the address its manager
and checkpoint servers listen on, or to name a replica after its predecessor
and have the lighthouse number its quorum anew, so Phalanx reaches in. Each
reach-in is written once, below, with what it is and why it is needed, and
listed in :mod:`trainer.ft.torchft_check`, whose :func:`check_torchft` verifies at
startup that all of them still exist with the expected kind, so a torchft
upgrade fails loudly, naming what changed, rather than as an ``AttributeError``
in the middle of a quorum.
``tests/unit/test_torchft_adapter.py`` tests each one against the installed torchft.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import socket
import time
import types
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from http.server import ThreadingHTTPServer
from typing import Any

from torchft.checkpointing.http_transport import HTTPTransport

from trainer.exits import NoQuorum
from trainer.ft.bounded_waits import ConfigureAbandoned as ConfigureAbandoned
from trainer.ft.bounded_waits import unless_interrupted, with_deadline

# The list of reach-ins and the startup check, re-exported for the adapter's users.
from trainer.ft.torchft_check import REACH_INS as REACH_INS
from trainer.ft.torchft_check import ReachIn as ReachIn
from trainer.ft.torchft_check import TorchFTIncompatible as TorchFTIncompatible
from trainer.ft.torchft_check import check_torchft as check_torchft
from trainer.ft.torchft_check import versions as versions

# --- Manager ---------------------------------------------------------------------------


def quorum_id(manager: Any) -> int:
    """The id of the quorum the manager last configured its process group for (-1 before any)."""
    # Manager._quorum_id: set by the quorum thread on each reconfiguration. No public
    # getter in torchft 0.2.0; Phalanx logs it and exports it as phalanx_ft_quorum_id.
    return int(manager._quorum_id)


def is_healing(manager: Any) -> bool:
    """Whether this step's quorum found the group behind and it is receiving a peer's state."""
    # Manager._healing: set by the quorum thread when the lighthouse says heal, reset by
    # start_quorum. No public getter; Phalanx needs it to tell a fresh job (nobody has
    # committed, nobody heals, so load the newest checkpoint) from a group being healed.
    return bool(manager._healing)


def quorum_future(manager: Any) -> Future[None] | None:
    """The quorum of the step under way (None before the first start_quorum)."""
    # Manager._quorum_future: what start_quorum submits to the quorum thread. Every
    # public wait (wait_quorum, participating_rank, allreduce) blocks until the quorum
    # timeout; a group told to drain waits on it briefly instead, because the peers a
    # quorum waits for may have left already when every node drains at once.
    future: Future[None] | None = manager._quorum_future
    return future


class QuorumRecorder:
    """Stands in for a Manager's ManagerClient and keeps the last quorum result it returned.

    It also makes the manager rebuild its process group for a quorum that reuses the id
    of this rank's last one but is not the same quorum (:func:`_renumbered`). That
    happens only after a new lighthouse (a leader change, or the leader's own lighthouse
    restarted after a fence) numbered from 1 again. The manager compares ids alone: it
    would keep the last quorum's process group while the other members build a new one,
    and their collectives would wait on each other until the timeout (``ft.timeout_s``).
    Not covered: a rank whose last quorum's id and members come back unchanged while a
    peer's own last quorum differed (the peer's solo step after the restart failed to
    commit); that still costs one timeout, after which the failed commit renumbers."""

    def __init__(self, client: Any, manager: Any) -> None:
        self._client = client
        self._manager = manager
        self.last: Any = None  # torchft._torchft.QuorumResult
        self.renumbered = 0  # quorums whose reused id was not taken for the same quorum
        # Called with (the last result, this one, seconds the call took) on each quorum.
        self.observer: Callable[[Any, Any, float], None] | None = None

    # ManagerClient._quorum: the RPC the manager's quorum thread calls (with keywords)
    # to get each quorum from the lighthouse. The manager keeps the result's
    # replica_ids to itself; Phalanx needs them to scope the rendezvous prefix.
    # Its deadline is ft.quorum_timeout_s: a TimeoutError means the lighthouse formed no
    # quorum in that time, which the rank's exit code tells its daemon (NoQuorum).
    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        try:
            result = self._client._quorum(*args, **kwargs)
        except TimeoutError as e:
            raise NoQuorum(f"no quorum within ft.quorum_timeout_s ({e})") from e
        last, self.last = self.last, result
        if _renumbered(last, result):
            self.renumbered += 1
            # Manager._quorum_id: the id the quorum thread compares this result's with,
            # right after this call returns, to decide whether to reconfigure.
            self._manager._quorum_id = -1
        if self.observer is not None:
            self.observer(last, result, time.monotonic() - began)
        return result

    @property
    def replica_ids(self) -> list[str] | None:
        """The members of the last quorum (replica id and uuid), None before any."""
        return None if self.last is None else list(self.last.replica_ids)

    @property
    def max_step(self) -> int:
        """The step of the last quorum's most advanced members (the same on every member)."""
        return -1 if self.last is None else int(self.last.max_step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _renumbered(last: Any, result: Any) -> bool:
    """Whether `result` reuses the id of this rank's `last` quorum for another quorum.

    Under one lighthouse a quorum keeps its id only while its members, their stores
    and their commits stay the same, so neither of these can happen: other members,
    or this rank told to heal (it is behind, so it missed a commit that changed the
    id everywhere else)."""
    if last is None or result.quorum_id != last.quorum_id:
        return False
    members = (sorted(result.replica_ids), str(result.store_address))
    return members != (sorted(last.replica_ids), str(last.store_address)) or bool(result.heal)


def record_quorums(manager: Any) -> QuorumRecorder:
    """Install a :class:`QuorumRecorder` in front of the manager's client; return it."""
    # Manager._client: the ManagerClient the quorum thread calls _quorum on. Replaced
    # once, right after the Manager is built and before its first quorum.
    recorder = QuorumRecorder(manager._client, manager)
    manager._client = recorder
    return recorder


def replica_uuid(value: str | None) -> AbstractContextManager[None]:
    """A Manager built inside the block joins the lighthouse as ``<replica_id>:<value>``
    rather than under a fresh uuid4 (None: torchft's own)."""
    if value is None:
        return nullcontext()
    # torchft.manager.uuid: the module Manager.__init__ calls uuid4() from, once, to name
    # the replica that rank 0's manager server heartbeats and asks for quorums as.
    return _replaced("torchft.manager", "uuid", types.SimpleNamespace(uuid4=lambda: value))


def count_as_new(manager: Any) -> None:
    """Have the lighthouse number this process's first quorum anew even where it kept its
    predecessor's replica id: a quorum whose members' ids did not change keeps its id,
    and the other members would not rebuild their process groups for the new process."""
    # Manager._commit_failures: the failed commits in a row the quorum thread reports with
    # each request; the first commit resets it. The lighthouse gives a quorum a new id
    # when its members changed or any of them reports a failed commit.
    manager._commit_failures = max(1, int(manager._commit_failures))


# --- Process group ---------------------------------------------------------------------


def scoped_process_group(base: type, interruptible: bool = False) -> type:
    """torchft's process group, rendezvousing under a store prefix unique to the quorum's members.

    torchft names the prefix after the quorum id alone. A lighthouse that restarts
    (a leader failover) numbers its quorums from 1 again, so a later quorum can
    reuse an id whose keys a dead peer left in a survivor's store, and gloo's
    connect then waits on that peer until it times out. Adding the members'
    replica ids (each with its process's uuid) keeps every rendezvous fresh.
    Set ``membership`` on the instance to a function naming the current members.

    With `interruptible` (gloo: its backend connects to every member before configure
    returns), the backend is built on a thread of its own while the quorum thread asks
    ``interrupter`` (set on the instance: called once per build, it returns the check to
    poll) every :data:`BUILD_POLL_S` whether to give up, raising
    :class:`ConfigureAbandoned` with its reason: a member cut off after the quorum formed
    would otherwise hold the connect for ``ft.timeout_s`` or more, and every other group
    with it. What the left-behind build makes is dropped, never installed.

    It also gives connecting to that store a deadline (the process group's timeout):
    the store belongs to one quorum member, and a TCPStore client's constructor waits
    for the server's answer to a ping with no timeout. A member paused with SIGSTOP
    (a fenced node, see daemon.fencing) still accepts connections in its kernel, so
    without a deadline the quorum thread of every other member would wait until that
    member is killed or resumed, past the timeout and into the hang detector.
    """

    class Scoped(base):  # type: ignore[misc]
        membership: Callable[[], str] = staticmethod(lambda: "0")
        interrupter: Callable[[], Callable[[], str | None]] = staticmethod(lambda: lambda: None)

        # ProcessGroupWrapper._create_pg: what configure builds the backend with, after
        # the store client and before it installs the result as its process group.
        def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
            build = super()._create_pg
            if not interruptible:
                return build(store, rank, world_size)
            return unless_interrupted(lambda: build(store, rank, world_size), self.interrupter())

        # ProcessGroup.configure: public, but overriding it relies on the manager
        # passing "<store>/torchft/<quorum id>/<group rank>" as store_addr, first.
        # process_group.create_store_client: the function configure builds the store
        # client with (only the quorum thread calls it, so swapping it here is safe).
        def configure(self, store_addr: str, *args: Any, **kwargs: Any) -> None:
            create = importlib.import_module("torchft.process_group").create_store_client
            with _replaced("torchft.process_group", "create_store_client", with_deadline(create)):
                super().configure(f"{store_addr}/{self.membership()}", *args, **kwargs)

    Scoped.__name__ = Scoped.__qualname__ = f"Scoped{base.__name__}"
    return Scoped


def pending_work(work: Any) -> Any:
    """The process group's own work behind a managed one (torchft's ``_ManagedWork``), so a
    rank can see whether the collective is still running without waiting on it."""
    # _ManagedWork._work: the process group's Work; the managed work chains its future
    # callbacks only in wait(), so its own future is not usable before then.
    return getattr(work, "_work", work)


_BURIED: list[tuple[float, Any]] = []  # (when, process group) left to time out


def bury_process_group(pg: Any, keep_s: float) -> None:
    """Set aside the process group under a torchft wrapper whose collective a rank
    abandoned (its peer will never answer): the next quorum then builds a new one
    without aborting this one (gloo's abort waits for the stuck collective). It is kept
    referenced for `keep_s` (its own timeout), then dropped, by which time its
    collective has failed and its destructor does not wait."""
    now = time.monotonic()
    _BURIED[:] = [(t, p) for t, p in _BURIED if now - t < keep_s]
    # ProcessGroupWrapper._pg: the backend process group configure builds and aborts.
    inner, pg._pg = pg._pg, None
    if inner is not None:
        _BURIED.append((now, inner))


# --- Listening addresses ---------------------------------------------------------------


@contextmanager
def _replaced(module: str, name: str, value: Any) -> Iterator[None]:
    """`module.name` is `value` inside the block (the rank is single-threaded while it builds)."""
    owner = importlib.import_module(module)
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _host_port(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def manager_server_bound_to(host: str) -> AbstractContextManager[None]:
    """Managers built inside the block serve on `host` rather than on every interface."""

    # torchft.manager.ManagerServer: the Rust server Manager.__init__ builds on group rank 0,
    # with bind=f"[::]:{port}" hard-coded (every interface). Phalanx keeps the port.
    def bound(*args: Any, bind: str, **kwargs: Any) -> Any:
        return server_class(*args, bind=_host_port(host, bind.rpartition(":")[2]), **kwargs)

    server_class = importlib.import_module("torchft.manager").ManagerServer
    return _replaced("torchft.manager", "ManagerServer", bound)


def _http_server_on(host: str) -> type[ThreadingHTTPServer]:
    class BoundHTTPServer(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        request_queue_size = 1024  # as torchft's server

        def __init__(self, address: tuple[str, int], handler: Any) -> None:
            super().__init__((host, address[1]), handler)

    return BoundHTTPServer


# --- Checkpoint transport --------------------------------------------------------------


class SafeHTTPTransport(HTTPTransport[Any]):  # type: ignore[misc]
    """torchft's HTTP checkpoint transport, loading with ``weights_only=True``, advertising
    ``host`` and listening on ``bind_host`` only."""

    def __init__(self, timeout: timedelta, num_chunks: int, host: str, bind_host: str) -> None:
        self.host = host  # before super().__init__, which logs address()
        # http_transport._IPv6HTTPServer: the server class HTTPTransport.__init__ builds on
        # ("", 0), every interface. Phalanx swaps in one bound to bind_host.
        with _replaced(
            "torchft.checkpointing.http_transport", "_IPv6HTTPServer", _http_server_on(bind_host)
        ):
            super().__init__(timeout=timeout, num_chunks=num_chunks)

    # HTTPTransport._load_from_address: the classmethod recv_checkpoint fetches every
    # URL with. torchft 0.2.0 loads with full pickle there, which would let any peer
    # run code in a healing rank; Phalanx only sends tensors and plain containers.
    @classmethod
    def _load_from_address(cls, address: str, timeout: timedelta) -> object:
        # torch.distributed._serialization._streaming_load: the reader for the format
        # torchft's sender writes (torchft re-exports it); torch has no public one.
        from torch.distributed._serialization import _streaming_load

        with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
            return _streaming_load(f, weights_only=True)

    def address(self) -> str:
        # HTTPTransport._server: the HTTP server the transport started; torchft builds
        # the address from socket.gethostname(), Phalanx from the advertised host.
        port = self._server.socket.getsockname()[1]
        return f"http://{self.host}:{port}/checkpoint/"
