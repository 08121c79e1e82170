"""Running `phalanx run` on bad input and checking it was refused before anything started.

Tests of refusals run the real command to its end, note every process it started
on the way, and expect exit code 2 with one ``error: ...`` line naming the field or
file, no traceback and nothing left running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyetcd

from tests.support.harness import BIN, DAEMON_JOB, ROOT, alive, children, free_port

# Root reads and writes whatever a file's mode says. Without these two capabilities it
# meets modes as any user does, so the cases about modes run as root too (CI is root).
WITHOUT_DAC_OVERRIDE = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
    "--",
]


@dataclass
class Refusal:
    code: int
    stdout: str
    stderr: str
    started: set[int] = field(default_factory=set)


def phalanx_run(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None, modes: bool = False
) -> Refusal:
    """Run `phalanx run ARGS` to its end, noting every process it started on the way;
    `modes`: file modes bind it even when run as root."""
    out, err = tmp_path / "refused.out", tmp_path / "refused.err"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for name in ("PHALANX_CHAOS", "PHALANX_CHAOS_DELAY"):
        if env is None or name not in env:
            full_env.pop(name, None)
    with out.open("wb") as o, err.open("wb") as e:
        prefix = WITHOUT_DAC_OVERRIDE if modes and os.geteuid() == 0 else []
        popen = subprocess.Popen(
            [*prefix, str(BIN / "phalanx"), "run", *args],
            stdout=o,
            stderr=e,
            env=full_env,
            cwd=ROOT,
        )
    started: set[int] = set()
    deadline = time.monotonic() + 30
    while popen.poll() is None and time.monotonic() < deadline:
        started.update(children(popen.pid))
        time.sleep(0.01)
    if popen.poll() is None:
        for pid in [*children(popen.pid), popen.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        popen.wait(10)
        raise AssertionError(f"phalanx run {args} still running after 30 s")
    return Refusal(popen.returncode, out.read_text(), err.read_text(), started)


def assert_refused(result: Refusal, names: str) -> str:
    """Exit 2 with one `error:` line naming `names`; nothing started or left running."""
    assert result.code == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert names in lines[0], lines[0]
    assert result.started == set(), f"processes started: {result.started}"
    assert [pid for pid in result.started if alive(pid)] == []
    return lines[0]


def phalanx_keys(endpoint: str) -> list[bytes]:
    host, port = endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port), timeout=5)
    try:
        return [meta.key for _, meta in client.get_prefix("/phalanx/")]
    finally:
        client.close()


def sets(*overrides: str) -> list[str]:
    """`--set` arguments for each override."""
    return [a for o in overrides for a in ("--set", o)]


@dataclass
class Case:
    """A bad input: extra `phalanx run` arguments and environment, and what the error names."""

    names: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    modes: bool = False  # about file modes: run without root's override of them


Setup = Callable[[Path, contextlib.ExitStack], Case]


def a_file(tmp: Path) -> Path:
    (tmp / "file").write_text("")
    return tmp / "file"


def read_only_dir(tmp: Path) -> Path:
    (tmp / "ro").mkdir(mode=0o555)
    return tmp / "ro" / "run"


def override(names: str, *overrides: str) -> Setup:
    return lambda _, __: Case(names, sets(*overrides))


def path_setting(field: str, make: Callable[[Path], Path], names: str) -> Setup:
    """`field` = make(tmp), a path; `names` (what the refusal must say) may say {path}."""

    def setup(tmp: Path, _: contextlib.ExitStack) -> Case:
        path = make(tmp)
        return Case(names.format(path=path), sets(f'{field}="{path}"'))

    return setup


def honouring_modes(setup: Setup) -> Setup:
    return lambda tmp, stack: dataclasses.replace(setup(tmp, stack), modes=True)


def assert_refused_before_start(bad: Case, tmp_path: Path, endpoint: str | None) -> str:
    """`phalanx run` with the test job, its own node id, run_dir and ports, pointed at
    `endpoint` (else its embedded etcd), and `bad` on top: refused (assert_refused)
    with nothing created under tmp_path, no run_dir and no key under /phalanx/.
    Returns the error line."""
    run_dir = tmp_path / "run"
    base = [
        "--config",
        str(DAEMON_JOB),
        *sets(
            'node.id="refused"',
            f'node.run_dir="{run_dir}"',
            f"node.http_port={free_port()}",
            f"node.lighthouse_port={free_port()}",
        ),
    ]
    if endpoint:
        base += sets(f"etcd.endpoints={json.dumps([endpoint])}")
    before = set(tmp_path.iterdir())
    result = phalanx_run([*base, *bad.args], tmp_path, bad.env, bad.modes)
    line = assert_refused(result, bad.names)
    assert not run_dir.exists()
    created = (
        set(tmp_path.iterdir()) - before - {tmp_path / "refused.out", tmp_path / "refused.err"}
    )
    assert created == set()
    if endpoint:
        assert phalanx_keys(endpoint) == []
    return line
