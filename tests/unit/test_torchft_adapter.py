"""trainer.ft.torchft_adapter against the installed torchft: one test per private name it uses
(those of its process group in test_torchft_process_group.py).

Nothing here mocks torchft: the unit tests inspect the real installed classes (and
the source of the methods that use them), and the integration test runs one
quorum on a real Manager against a real lighthouse.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torchft._torchft import ManagerClient, QuorumResult
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.manager import REPLICA_ID_KEY, Manager
from torchft.process_group import ProcessGroupGloo

from tests.support.ft_managers import one_rank_manager, running_lighthouse
from tests.support.sockets import listeners
from trainer.exits import NoQuorum
from trainer.ft import torchft_adapter as ft
from trainer.ft.torchft_group import membership_token

TIMEOUT = timedelta(seconds=10)


def source(function: Callable[..., object]) -> str:
    return inspect.getsource(function)


def test_check_torchft_passes_on_the_installed_version() -> None:
    ft.check_torchft()


def test_check_torchft_names_the_version_and_what_is_missing() -> None:
    missing = ft.ReachIn("torchft.manager:Manager", "_no_such", "instance attribute", "a test")
    wrong_kind = ft.ReachIn(
        "torchft.checkpointing.http_transport:HTTPTransport", "address", "classmethod", "a test"
    )
    with pytest.raises(ft.TorchFTIncompatible) as raised:
        ft.check_torchft([*ft.REACH_INS, missing, wrong_kind])
    message = str(raised.value)
    assert f"torchft {importlib.metadata.version('torchft')}" in message
    assert "torchft.manager.Manager._no_such" in message and "not assigned" in message
    assert "HTTPTransport.address (classmethod" in message and "not a classmethod" in message
    assert "_healing" not in message  # only the broken ones are named


def test_every_reach_in_is_checked() -> None:
    """The checklist covers exactly the private names the tests below pin down."""
    assert {(r.owner.rpartition(":")[2] or r.owner, r.name) for r in ft.REACH_INS} == {
        ("Manager", "_client"),
        ("ManagerClient", "_quorum"),
        ("Manager", "_quorum_id"),
        ("Manager", "_healing"),
        ("Manager", "_quorum_future"),
        ("ProcessGroupGloo", "configure"),
        ("ProcessGroupNCCL", "configure"),
        ("torchft.process_group", "create_store_client"),
        ("HTTPTransport", "_load_from_address"),
        ("HTTPTransport", "_server"),
        ("HTTPTransport", "_state_dict"),
        ("torch.distributed._serialization", "_streaming_load"),
        ("torchft.manager", "ManagerServer"),
        ("torchft.manager", "uuid"),
        ("Manager", "_commit_failures"),
        ("torchft.checkpointing.http_transport", "_IPv6HTTPServer"),
        ("_ManagedWork", "_work"),
        ("ProcessGroupWrapper", "_pg"),
        ("ProcessGroupGloo", "_create_pg"),
    }


def test_manager_client() -> None:
    """record_quorums replaces Manager._client, which the quorum thread calls _quorum on."""
    assert re.search(r"self\._client = ManagerClient\(", source(Manager.__init__))
    assert "self._client._quorum(" in source(Manager._async_quorum)


def test_manager_client_quorum() -> None:
    """QuorumRecorder._quorum stands in for ManagerClient._quorum, called with keywords."""
    assert inspect.isroutine(inspect.getattr_static(ManagerClient, "_quorum"))
    params = set(inspect.signature(ManagerClient._quorum).parameters)
    call = source(Manager._async_quorum).split("self._client._quorum(", 1)[1].split(")", 1)[0]
    assert set(re.findall(r"(\w+)=", call)) <= params
    assert isinstance(inspect.getattr_static(QuorumResult, "replica_ids"), type(QuorumResult.heal))


def test_manager_quorum_id() -> None:
    assert "self._quorum_id = -1" in source(Manager.__init__)
    assert "self._quorum_id = quorum_id" in source(Manager._async_quorum)


def test_manager_healing() -> None:
    assert "self._healing = False" in source(Manager.__init__)
    assert "self._healing = True" in source(Manager._async_quorum)
    assert "self._healing = False" in source(Manager.start_quorum)


def test_manager_healing_comes_after_configure_and_before_the_fetch() -> None:
    """TorchFTGroup._heals_now reads the healing flag as 'the process group is configured
    for this quorum and the state is still on its way': the quorum thread configures,
    then sets the flag, then fetches; and the public waits (allreduce, num_participants)
    wait for the fetch too, which is why the healing exchange goes to the process group."""
    body = source(Manager._async_quorum)
    configure, flag = body.index("self._pg.configure("), body.index("self._healing = True")
    assert configure < flag < body.index("recv_checkpoint(")
    assert "self.wait_quorum()" in source(Manager.allreduce)
    assert "self.wait_quorum()" in source(Manager.num_participants)


def test_http_transport_state_dict() -> None:
    """SnapshotTransport counts reads through HTTPTransport._state_dict: the request
    handler streams it on the unchunked path, send_checkpoint assigns it."""
    assert "self._state_dict: Optional[T] = None" in source(HTTPTransport.__init__)
    assert "self._state_dict = tree_unflatten(values, spec)" in source(
        HTTPTransport.send_checkpoint
    )
    module = inspect.getsource(importlib.import_module("torchft.checkpointing.http_transport"))
    assert "state_dict = ckpt_server._state_dict" in module


def test_manager_quorum_future() -> None:
    """start_quorum stores the quorum thread's future where every public wait reads it."""
    assert "self._quorum_future: Optional[concurrent.futures.Future" in source(Manager.__init__)
    assert "self._quorum_future = self._executor.submit(" in source(Manager.start_quorum)
    assert "self._quorum_future.result()" in source(Manager.wait_quorum)


