"""`phalanx demo --kill-at`: where the demo's failure lands, or none."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.cli import main
from daemon.demo import Node, _summary


@pytest.mark.parametrize("kill_at", ["-1", "150", "200"])
def test_a_kill_past_the_run_is_bad_input_before_anything_starts(
    kill_at: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "demo"
    code = main(["demo", "--steps", "150", "--kill-at", kill_at, "--workdir", str(work)])
    assert code == 2
    assert "--kill-at" in capsys.readouterr().err
    assert not work.exists()  # nothing started


def _finished(name: str, digest: str) -> Node:
    node = Node(name, popen=None, http_port=0)  # type: ignore[arg-type]
    node.done, node.exit_code = {"step": 10, "params_sha256": digest, "loss": 1.0}, 0
    return node


def test_a_run_without_a_failure_asked_is_ok_when_the_digests_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = {n: _finished(n, "ab" * 32) for n in ("node-a", "node-b")}
    assert _summary(same, None, None, 10, tmp_path, keep=True, asked=False) == 0
    assert "none asked: --kill-at 0" in capsys.readouterr().out
    # a failure asked for and never injected is not OK, nor are digests that differ
    assert _summary(same, None, None, 10, tmp_path, keep=True, asked=True) == 1
    other = {"node-a": _finished("node-a", "ab" * 32), "node-b": _finished("node-b", "cd" * 32)}
    assert _summary(other, None, None, 10, tmp_path, keep=True, asked=False) == 1
