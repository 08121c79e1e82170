"""A restarted rank is judged by its own heartbeat, never by the dead rank's.

The heartbeat file outlives its rank (same path, ``<run_dir>/heartbeat/rank-N``). Seen
in the suite: a group restarted after a fence spawned a cold rank that was still
importing torch 13 s later, and the daemon, reading the dead rank's last beat
(``step``), applied the learned step timeout and restarted it as hung. The rank here is
a stand-in process that never beats, as a rank does while it imports.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from daemon.ranks import workers
from daemon.ranks.hang import Timeouts
from daemon.ranks.spec import GroupSpec, heartbeat_path
from tests.support.group_specs import one_rank_spec
from trainer.contracts.heartbeat import PHASES, Heartbeat, read_beat


def spec(run_dir: Path) -> GroupSpec:
    return one_rank_spec(
        run_dir, run_dir / "job.toml", "http://127.0.0.1:1", num_slots=2, job="unit"
    )


def test_a_restarted_rank_starts_in_phase_start_whatever_the_dead_rank_last_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = spec(tmp_path)
    beat_path = heartbeat_path(s, 0)
    beat_path.parent.mkdir(parents=True)
    dead = Heartbeat(beat_path)  # the previous start's rank: steps, joined quorum 7, died
    dead.note_quorum(7)
    dead.enter("step")
    assert read_beat(beat_path).phase == "step" and read_beat(beat_path).quorum_id == 7

    monkeypatch.setattr(workers, "RANK_ARGV", [sys.executable, "-c", "import time; time.sleep(60)"])
    group = workers.WorkerGroup(s, attempt=2, on_event=lambda _rank, _event: None)
    group.start()
    try:
        # A short learned step timeout, a long start timeout: the new rank, silent as it
        # imports, is within the start's.
        limits = Timeouts({**dict.fromkeys(PHASES, 60.0), "step": 0.3}, learned=True)
        time.sleep(1.0)
        assert group.poll(limits) is None
        assert group.ranks[0].beat.phase == "start"
        assert read_beat(beat_path).quorum_id is None  # nobody to announce it to yet
    finally:
        group.kill()