def test_http_transport_load_from_address() -> None:
    """SafeHTTPTransport overrides the classmethod recv_checkpoint fetches every URL with."""
    assert isinstance(inspect.getattr_static(HTTPTransport, "_load_from_address"), classmethod)
    expected = inspect.signature(ft.SafeHTTPTransport._load_from_address)
    assert list(inspect.signature(HTTPTransport._load_from_address).parameters) == list(
        expected.parameters
    )
    assert "self._load_from_address(" in source(HTTPTransport.recv_checkpoint)


def test_http_transport_server() -> None:
    """SafeHTTPTransport.address reads HTTPTransport._server for the port it listens on, and
    the server listens on the bind address only (torchft's listens on every interface)."""
    assert "self._server = " in source(HTTPTransport.__init__)
    assert "_IPv6HTTPServer(server_address, RequestHandler)" in source(HTTPTransport.__init__)
    transport = ft.SafeHTTPTransport(
        timeout=TIMEOUT, num_chunks=0, host="advertised.example", bind_host="127.0.0.1"
    )
    try:
        match = re.fullmatch(r"http://advertised\.example:(\d+)/checkpoint/", transport.address())
        assert match
        assert transport._server.socket.getsockname() == ("127.0.0.1", int(match[1]))
        with socket.create_connection(("127.0.0.1", int(match[1])), timeout=5):
            pass
    finally:
        transport.shutdown(wait=True)
    # The swap lasts only while the transport is built.
    from torchft.checkpointing import http_transport
    from torchft.http import _IPv6HTTPServer

    assert http_transport._IPv6HTTPServer is _IPv6HTTPServer


def test_manager_server() -> None:
    """manager_server_bound_to replaces the ManagerServer that Manager.__init__ builds, by
    name from torchft.manager's globals, with bind= given as a keyword."""
    import torchft.manager

    init = source(Manager.__init__)
    assert "self._manager = ManagerServer(" in init and "bind=bind," in init
    assert 'bind = f"[::]:{port}"' in init
    original = torchft.manager.ManagerServer
    with ft.manager_server_bound_to("127.0.0.1"):
        assert torchft.manager.ManagerServer is not original
    assert torchft.manager.ManagerServer is original


def test_streaming_load() -> None:
    """The private torch reader SafeHTTPTransport uses reads what torchft's sender writes."""
    from torch.distributed import _serialization
    from torchft.checkpointing import http_transport

    assert http_transport._streaming_save is _serialization._streaming_save
    assert "weights_only" in inspect.signature(_serialization._streaming_load).parameters


# --- A live Manager ----------------------------------------------------------------------


