"""Bad workloads stop before training: exit 2, one line naming the entry point and the fix.

Each case is a real `python -m trainer` rank importing a real module written into a
temporary directory (put on the ranks' path by workload.python_path); one case goes
through `phalanx run`, which must report the rank's refusal, exit 2 and leave nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.harness import BIN, DAEMON_JOB, ROOT, alive, start_daemon

pytestmark = pytest.mark.integration
EXAMPLES = ROOT / "examples"

MODULE = """
import torch
import torch.nn.functional as F
from torch import nn

from trainer.workloads import Workload


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({"0": nn.Linear(4, 4), "1": nn.Linear(4, 4)})
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for block in self.blocks.values():
            x = block(x)
        return self.head(x).squeeze(-1)


class Data:
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.randn((), generator=g)


class Ragged:
    def __getitem__(self, i):
        return torch.zeros(i + 1), torch.zeros(())


def init(name, like, gen):
    return torch.randn(like.shape, generator=gen) * 0.1


CHANGES = {}


def spec(ctx):
    fields = dict(build_model=Model, init=init, loss=F.mse_loss, train_data=Data(), trunk="blocks")
    fields.update(CHANGES)
    return Workload(**fields)
"""

# (id, text appended to the module, workload.spec, what the one line must say)
CASES: list[tuple[str, str, str, str]] = [
    ("does-not-import", "raise RuntimeError('broken at import')", "wl:spec", "does not import"),
    ("no-such-function", "", "wl:make_it", "no callable 'make_it'"),
    (
        "not-a-workload",
        "def spec(ctx):\n    return {'model': 1}",
        "wl:spec",
        "not a trainer.workloads.Workload",
    ),
    (
        "entry-point-raises",
        "def spec(ctx):\n    raise KeyError('width')",
        "wl:spec",
        "raised KeyError",
    ),
    ("module-not-found", "", "wl_absent:spec", "no module 'wl_absent'"),
    (
        "tp-plan-path",
        "CHANGES['tp_plan'] = {'blocks.*.nope': 'colwise'}",
        "wl:spec",
        "tp_plan names 'blocks.*.nope'",
    ),
    (
        "tp-plan-style",
        "CHANGES['tp_plan'] = {'blocks.0': 'diagonal'}",
        "wl:spec",
        "style 'diagonal'",
    ),
    (
        "shard-unit-path",
        "CHANGES['shard_units'] = ['layers.*']",
        "wl:spec",
        "shard_units names 'layers.*'",
    ),
    ("split-point", "CHANGES['split_points'] = ['blocks.7']", "wl:spec", "split point 'blocks.7'"),
    ("items-do-not-collate", "CHANGES['train_data'] = Ragged()", "wl:spec", "do not collate"),
    (
        "build-raises",
        "CHANGES['build_model'] = lambda: 1 / 0",
        "wl:spec",
        "build_model raised ZeroDivisionError",
    ),
    (
        "init-wrong-shape",
        "CHANGES['init'] = lambda n, like, g: torch.zeros(3)",
        "wl:spec",
        "init returned (3,)",
    ),
]


def workload_dir(tmp_path: Path, extra: str) -> Path:
    where = tmp_path / "workload"
    where.mkdir()
    (where / "wl.py").write_text(MODULE + "\n" + textwrap.dedent(extra) + "\n")
    return where


def one_line(output: str) -> str:
    """The single error line of a refused rank: `error: ...` or a `bad_input` event."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    line = lines[0]
    if line.startswith("{"):
        event = json.loads(line)
        assert event["event"] == "bad_input", line
        return str(event["error"])
    assert line.startswith("error: "), line
    return line


@pytest.mark.parametrize(("name", "extra", "entry", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_workload_exits_2_with_one_line(
    tmp_path: Path, name: str, extra: str, entry: str, says: str
) -> None:
    where = workload_dir(tmp_path, extra)
    argv = [sys.executable, "-m", "trainer", "--config", str(EXAMPLES / "single.toml")]
    argv += ["--set", f'workload.spec="{entry}"', "--set", f'workload.python_path=["{where}"]']
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_line(proc.stdout + proc.stderr)
    assert entry in line and says in line, line


def test_the_daemon_reports_a_refused_workload_and_exits_2(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    where = workload_dir(tmp_path, "CHANGES['split_points'] = ['blocks.7']")
    d = start_daemon(
        tmp_path,
        "n1",
        [etcd_endpoint],
        overrides=['workload.spec="wl:spec"', f'workload.python_path=["{where}"]'],
    )
    try:
        assert d.wait(120) == 2, d.proc.tail()
        pids = [int(p) for e in d.events("group_started") for p in e["pids"]]
        assert pids and not any(alive(p) for p in pids)
        assert not d.events("group_restarted"), "a refused workload is not a crash to retry"
        failed = d.events("node_failed")
        assert failed and "split point 'blocks.7'" in str(failed[-1].get("error")), failed
    finally:
        d.stop()


def test_the_daemon_refuses_a_workload_module_it_cannot_find(tmp_path: Path) -> None:
    """Checked before anything starts, without importing torch (no etcd needed)."""
    proc = subprocess.run(
        [
            str(BIN / "phalanx"), "run", "--config", str(DAEMON_JOB),
            "--set", 'workload.spec="wl_absent:spec"', "--set", f'node.run_dir="{tmp_path / "n"}"',
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no module 'wl_absent'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "n").exists()
