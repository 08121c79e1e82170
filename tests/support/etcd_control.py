"""Test-only control of an embedded etcd: outages (stop and restart, SIGSTOP) and auth setup.

The shipped :class:`daemon.coordination.etcd_server.EmbeddedEtcd` only starts and stops a
server; what a test does to it to simulate failures lives here.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.coordination.etcd_server import EmbeddedEtcd


@dataclass(frozen=True)
class EtcdUser:
    """A user for :meth:`EmbeddedEtcd.enable_auth`, with read-write on keys under ``prefix``."""

    name: str
    password: str
    prefix: str


class ControlledEtcd(EmbeddedEtcd):
    """An embedded etcd a test can take away and bring back."""

    def restart(self) -> None:
        """Stop and start again on the same ports with the same data (outage tests)."""
        if self._client_port is None:
            raise RuntimeError("EmbeddedEtcd has not been started")
        self.stop()
        self._launch(log_mode="ab")

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