@pytest.fixture
def lighthouse() -> Iterator[str]:
    with running_lighthouse() as url:
        yield url


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_accessors_on_a_live_manager(lighthouse: str) -> None:
    """One quorum on a real Manager: every accessor returns the right kind of value."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = ft.scoped_process_group(ProcessGroupGloo)(timeout=TIMEOUT)
    manager = solo_manager(lighthouse, store, None, pg)
    try:
        # Nothing of this process but the test's own store listens on every interface;
        # the manager server listens on the address it was bound to.
        assert manager._manager is not None
        manager_port = int(manager._manager.address().rpartition(":")[2])
        mine = [lst for lst in listeners() if lst.pid == os.getpid()]
        assert [lst.port for lst in mine if lst.on_every_interface] == [store.port], mine
        assert [lst.address for lst in mine if lst.port == manager_port] == ["127.0.0.1"], mine
        recorder = ft.record_quorums(manager)
        assert recorder.replica_ids is None and ft.quorum_id(manager) == -1
        assert ft.quorum_future(manager) is None
        tokens: list[str] = []

        def membership() -> str:
            tokens.append(membership_token(recorder.replica_ids or [], step=recorder.max_step))
            return tokens[-1]

        pg.membership = membership
        manager.start_quorum()
        manager.wait_quorum()
        assert manager.errored() is None
        future = ft.quorum_future(manager)
        assert future is not None and future.done() and future.exception() is None

        quorum_id = ft.quorum_id(manager)
        assert isinstance(quorum_id, int) and quorum_id >= 1
        assert ft.is_healing(manager) is False
        # The recorder saw this quorum's members: this group, under the id the manager registered.
        replica_ids = recorder.replica_ids
        assert replica_ids is not None and replica_ids == [store.get(REPLICA_ID_KEY).decode()]
        # The scoped process group was configured once, for those members, and works.
        assert tokens == [membership_token(replica_ids, step=0)]
        tensor = torch.ones(2)
        manager.allreduce(tensor).wait()
        assert tensor.tolist() == [1.0, 1.0] and manager.num_participants() == 1
    finally:
        manager.shutdown(wait=True)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_quorum_that_does_not_form_in_time_raises_no_quorum() -> None:
    """The lighthouse waits for a second group that never comes: the quorum call fails
    at ft.quorum_timeout_s with NoQuorum (a TimeoutError), which the rank turns into
    its exit code 75 for the daemon. (The Manager here quorums synchronously; the
    ranks' asynchronous one raises the same exception from the step's wait.)"""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with running_lighthouse(min_replicas=2) as lighthouse:
        manager = one_rank_manager(lighthouse, store, TIMEOUT, quorum_timeout=timedelta(seconds=1))
        try:
            ft.record_quorums(manager)
            started = time.monotonic()
            with pytest.raises(NoQuorum, match=r"ft\.quorum_timeout_s") as raised:
                manager.start_quorum()
            assert isinstance(raised.value, TimeoutError)
            assert isinstance(raised.value.__cause__, TimeoutError)
            assert time.monotonic() - started < TIMEOUT.total_seconds()
        finally:
            manager.shutdown(wait=True)


def solo_manager(lighthouse: str, store: Any, replica_uuid: str | None, pg: Any = None) -> Manager:
    """Group 0's Manager, named phalanx_group_00000:<replica_uuid> (None: torchft's uuid)."""
    return one_rank_manager(lighthouse, store, TIMEOUT, replica_uuid=replica_uuid, pg=pg)


def test_replica_uuid_and_count_as_new() -> None:
    """replica_uuid replaces the uuid module Manager.__init__ draws the replica's uuid from,
    for the block only; count_as_new sets the failure count each quorum request carries."""
    import torchft.manager

    init = source(Manager.__init__)
    assert "new_uuid = str(uuid.uuid4())" in init
    assert 'replica_id = f"{replica_id}:{new_uuid}"' in init
    assert "commit_failures=self._commit_failures" in source(Manager._async_quorum)
    assert "self._commit_failures = 0" in source(Manager.should_commit)
    with ft.replica_uuid("0123abcd-ef"):
        assert torchft.manager.uuid.uuid4() == "0123abcd-ef"
    assert torchft.manager.uuid.uuid4() != torchft.manager.uuid.uuid4()
    with ft.replica_uuid(None):
        assert torchft.manager.uuid.uuid4() != torchft.manager.uuid.uuid4()


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_replacement_under_its_predecessors_id_is_a_new_quorum_at_once() -> None:
    """A group's process dies and a new one joins under the same replica id: the real
    lighthouse forms the new process's quorum without waiting out the dead one's
    heartbeat (here 10 minutes, so the quorum timeout would fire first), and, because
    the new process reports a failed commit, numbers it anew: other members would
    rebuild their process groups for it."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    name = "phalanx_group_00000:5eed0000-aaaa"
    with running_lighthouse("--heartbeat_timeout_ms", "600000") as lighthouse:
        first = solo_manager(lighthouse, store, "5eed0000-aaaa")
        recorder = ft.record_quorums(first)
        first.start_quorum()
        first.wait_quorum()
        assert recorder.replica_ids == [name] and store.get(REPLICA_ID_KEY).decode() == name
        before = ft.quorum_id(first)
        first.shutdown(wait=True)  # its manager server stops heartbeating, as a dead one's

        second = solo_manager(lighthouse, store, "5eed0000-aaaa")
        try:
            ft.count_as_new(second)
            recorder = ft.record_quorums(second)
            second.start_quorum()
            second.wait_quorum()  # raises at the quorum timeout (10 s) if it waits
            assert second.errored() is None
            assert recorder.replica_ids == [name]
            assert ft.quorum_id(second) > before
        finally:
            second.shutdown(wait=True)
