"""Hang timeouts per phase: the heartbeat's format both halves share, the resolved
settings, and the learned step timeout (daemon/ranks/hang.py, trainer/contracts/heartbeat.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from daemon.config import DaemonConfig
from daemon.ranks.hang import WINDOW, HangLimits, StepTimes, timeouts
from trainer.config import validate
from trainer.contracts.heartbeat import Beat, Heartbeat, read_beat


def _limits(**sections: dict[str, object]) -> HangLimits:
    return HangLimits.from_config(validate(DaemonConfig, dict(sections), "job.toml"))


def test_the_trainers_beats_read_back_with_the_time_spent_in_steps(tmp_path: Path) -> None:
    path = tmp_path / "rank-0"
    path.touch()  # as the daemon leaves it at spawn
    assert read_beat(path) == Beat("start", None)
    beat = Heartbeat(path)
    beat.enter("start")
    beat.enter("step")  # the first step ended: it counted from the start, not a step
    assert read_beat(path) == Beat("step", None)
    time.sleep(0.05)
    beat.enter("step")
    seen = read_beat(path)
    assert seen.phase == "step" and seen.step_s is not None and 0.05 <= seen.step_s < 5
    beat.enter("save")
    beat.enter("step")  # after a save: that time was the save's, not a step's
    assert read_beat(path) == Beat("step", None)
    beat.enter("quorum")
    assert read_beat(path).phase == "quorum"


def test_a_torn_or_foreign_heartbeat_reads_as_the_start(tmp_path: Path) -> None:
    path = tmp_path / "rank-0"
    for text in ('{"phase": "st', "[1, 2]", '{"phase": "nap"}', '{"phase": "step", "step_s": "x"}'):
        path.write_text(text)
        assert read_beat(path).step_s is None
    path.write_text('{"phase": "nap"}')
    assert read_beat(path).phase == "start"
    assert read_beat(tmp_path / "missing") == Beat()


def test_phases_default_to_the_node_timeout_and_nest_above_torchfts() -> None:
    limits = _limits(
        node={"hang_timeout_s": 120},
        ft={"timeout_s": 10, "quorum_timeout_s": 200},
        hang={"save_s": 900, "margin_s": 3},
    )
    assert limits.fixed["start"] == limits.fixed["load"] == limits.fixed["eval"] == 120
    assert limits.fixed["save"] == 900
    # A quorum wait ends by torchft's timeout first, however low the node's is.
    assert limits.fixed["quorum"] == 200 + 10 + 3
    assert limits.floor_s == 10 + 3  # a dead peer's collective times out first
    assert limits.ceiling_s == 120


def test_the_step_timeout_is_the_ceiling_until_enough_steps_were_seen() -> None:
    limits = _limits(node={"hang_timeout_s": 300}, ft={"timeout_s": 4}, hang={"step_samples": 10})
    times = StepTimes().add([0.1] * 9)
    t = timeouts(limits, times)
    assert not t.learned and t.of("step") == 300
    t = timeouts(limits, times.add([0.1]))
    assert t.learned and t.of("step") == limits.floor_s == 9  # 4 + the default 5 s margin


def test_the_learned_step_timeout_is_a_quantile_times_the_factor_within_bounds() -> None:
    limits = _limits(
        node={"hang_timeout_s": 100},
        ft={"timeout_s": 2},
        hang={"step_samples": 5, "step_quantile": 0.9, "step_factor": 3, "margin_s": 1},
    )
    steps = [1.0] * 89 + [5.0] * 10 + [40.0]  # one outlier above the 0.9 quantile
    t = timeouts(limits, StepTimes().add(steps))
    assert t.step_quantile_s == 5.0 and t.of("step") == 15.0 and t.step_median_s == 1.0
    slow = timeouts(limits, StepTimes().add([60.0] * 10))
    assert slow.of("step") == 100  # the ceiling: node.hang_timeout_s
    fast = timeouts(limits, StepTimes().add([0.01] * 10))
    assert fast.of("step") == 5  # the floor: hang.step_min_s, above ft.timeout_s + margin


def test_step_times_keep_a_window_of_the_newest() -> None:
    times = StepTimes().add([100.0] * WINDOW).add([1.0] * WINDOW)
    assert times.count == 2 * WINDOW and max(times.seen) == 1.0
    assert StepTimes().add([]) == StepTimes()


def test_the_loops_step_beats_are_written_off_its_thread_and_never_go_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52: the step loop does no file I/O for a step's beat; a longer phase is in
    the file before enter() returns, and a step beat still waiting never replaces it."""
    path = tmp_path / "rank-0"
    writers: list[str] = []
    replace = os.replace

    def recorded(src: Path, dst: Path) -> None:
        writers.append(threading.current_thread().name)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", recorded)
    beat = Heartbeat(path, background=True)
    beat.enter("start")  # written here: not a step
    assert writers == ["MainThread"] and read_beat(path).phase == "start"
    beat.enter("step")
    time.sleep(0.02)
    beat.enter("step")
    assert beat.flush()
    assert set(writers[1:]) == {"phalanx-heartbeat"}
    seen = read_beat(path)
    assert seen.phase == "step" and seen.step_s is not None and seen.step_s >= 0.02
    beat.note_quorum(4)
    assert beat.flush() and read_beat(path) == Beat("step", None, 4)
    for _ in range(200):  # beats faster than the writer: it may write fewer, never older
        beat.enter("step")
    beat.enter("save")
    assert writers[-1] == "MainThread" and read_beat(path).phase == "save"
    assert beat.flush()
    time.sleep(0.05)
    assert read_beat(path) == Beat("save", None, 4)


def test_a_step_beat_never_waits_for_a_write_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread holds no lock the step loop takes while it writes: a slow disk
    delays the file, never the step."""
    path = tmp_path / "rank-0"
    writing, release = threading.Event(), threading.Event()
    replace = os.replace

    def slow(src: Path, dst: Path) -> None:
        if threading.current_thread().name == "phalanx-heartbeat":
            writing.set()
            release.wait(10)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", slow)
    beat = Heartbeat(path, background=True)
    beat.enter("step")
    assert writing.wait(5)  # the writer is inside its write, and stays there

    def three_steps() -> None:
        for _ in range(3):
            beat.enter("step")

    entered = threading.Thread(target=three_steps)
    entered.start()
    entered.join(5)
    stuck = entered.is_alive()
    release.set()
    entered.join()
    assert not stuck, "a step beat waited for the writer's file I/O"
    assert beat.flush() and read_beat(path).phase == "step"
