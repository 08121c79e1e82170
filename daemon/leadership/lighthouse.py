"""The torchft lighthouse: run by the leader, reached by every rank through a local forwarder.

The leader daemon runs ``torchft_lighthouse`` on loopback, serves the published
address with its gate (``daemon.leadership.gate``: only the job's nodes get in), and
publishes that address in etcd. Each daemon runs a :class:`Forwarder` on a local port
that never changes while the daemon lives and answers the gate for its ranks; they
get ``TORCHFT_LIGHTHOUSE=http://127.0.0.1:<port>``.
When leadership moves, the forwarder drops its connections and sends new ones
to the new lighthouse, so surviving ranks keep their address and are not
restarted; torchft's manager reconnects on its next quorum or heartbeat.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

from daemon.children import capped_log, die_with_parent, free_port
from daemon.config import LighthouseConfig
from daemon.leadership.gate import Gate, answer
from daemon.leadership.lighthouse_main import native_extension
from daemon.leadership.lighthouse_status import StatusPage
from daemon.relay import Relay, close_socket
from trainer import logs

LAUNCHER = Path(__file__).with_name("lighthouse_main.py")
LOG_MAX_BYTES = 10 * 1024 * 1024  # lighthouse.log, and as much again in lighthouse.log.1


def lighthouse_command() -> list[str]:
    """How to start torchft's lighthouse: the launcher that skips importing torch, where
    torchft's native extension is installed beside this interpreter; else the
    `torchft_lighthouse` script."""
    if native_extension() is not None:
        return [sys.executable, str(LAUNCHER)]
    return [lighthouse_binary()]


def lighthouse_argv(
    command: list[str], cfg: LighthouseConfig, bind: str, min_replicas: int
) -> list[str]:
    """`command` (``lighthouse_command()``) with the job's quorum settings, listening on
    `bind` (host:port); the benches start theirs with it as the daemon does."""
    return [
        *command,
        "--min_replicas", str(min_replicas),
        "--bind", bind,
        "--join_timeout_ms", str(cfg.join_timeout_ms),
        "--heartbeat_timeout_ms", str(cfg.heartbeat_timeout_ms),
        "--quorum_tick_ms", str(cfg.quorum_tick_ms),
    ]  # fmt: skip


def lighthouse_binary() -> str:
    """`torchft_lighthouse` from the interpreter's environment, else PATH."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    if beside.exists():
        return str(beside)
    found = shutil.which("torchft_lighthouse")
    if not found:
        raise FileNotFoundError(
            "torchft_lighthouse not found beside the interpreter or on PATH; install torchft."
        )
    return found


class LighthouseError(RuntimeError):
    pass


class LighthouseProcess:
    """One torchft_lighthouse subprocess (the leader's), on loopback, behind its gate
    (``daemon.leadership.gate``) on the published address."""

    def __init__(
        self,
        cfg: LighthouseConfig,
        min_replicas: int,
        bind_host: str,
        port: int,
        log_path: Path,
        secret: bytes,
    ) -> None:
        self.cfg = cfg
        self.min_replicas = min_replicas
        self.bind_host = bind_host
        self.log_path = log_path
        self.port = port  # the gate's: what the job's nodes dial
        self.secret = secret
        self.internal_port: int | None = None  # the lighthouse's own, on 127.0.0.1
        self.gate: Gate | None = None
        self.status: StatusPage | None = None  # its status page, read each round
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it; raise LighthouseError if node.lighthouse_port is taken.

        The gate binds with SO_REUSEADDR: the closed connections of a lighthouse this
        node stopped (a fence, a resignation) linger on the port for a minute and must
        not read as the port being in use."""
        command = lighthouse_command()  # FileNotFoundError before anything is bound
        self.internal_port = free_port("127.0.0.1")
        try:
            self.gate = Gate(self.bind_host, self.port, self.internal_port, self.secret)
        except OSError as e:
            raise LighthouseError(
                f"node.lighthouse_port {self.port} on {self.bind_host} is in use ({e.strerror}); "
                "free it or choose another port."
            ) from None
        self.port = self.gate.port
        self.status = StatusPage(self.internal_port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        bind = f"127.0.0.1:{self.internal_port}"  # behind the gate: this host only
        argv = lighthouse_argv(command, self.cfg, bind, self.min_replicas)
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # no orphaned lighthouse if the daemon dies
        )
        assert self.popen.stdout is not None
        # The lighthouse logs every quorum (~1.9 MB in 110 s of a busy job): kept bounded.
        capped_log(self.popen.stdout, self.log_path, LOG_MAX_BYTES)

    def listening(self) -> bool:
        """One quick probe (no waiting): does the lighthouse accept connections yet?"""
        if self.internal_port is None:
            return False
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", self.internal_port)) == 0

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def stop(self) -> None:
        """SIGKILL and reap: a lighthouse keeps nothing worth a graceful stop, and a
        SIGKILLed process is gone at once, so this never holds up the daemon's loop."""
        if self.gate is not None:
            self.gate.close()
            self.gate = None
        if self.status is not None:
            self.status.close()
            self.status = None
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(2)
        self.popen = None


def parse_address(address: object) -> tuple[str, int] | None:
    """``host:port`` (optionally ``http://``, ``[v6]``) as a tuple; None for anything else."""
    if not isinstance(address, str):
        return None
    rest = address.removeprefix("http://").removeprefix("https://")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


class Forwarder:
    """A TCP forwarder on a fixed local port whose upstream (the leader's gate) can change;
    it answers the gate's handshake for the ranks with the job's secret."""

    def __init__(self, listen_host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = socket.create_server((listen_host, port), reuse_port=False)
        self.port: int = self._server.getsockname()[1]
        self._target: tuple[str, int] | None = None
        self._secret = b""
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._relay = Relay("lighthouse-forwarder-relay")
        self.log = logs.get()
        threading.Thread(target=self._accept, daemon=True, name="lighthouse-forwarder").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> tuple[str, int] | None:
        return self._target

    def set_target(self, address: str | None, secret: bytes = b"") -> None:
        """Point new connections at `host:port` (None: refuse them), a gate that `secret`
        opens; drop old connections on a change."""
        target = parse_address(address) if address else None
        with self._lock:
            if target == self._target and secret == self._secret:
                return
            self._target, self._secret = target, secret
            old, self._conns = self._conns, set()
        for conn in old:  # relayed ones the relay closes; one in its handshake fails it
            self._relay.cut(conn)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            target, secret = self._target, self._secret
            if target is not None:  # a new target drops it even while we dial the old one
                self._conns.add(client)
        if target is None:
            close_socket(client)
            return
        try:  # a cut-off host never answers: without the line above, its rank waited 5 s
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            close_socket(client)
            return
        try:
            answer(upstream, secret)
        except OSError:  # not the job's gate, or it refused us
            close_socket(client)
            close_socket(upstream)
            return
        with self._lock:
            if self._target != target:
                close_socket(client)
                close_socket(upstream)
                return
            # Pairs the relay ended are closed sockets: forget them as new ones come.
            self._conns = {c for c in self._conns if c.fileno() != -1}
            self._conns.update((client, upstream))
            self._relay.add(client, upstream)

    def close(self) -> None:
        self._closed = True
        close_socket(self._server)
        self.set_target(None)
        self._relay.close()
