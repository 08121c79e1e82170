"""The leader reads which quorum members its lighthouse lost from torchft's status page."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from torchft._torchft import LighthouseClient

from daemon.leadership.lighthouse import lighthouse_command
from daemon.leadership.lighthouse_status import Lost, StatusPage, lost_members, read_status
from tests.support.ports import free_port, wait_listening


def test_a_member_of_the_last_quorum_that_stopped_heartbeating_is_lost() -> None:
    """Against torchft's real lighthouse: a member of the last quorum whose heartbeat
    is older than the timeout is named; a member heartbeating, and a replica that is
    not in the quorum, are not; a lighthouse that does not answer names nobody."""
    port = free_port()
    argv = [
        *lighthouse_command(),
        "--min_replicas", "2",
        "--bind", f"127.0.0.1:{port}",
        "--join_timeout_ms", "100",
        "--heartbeat_timeout_ms", "300",
        "--quorum_tick_ms", "50",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        page = read_status(port)
        assert page is not None and lost_members(page, 0.3) is None  # no quorum yet
        kept = StatusPage(port)
        assert [kept.read() is not None for _ in range(5)] == [True] * 5
        assert kept.dials == 1  # torchft's lighthouse keeps the connection open
        kept.close()
        client = LighthouseClient(f"http://127.0.0.1:{port}", timedelta(seconds=5))
        stays, goes = "phalanx_group_00000:a", "phalanx_group_00001:b"
        with ThreadPoolExecutor(2) as pool:  # a quorum of two forms once both ask
            asks = [
                pool.submit(
                    client.quorum,
                    replica_id=rid,
                    timeout=timedelta(seconds=10),
                    address=rid,
                    store_address="s",
                    step=1,
                    world_size=1,
                )
                for rid in (stays, goes)
            ]
            for ask in asks:
                ask.result()
        client.heartbeat("phalanx_group_00002:spare")  # heartbeating, in no quorum
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # `stays` keeps heartbeating, `goes` stopped
            client.heartbeat(stays)
            time.sleep(0.05)
        page = read_status(port)
        assert page is not None
        lost = lost_members(page, 0.3)
        assert lost is not None and lost.replicas == (goes,)
        assert lost.quorum_id == asks[0].result().quorum_id  # the quorum it was lost from
        assert lost_members(page, 5.0) is None
    finally:
        proc.kill()
        proc.wait()
    assert read_status(port) is None


def test_a_page_that_does_not_parse_names_nobody() -> None:
    assert lost_members("", 0.5) is None
    assert lost_members("<h2>Heartbeats</h2> x: seen 9s ago <h3>Previous Quorum</h3>", 0.5) is None
    page = (
        "<h3>Previous Quorum</h3>Previous quorum id: 4 <br><b>g:1</b>"
        "<h2>Heartbeats</h2>\n  g:1: seen 0.1s ago\n"
    )
    assert lost_members(page, 0.5) is None
    assert lost_members(page.replace("0.1s", "2.5s"), 0.5) == Lost(4, ("g:1",))
    assert lost_members(page.replace("0.1s", "2.5s").replace("id: 4", "id: ?"), 0.5) is None


def test_a_followers_probe_finds_a_live_gate_and_no_refusal_in_its_log() -> None:
    """The takeover probe (gate.alive): a live gate answers and counts no refusal; a
    listener that only accepts (a frozen daemon's kernel) and a closed port do not."""
    from daemon.leadership.gate import H2_PREFACE, Gate
    from daemon.leadership.gate import alive as gate_alive

    secret = b"s" * 32
    upstream = socket.create_server(("127.0.0.1", 0))
    gate = Gate("127.0.0.1", 0, upstream.getsockname()[1], secret)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks
    try:
        assert gate_alive("127.0.0.1", gate.port, secret, 1.0)
        upstream.settimeout(10)
        relayed, _ = upstream.accept()  # passed on like a rank's connection: no refusal
        with relayed:
            assert relayed.recv(len(H2_PREFACE)) == H2_PREFACE
        assert gate.refused == 0
        assert not gate_alive("127.0.0.1", silent.getsockname()[1], secret, 0.3)
    finally:
        gate.close()
        silent.close()
        upstream.close()
    assert not gate_alive("127.0.0.1", gate.port, secret, 0.3)


def test_the_kept_connection_is_dialled_again_once_when_the_server_closed_it() -> None:
    """A server that answers one request per connection and then closes it: every read
    still gets the page, on a new connection; one that stops answering gives None."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    body = b"<h1>Previous Quorum</h1>"

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    threading.Thread(target=serve, daemon=True).start()
    page = StatusPage(port)
    try:
        assert [page.read() for _ in range(3)] == [body.decode()] * 3
        assert page.dials == 3
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes its accept: nothing listens any more
        server.close()
    assert page.read() is None
    page.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    ],
    ids=["not-found", "no-length", "not-http"],
)
def test_an_answer_that_is_not_a_page_with_a_length_names_nobody(answer: bytes) -> None:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(answer)
                conn.recv(1)  # until the reader hangs up

    threading.Thread(target=serve, daemon=True).start()
    page = StatusPage(server.getsockname()[1])
    try:
        assert page.read() is None
    finally:
        page.close()
        server.close()
