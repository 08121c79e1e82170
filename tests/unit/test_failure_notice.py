"""A node's announcement that its group failed, from the rank's heartbeat to the other
groups' ranks; and the quorum that waited out the lighthouse's join timeout."""

from __future__ import annotations

import json
import types
from pathlib import Path

from daemon.coordination.job_view import assemble
from daemon.ranks.failure_notice import failure_word
from daemon.ranks.workers import ExitKind
from daemon.supervision.rank_notice import RankNotice
from trainer.contracts.heartbeat import Heartbeat, read_beat
from trainer.ft.quorum_watch import QuorumWatch, left_out
from trainer.ft.step_notices import StepNotices

LH = "10.0.0.1:29510"


def test_the_heartbeat_carries_the_last_quorum_without_adding_step_time(tmp_path: Path) -> None:
    path = tmp_path / "rank-0"
    beat = Heartbeat(path)
    beat.enter("step")
    assert read_beat(path).quorum_id is None  # no quorum yet
    beat.note_quorum(7)
    assert read_beat(path) == read_beat(path).__class__("step", None, 7)
    before = path.stat().st_mtime_ns
    beat.note_quorum(7)  # the same quorum again (the steady state): nothing written
    assert path.stat().st_mtime_ns == before
    beat.enter("step")  # a step's end: its seconds, and still the quorum
    got = read_beat(path)
    assert got.phase == "step" and got.step_s is not None and got.quorum_id == 7
    path.write_text(json.dumps({"phase": "step", "quorum_id": True}))
    assert read_beat(path).quorum_id is None  # not a number: nobody is named


def test_a_failed_or_hung_group_names_its_replica_and_its_ranks_quorum(tmp_path: Path) -> None:
    beats = [tmp_path / f"rank-{r}" for r in range(3)]
    for path, quorum in zip(beats, (5, 5, 4), strict=True):  # rank 2 lags its group's rank 0
        Heartbeat(path).note_quorum(quorum)
    word = failure_word(ExitKind.FAILED, 2, "ab-12", beats, LH)
    assert word is not None
    assert word["replicas"] == ["phalanx_group_00002:ab-12"]
    assert (word["quorum_id"], word["lighthouse"]) == (5, LH)
    assert failure_word(ExitKind.HUNG, 2, "ab-12", beats, LH) is not None
    # Nothing to announce: an end that left no collective behind, no lighthouse, no
    # uuid of the daemon's (torchft named the replica), or no rank that had a quorum.
    for kind in (ExitKind.COMPLETED, ExitKind.DRAINED, ExitKind.NO_QUORUM, ExitKind.BAD_INPUT):
        assert failure_word(kind, 2, "ab-12", beats, LH) is None
    assert failure_word(ExitKind.FAILED, 2, "ab-12", beats, None) is None
    assert failure_word(ExitKind.FAILED, 2, "", beats, LH) is None
    fresh = tmp_path / "fresh"
    fresh.touch()  # the daemon's empty file at spawn
    assert failure_word(ExitKind.FAILED, 2, "ab-12", [fresh], LH) is None


def test_the_job_view_reads_each_groups_failure() -> None:
    word = {"replicas": ["phalanx_group_00001:u"], "quorum_id": 3, "lighthouse": LH, "at": 1}
    view = assemble([("failed/1", word, 10), ("failed/x", word, 11), ("lost", None, 12)])
    assert view.failed == {1: word}


def test_an_announced_failure_concerns_only_the_ranks_still_in_that_quorum(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notice.json"
    daemon_side = RankNotice(path)
    daemon_side.follow_failed({}, LH)  # the first view: nothing is news
    in_quorum = StepNotices(path, lambda: (4, ["phalanx_group_00000:a", "phalanx_group_00001:u"]))
    later = StepNotices(path, lambda: (5, ["phalanx_group_00000:a", "phalanx_group_00001:u"]))
    word = {"replicas": ["phalanx_group_00001:u"], "quorum_id": 4, "lighthouse": LH, "at": 1}
    daemon_side.follow_failed({1: word}, LH)
    daemon_side.follow_failed({1: word}, LH)  # the same announcement is told once
    told = in_quorum.notice.changed(in_quorum.concerns)
    assert told is not None and (told.quorum_id, told.replicas) == (4, ("phalanx_group_00001:u",))
    assert later.notice.changed(later.concerns) is None  # the replacement's quorum: not it
    assert in_quorum.notice.changed() is None  # told once
    # A later failure of the same group is news again; one by a lighthouse no longer
    # published concerns nobody (a new lighthouse numbers its quorums from 1 again).
    daemon_side.follow_failed({1: {**word, "quorum_id": 5, "at": 2}}, LH)
    assert later.notice.changed(later.concerns) is not None
    daemon_side.follow_failed({1: {**word, "quorum_id": 5, "at": 3, "lighthouse": "old:1"}}, LH)
    assert later.notice.changed() is None
    # What was announced before a daemon's first view is not news to its ranks.
    fresh = RankNotice(tmp_path / "other.json")
    fresh.follow_failed({1: word}, LH)
    assert not (tmp_path / "other.json").exists()


def test_a_quorum_that_waited_out_the_join_timeout_names_the_groups_it_left_out() -> None:
    last = ["phalanx_group_00000:a", "phalanx_group_00001:b", "phalanx_group_00002:c"]
    now = ["phalanx_group_00000:a", "phalanx_group_00002:z"]  # group 2 restarted, new uuid
    assert left_out(last, now, 1.0, 1.0) == ["phalanx_group_00001"]
    assert left_out(last, now, 0.05, 1.0) == []  # formed at once: a group that left
    assert left_out(None, now, 10.0, 1.0) == []  # a first quorum waits for joiners by design
    assert left_out(last, last, 10.0, 1.0) == []  # slow, but nobody left out


def test_the_watch_counts_join_timeouts_and_beats_each_quorum(tmp_path: Path) -> None:
    beat = Heartbeat(tmp_path / "rank-0")
    watch = QuorumWatch(beat, join_timeout_ms=1000)

    def quorum(qid: int, *members: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(quorum_id=qid, replica_ids=list(members))

    first = quorum(1, "phalanx_group_00000:a", "phalanx_group_00001:b")
    watch.observe(None, first, 5.0)
    assert watch.take_join_timeouts() == 0
    second = quorum(2, "phalanx_group_00000:a")
    watch.observe(first, second, 1.2)
    assert read_beat(tmp_path / "rank-0").quorum_id == 2
    assert watch.take_join_timeouts() == 1 and watch.take_join_timeouts() == 0
    unknown = QuorumWatch(Heartbeat(None), join_timeout_ms=None)  # plain torchrun
    unknown.observe(first, second, 100.0)
    assert unknown.take_join_timeouts() == 0
