"""The leader's will: its leader lease revoked the moment its daemon dies.

A leader whose daemon is killed (SIGKILL, the OOM killer, a crash) leaves its ``leader``
key to its lease, so the job waits two seconds and more for etcd to expire it. While
it leads, the daemon keeps this small process (no torch) beside its lighthouse: it
connects to etcd at once, then blocks until the kernel signals that the daemon died
(``PR_SET_PDEATHSIG`` = SIGTERM), revokes the lease in one request and exits. The
other nodes see the key deleted and elect a leader in a fraction of a second. A host
that loses power or its network revokes nothing: the lease lapses as before.

The daemon ends the will with SIGKILL (nothing revoked) whenever it stops leading on
its own terms (a fence, a resignation, a new leader lease); it reads the settings and
the lease id as one JSON line on stdin (the password never in argv or the environment).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict

from daemon.coordination.etcd_client import CoordinationError, EtcdSettings, _Connection

PR_SET_PDEATHSIG = 1


def _sigterm_when_parent_dies(parent: int) -> None:
    """In the child before exec: SIGTERM blocked (the mask survives exec, so a death
    while the will still starts stays pending for its ``sigwait``), then asked for."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # died already: the will runs and revokes at once
        os.kill(os.getpid(), signal.SIGTERM)


class Will:
    """The daemon's side: one will process for one leader lease."""

    def __init__(self, settings: EtcdSettings, lease_id: int) -> None:
        self.lease_id = lease_id
        parent = os.getpid()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "daemon.leadership.will"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the daemon's process group is not its death
            preexec_fn=lambda: _sigterm_when_parent_dies(parent),
        )
        assert self.popen.stdin is not None
        line = json.dumps({"settings": asdict(settings), "lease": lease_id})
        with contextlib.suppress(OSError):
            self.popen.stdin.write(line.encode() + b"\n")
            self.popen.stdin.close()

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def cancel(self) -> None:
        """End it without revoking anything."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(2)


def main() -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    doc = json.loads(sys.stdin.readline())
    settings = EtcdSettings(**doc["settings"])
    lease = int(doc["lease"])
    conn = _Connection(settings, settings.timeout_s)
    with contextlib.suppress(CoordinationError):  # connected and authenticated ahead of need
        conn.call(lambda c: c.get("/phalanx/"))
    signal.sigwait({signal.SIGTERM})
    try:
        conn.call(lambda c: c.revoke_lease(lease))
    except CoordinationError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
