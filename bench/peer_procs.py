"""Process plumbing of bench/peers.py: children started in their own session that die
with the benchmark, /proc reads, and the new lines of growing log files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from daemon.children import die_with_parent

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
Event = dict[str, Any]


@contextlib.contextmanager
def scratch(prefix: str, keep: bool) -> Iterator[Path]:
    """A temporary directory for a benchmark's runs: removed at the end unless `keep`."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def child_env(**extra: str) -> dict[str, str]:
    """One thread per rank for every system; the repository importable."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def spawn(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def env_of(pid: int, name: str) -> str | None:
    """An environment variable of a running process (from /proc)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key.decode(errors="replace") == name:
            return value.decode(errors="replace")
    return None


def sigkill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")


class Tail:
    """The new complete lines of growing files."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}

    def lines(self, path: Path) -> list[str]:
        try:
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offsets[path] = self.offsets.get(path, 0) + len(complete)
        return complete.decode("utf-8", "replace").splitlines()

    def events(self, path: Path) -> list[Event]:
        out: list[Event] = []
        for line in self.lines(path):
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    parsed = json.loads(line)
                    if isinstance(parsed, dict):
                        out.append(parsed)
        return out
