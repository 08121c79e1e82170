"""A warm process that forks standbys (``python -m trainer --zygote --control-fd N``).

A standby spawned fresh imports torch, torchft and the trainer again: about 3 s of
CPU that, on a node whose ranks keep every core busy, comes out of their steps even
at idle priority (caches, wake-ups), spread over the 20-45 s it then takes. The
daemon instead keeps one zygote per node: it warms up once, like a standby, and
forks a standby in a few milliseconds on request, which shares its memory until
either writes to it.

Protocol, on the Unix SOCK_SEQPACKET socket `control_fd` (one request, one reply):
the daemon sends ``{"env": {...}}`` (the standby's environment) with three file
descriptors attached (SCM_RIGHTS): its stdin, stdout and stderr. The zygote forks
twice, so that the standby's parent exits and the kernel gives the standby to the
nearest subreaper, the daemon (PR_SET_CHILD_SUBREAPER while it asks), which can then
wait for it and read its exit status like any child's. It answers ``{"pid": P}``
(0: the fork failed). End of input (the daemon closed the socket) ends the zygote.

The forked standby waits until the daemon adopted it, sets PR_SET_PDEATHSIG (it dies
with the daemon, like every rank), takes the environment sent, and goes on as
``python -m trainer --standby`` would after warming up (trainer/spares/standby.py).

A fork copies only the calling thread, and a lock another thread held is never
released in the child. The zygote starts no thread of its own and refuses to serve
if the warm-up left a Python thread running. Native pools may run: numpy's OpenBLAS
starts one at import where OMP_NUM_THREADS > 1, and OpenBLAS and OpenMP stop or
rebuild their pools around a fork (pthread_atfork), as every forked DataLoader
worker relies on.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainer import logs
from trainer.config import env as rank_vars
from trainer.contracts import spare_messages
from trainer.spares.scheduling import lower_to_idle
from trainer.spares.standby import Prepared, warm

PR_SET_PDEATHSIG = 1
ADOPTION_TIMEOUT_S = 10.0  # a forked standby not adopted by the daemon by then exits
MAX_REQUEST = 1 << 20  # bytes: the environment of a standby, as JSON


@dataclass(frozen=True)
class _Request:
    """One standby to fork: its stdin, stdout and stderr, its environment, and what the
    zygote passes on (its control socket to close, the daemon's pid, the warm-up)."""

    fds: list[int]
    env: dict[str, str]
    control_fd: int
    daemon: int
    config_path: str
    prepared: Prepared
    run_rank: RankMain


# `python -m trainer`'s main, handed in by it: `(argv, prepare) -> exit code`.
RankMain = Callable[[list[str], Callable[[str, int], Prepared]], int]


def serve(config_path: str, control_fd: int, run_rank: RankMain) -> int:
    """Warm up, then fork a standby per request until the daemon closes the socket; each
    standby runs `run_rank` (the rank's main) with the warm-up as its preparation."""
    started = time.monotonic()
    logs.configure()
    log = logs.get()
    control = socket.socket(fileno=control_fd)
    prepared = _warm_at_idle(config_path)
    if threading.active_count() != 1:  # the daemon then spawns its standbys as before
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        log.warning("standby_zygote_refused", reason=f"Python threads after warming up: {names}")
        return 0
    gc.freeze()  # what the warm-up built stays in pages the standbys share
    log.info("standby_zygote_ready", pid=os.getpid(), seconds=round(time.monotonic() - started, 3))
    daemon = os.getppid()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 3)
        except OSError:
            return 0
        if not data:
            return 0
        pid = 0
        try:
            if len(fds) == 3:
                env = spare_messages.started_env(data)
                pid = _fork(
                    _Request(fds, env, control.fileno(), daemon, config_path, prepared, run_rank)
                )
        except (OSError, ValueError, KeyError) as e:
            log.warning("standby_fork_failed", error=f"{type(e).__name__}: {e}")
        finally:
            for fd in fds:
                os.close(fd)
        with contextlib.suppress(OSError):
            control.send(spare_messages.forked(pid))


def _warm_at_idle(config_path: str) -> Prepared:
    """Warm up as a standby would (at idle priority where the daemon's standbys do),
    then go back to normal priority: forking is quick, and a request is waited for."""
    lowered = lower_to_idle()
    prepared: Prepared = None
    with contextlib.suppress(Exception):  # the standbys (as ranks) report problems
        prepared = warm(config_path, int(os.environ.get(rank_vars.WORLD_SIZE, "1")))
    lowered.restore()
    return prepared


def _fork(request: _Request) -> int:
    """Fork a standby through a child that exits at once; return the standby's pid."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # the middle process: it forks the standby and exits
        code = 1
        try:
            os.close(read_end)
            standby = os.fork()
            if standby == 0:
                os.close(write_end)
                _become_standby(request)
            os.write(write_end, str(standby).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        answer = os.read(read_end, 32)
    finally:
        os.close(read_end)
        os.waitpid(child, 0)  # once it is gone, the standby is the daemon's child
    return int(answer) if answer else 0


def _become_standby(r: _Request) -> None:
    """In the forked standby: never returns."""
    code = 1
    try:
        os.setsid()  # a session (and session group) of its own, like a spawned standby
        os.close(r.control_fd)
        for target, fd in enumerate(r.fds):
            os.dup2(fd, target)
        for fd in r.fds:
            if fd > 2:
                os.close(fd)
        middle, deadline = os.getppid(), time.monotonic() + ADOPTION_TIMEOUT_S
        while (parent := os.getppid()) != r.daemon:  # the middle process is still exiting
            if parent != middle or time.monotonic() > deadline:  # the daemon is gone
                os._exit(1)
            time.sleep(0.001)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != r.daemon:  # the daemon died before prctl took effect
            os._exit(1)
        os.environ.clear()
        os.environ.update(r.env)

        def given(path: str, world: int) -> Prepared:
            return r.prepared

        code = r.run_rank(["--standby", "--config", r.config_path], given)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
