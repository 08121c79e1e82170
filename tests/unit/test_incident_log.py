"""The node's incident record (daemon/accounting/incidents.py, incident_events.py): what
opens an incident, what it is called, what was done and when it ends; and how two
nodes' records of one failure become one (daemon/coordination/incident_store.py)."""

from __future__ import annotations

from pathlib import Path

from daemon.accounting import Action, Activity, Incident, IncidentLog, Kind
from daemon.accounting.incident_events import refusal_of, take
from daemon.accounting.incidents import KEEP, EtcdSeen, from_record, shared_key
from daemon.accounting.life_file import last_life, write_life
from daemon.coordination.incident_store import merged, one_per_failure
from daemon.node_state.progress import ProgressFold
from trainer.contracts import heartbeat
from trainer.contracts import rank_events as events
from trainer.contracts.checkpoint_names import NO_MARKER

STEP = {"event": events.STEP_ITEMS, "step": 9}


def test_a_rank_exit_is_open_until_the_ranks_commit_again() -> None:
    log = IncidentLog("node-b").opened(Kind.RANK_EXIT, 100.0, group=1, detail="rank 0 exited")
    log = log.acted(Action.RESTART)
    assert log.open is not None and log.closed == ()
    log = take(log, {"event": events.HEAL_DONE, "seconds": 1.0}, 102.0, 3)
    log = take(log, STEP, 103.5, 3)
    assert log.open is None
    (done,) = log.closed
    assert (done.kind, done.node, done.group, done.action) == (Kind.RANK_EXIT, "node-b", 1, "heal")
    assert (done.began, done.detected, done.recovered) == (100.0, 100.0, 103.5)
    assert done.cost_group_s == 3.5 and log.counts == ((Kind.RANK_EXIT, 1, 3.5),)


def test_what_happens_while_one_is_open_is_part_of_it() -> None:
    log = IncidentLog("a").opened(Kind.RANK_EXIT, 10.0).acted(Action.RESTART)
    log = log.opened(Kind.HANG, 11.0).opened(Kind.NON_FINITE, 11.5)
    assert log.open is not None and log.open.kind == Kind.RANK_EXIT
    # ... but a finding that explains it takes its kind: a checkpoint refused at load.
    refused = {"event": events.CHECKPOINT_INVALID, "reason": "checksum", "path": "/c/step-9"}
    log = take(log, refused, 12.0, 3)
    assert log.open is not None and log.open.kind == Kind.CHECKPOINT
    assert log.acted(Action.NONE).open == log.open  # the most telling action stays


def test_a_cold_restart_is_one_failure_however_many_nodes_record_it() -> None:
    """Every group lost its ranks: each node records it; read back, one failure. A second
    cold restart from the same checkpoint later is another."""

    def cold(node: str, at: float) -> tuple[Incident, ...]:
        log = IncidentLog(node).opened(Kind.RANK_EXIT, at).acted(Action.RESTART)
        log = take(log, {"event": events.CHECKPOINT_LOADED, "step": 350}, at + 10, 3)
        return take(log, STEP, at + 11, 3).closed

    first = [i for node, at in (("a", 100.0), ("b", 100.1), ("c", 100.2)) for i in cold(node, at)]
    assert {(i.action, i.groups) for i in first} == {(Action.COLD_RESTART, 3)}
    second = [i for node, at in (("a", 130.0), ("b", 130.05)) for i in cold(node, at)]
    one, other = one_per_failure([*first, *second])
    assert (one.node, one.began, one.recovered, one.groups) == ("a", 100.0, 111.2, 3)
    assert (other.began, other.action) == (130.0, Action.COLD_RESTART)
    # A job's first start loads a checkpoint too: no incident.
    assert (
        take(IncidentLog("a"), {"event": events.CHECKPOINT_LOADED, "step": 9}, 1.0, 3).open is None
    )


def seen(up: bool, term: int, at: float) -> EtcdSeen:
    return EtcdSeen(up, term, at)


def test_etcd_away_is_an_outage_if_its_term_moved_on_else_this_nodes_partition() -> None:
    up = IncidentLog("a").etcd(0.0, seen(True, 4, 0.0), 3)
    assert up.etcd_term == 4 and up.etcd(1.0, seen(True, 4, 1.0), 3) is up  # steady
    blip = up.etcd(10.0, seen(False, 4, 0.0), 3).etcd(10.3, seen(True, 4, 10.2), 3)
    assert blip.open is None and blip.etcd_lost is None  # under ETCD_LOST_MIN_S
    away = up.etcd(10.0, seen(False, 4, 0.0), 3).etcd(12.0, seen(False, 4, 0.0), 3)
    cut = away.etcd(16.0, seen(True, 4, 16.1), 3)  # answered since, the same term
    assert cut.open is not None and cut.open.kind == Kind.PARTITION
    assert (cut.open.began, cut.open.detected, cut.open.groups) == (10.0, 10.0, 1)
    down = away.etcd(13.0, seen(True, 5, 12.9), 3)
    assert down.open is not None and down.open.kind == Kind.ETCD_OUTAGE
    assert (down.open.key, down.open.groups) == (shared_key(Kind.ETCD_OUTAGE, 5), 3)


def test_the_term_from_before_etcd_was_away_is_no_answer_the_keepalive_is_waited_for() -> None:
    """etcd answers the round before the keepalive does: the term it holds is the one
    from before the loss, which would call every outage a cut."""
    away = IncidentLog("a").etcd(0.0, seen(True, 4, 0.0), 3).etcd(10.0, seen(False, 4, 0.0), 3)
    waiting = away.etcd(13.0, seen(True, 4, 9.0), 3)
    assert waiting.open is None and waiting.etcd_back == 13.0
    told = waiting.etcd(13.4, seen(True, 5, 13.3), 3)
    assert told.open is not None and told.open.kind == Kind.ETCD_OUTAGE
    assert (told.open.began, told.open.key) == (10.0, shared_key(Kind.ETCD_OUTAGE, 5))
    untold = waiting.etcd(17.9, seen(True, 4, 9.0), 3)
    assert untold.open is None  # within TERM_WAIT_S
    untold = untold.etcd(18.1, seen(True, 4, 9.0), 3)
    assert untold.open is not None and untold.open.kind == Kind.PARTITION
    # A cut told later, while still open, was the outage after all.
    late = untold.etcd(18.5, seen(True, 5, 18.4), 3)
    assert late.open is not None and late.open.kind == Kind.ETCD_OUTAGE
    # Ranks that failed while etcd was away failed because of it.
    failed = away.opened(Kind.RANK_EXIT, 11.0).etcd(14.0, seen(True, 4, 14.0), 3)
    assert failed.open is not None and failed.open.kind == Kind.PARTITION
    assert failed.open.began == 10.0


def test_a_straggler_is_no_incident_the_job_goes_on_at_its_pace() -> None:
    log = take(IncidentLog("a"), {"event": events.STRAGGLER, "rank": 0, "ratio": 2.1}, 5.0, 2)
    assert log.open is None and log.every() == ()


def test_a_drain_ends_when_the_node_leaves_and_the_memory_is_bounded() -> None:
    log = IncidentLog("a").opened(Kind.DRAIN, 1.0).acted(Action.DRAINED).left(4.0)
    assert log.closed[0].recovered == 4.0 and log.closed[0].action == Action.DRAINED
    for n in range(KEEP + 5):
        log = log.opened(Kind.NON_FINITE, 10.0 + n).committed(10.5 + n)
    assert (
        len(log.closed) == KEEP
        and dict((k, n) for k, n, _ in log.counts)[Kind.NON_FINITE] == KEEP + 5
    )


def test_two_nodes_records_of_one_failure_merge_into_one() -> None:
    a = IncidentLog("a").opened(Kind.RANK_EXIT, 10.0, key="k").acted(Action.RESTART).left(14.0)
    b = IncidentLog("b").opened(Kind.CHECKPOINT, 9.0, key="k").acted(Action.COLD_RESTART)
    one = merged(a.closed[0], b.left(16.0).closed[0])
    assert (one.kind, one.node, one.action) == (Kind.CHECKPOINT, "a", Action.COLD_RESTART)
    assert (one.began, one.recovered) == (9.0, 16.0)
    assert from_record("k", one.record()) == one
    assert from_record("k", {"kind": "meteor"}) is None


def test_a_life_that_never_said_it_ended_was_lost(tmp_path: Path) -> None:
    assert last_life(tmp_path) is None  # no predecessor
    write_life(tmp_path)
    write_life(tmp_path, leading=True)
    (tmp_path / heartbeat.DIRECTORY).mkdir()
    (tmp_path / heartbeat.DIRECTORY / "rank-0").write_text("step")
    lost = last_life(tmp_path)
    assert lost is not None and lost.leading and lost.last_seen > 0
    write_life(tmp_path, ended=True)
    assert last_life(tmp_path) is None


def test_read_back_a_group_that_healed_in_a_cold_restart_is_part_of_it() -> None:
    """Every group's ranks were killed: two loaded the checkpoint (one shared record), the
    third came back last and healed from them (its own record): one failure."""
    cold = IncidentLog("a").opened(Kind.RANK_EXIT, 100.0, key="cold_restart-from-500")
    cold = cold.acted(Action.COLD_RESTART).struck(3).left(103.0)
    healed = IncidentLog("c").opened(Kind.RANK_EXIT, 100.02).acted(Action.HEAL).left(104.0)
    later = IncidentLog("c").opened(Kind.RANK_EXIT, 130.0).acted(Action.HEAL).left(133.0)
    (one, other) = one_per_failure([*cold.closed, *healed.closed, *later.closed])
    assert (one.key, one.action, one.recovered, one.groups) == (
        "cold_restart-from-500",
        Action.COLD_RESTART,
        104.0,
        3,
    )
    assert other == later.closed[0]


def test_where_no_ranks_run_etcd_back_ends_what_it_opened_and_a_spare_has_nothing_open() -> None:
    up = IncidentLog("a").etcd(0.0, seen(True, 4, 0.0), 3, running=False)
    away = up.etcd(10.0, seen(False, 4, 0.0), 3, running=False)
    idle = away.etcd(14.0, seen(True, 4, 14.0), 3, running=False)
    assert idle.open is None and idle.closed[0].kind == Kind.PARTITION
    assert idle.closed[0].recovered == 14.0
    # An incident open before (its ranks exited) waits for their step as ever.
    failed = up.opened(Kind.RANK_EXIT, 9.0).etcd(10.0, seen(False, 4, 0.0), 3, running=False)
    failed = failed.etcd(14.0, seen(True, 4, 14.0), 3, running=False)
    assert failed.open is not None and failed.open.kind == Kind.PARTITION


def test_a_node_that_finds_its_seat_taken_has_nothing_left_to_recover() -> None:
    """Its previous life was lost and a spare took the seat: it waits as a spare now, and
    the job recovered without it."""
    fold = ProgressFold("a")
    fold.struck(Kind.NODE_LOST, "lost", None, began=1.0)
    fold.account(Activity.WAITING, EtcdSeen(True, 4, 1.0))
    assert fold.snapshot().incidents.open is not None
    fold.account(Activity.SPARE, EtcdSeen(True, 4, 1.0))
    (done,) = fold.snapshot().incidents.closed
    assert done.kind == Kind.NODE_LOST and done.recovered is not None


def test_a_checkpoint_refused_again_is_no_new_failure() -> None:
    """After a corrupted checkpoint was refused, a cold restart that finds it newest again
    is a rank exit (the kill), not a checkpoint failure."""
    refused = {"event": events.CHECKPOINT_INVALID, "reason": "sha256", "path": "/c/step-50"}
    log = IncidentLog("a").opened(Kind.RANK_EXIT, 1.0).acted(Action.RESTART)
    assert take(log, refused, 2.0, 3, frozenset({("/c/step-50", None)})).open == log.open
    assert take(log, refused, 2.0, 3).open.kind == Kind.CHECKPOINT  # type: ignore[union-attr]


def test_a_partial_checkpoint_is_no_new_failure_and_a_retention_report_none() -> None:
    """A rank killed mid-save (its exit, healed) left step-500 without its marker. Every
    rank killed later: the cold restart's load skips step-500 (partial), then refuses
    step-450 (corrupt): the incident is step-450's, not step-500's (which took the kind
    first and hid the corrupt one). A retention scan's report (``deleted: false``), of
    either, opens none: nobody is loading it."""
    partial = {"event": events.CHECKPOINT_INVALID, "path": "/c/step-500", "reason": NO_MARKER}
    corrupt = {"event": events.CHECKPOINT_INVALID, "path": "/c/step-450", "reason": "sha256"}
    cold = IncidentLog("b").opened(Kind.RANK_EXIT, 1.0).acted(Action.RESTART)
    skipped = take(cold, partial, 2.0, 3)
    assert skipped.open == cold.open  # a rank exit, as it was
    told = take(skipped, corrupt, 2.1, 3).open
    assert told is not None and (told.kind, told.checkpoint) == (Kind.CHECKPOINT, "/c/step-450")
    healed = IncidentLog("b").opened(Kind.RANK_EXIT, 1.0).acted(Action.HEAL).committed(2.0)
    for found in (partial, corrupt):
        later = take(healed, {**found, "deleted": False}, 12.0, 3)
        assert later.open is None and later.closed == healed.closed
    assert take(healed, corrupt, 12.0, 3).open is not None  # the same refused at load


def test_a_failure_after_etcd_came_back_is_its_own_and_the_outage_ended_with_etcd() -> None:
    """etcd was away 10-13; its term was told at 14.5; the ranks were killed at 14 (a
    cold restart): two failures, not one."""
    away = IncidentLog("a").etcd(0.0, seen(True, 4, 0.0), 3).etcd(10.0, seen(False, 4, 0.0), 3)
    waiting = away.etcd(13.0, seen(True, 4, 9.0), 3)
    killed = waiting.opened(Kind.RANK_EXIT, 14.0).acted(Action.RESTART)
    told = killed.etcd(14.5, seen(True, 5, 14.4), 3)
    assert told.open == killed.open  # the rank exit, as it was
    (outage,) = told.closed
    assert (outage.kind, outage.began, outage.recovered) == (Kind.ETCD_OUTAGE, 10.0, 13.0)
    assert outage.key == shared_key(Kind.ETCD_OUTAGE, 5)


def test_a_cold_restart_that_refuses_an_old_news_checkpoint_again_is_the_ranks_failure() -> None:
    """step-700 corrupted: node b refused it in that cold restart (a checkpoint incident).
    Every rank killed later, before step 700 was saved again: node a, which healed the
    first time, refuses it for the first time, node b again (skipped on its own). Read
    back, the second is the ranks lost; a newly refused checkpoint is one again."""
    old, new = "/ckpt/run-1/step-700", "/ckpt/run-1/step-750"

    def cold(
        node: str, at: float, kind: Kind, checkpoint: str = "", saved: float = 9.0
    ) -> Incident:
        log = IncidentLog(node).opened(Kind.RANK_EXIT, at)
        if checkpoint:
            refusal = (checkpoint, saved)
            log = log.opened(kind, at + 2, detail="sha256 mismatch", checkpoint=refusal)
        return log.acted(Action.COLD_RESTART).left(at + 5).closed[0]

    record = [
        cold("b", 100.0, Kind.CHECKPOINT, old),
        cold("b", 200.0, Kind.RANK_EXIT),
        cold("a", 200.1, Kind.CHECKPOINT, old),
        cold("a", 300.0, Kind.CHECKPOINT, new),
    ]
    want = [(Kind.CHECKPOINT, old), (Kind.RANK_EXIT, ""), (Kind.CHECKPOINT, old)]
    assert [(i.kind, i.checkpoint) for i in record] == [*want, (Kind.CHECKPOINT, new)]
    first, again, fresh = one_per_failure(record)
    assert (first.kind, first.node, first.checkpoint) == (Kind.CHECKPOINT, "b", old)
    assert (again.kind, again.began, again.action) == (Kind.RANK_EXIT, 200.0, Action.COLD_RESTART)
    assert (fresh.kind, fresh.checkpoint) == (Kind.CHECKPOINT, new)
    assert from_record(fresh.key, fresh.record()) == fresh
    # A rank's refusal names the checkpoint in the incident it opens or explains.
    refusal = {"event": events.CHECKPOINT_INVALID, "path": old, "reason": "sha256 mismatch"}
    told = take(IncidentLog("a").opened(Kind.RANK_EXIT, 200.1), refusal, 202.0, 3).open
    assert told is not None and (told.kind, told.checkpoint) == (Kind.CHECKPOINT, old)


def test_a_step_saved_again_and_refused_again_is_a_new_checkpoint_failure() -> None:
    """Soak seed 708768: step-950 corrupted; node a refused it in two cold restarts (one
    checkpoint failure, then the ranks'). Node c's ranks saved step 950 again, and that
    save was corrupted too: node a's daemon, which never saw the save, must count the
    refusal of the new one (its marker's time differs), on its own and read back."""
    path = "/ckpt/run-1/step-950"
    first = {"event": events.CHECKPOINT_INVALID, "path": path, "reason": "sha256", "saved": 10.0}
    resaved = {**first, "saved": 25.0}
    seen = frozenset({refusal_of(first)})
    log = IncidentLog("a").opened(Kind.RANK_EXIT, 30.0).acted(Action.RESTART)
    assert take(log, first, 31.0, 3, seen).open == log.open  # the same save: old news
    told = take(log, resaved, 31.0, 3, seen).open
    assert told is not None and told.kind == Kind.CHECKPOINT and told.refusal == (path, 25.0)

    def cold(at: float, refusal: dict[str, object]) -> Incident:
        opened = IncidentLog("a").opened(Kind.RANK_EXIT, at).acted(Action.COLD_RESTART)
        return take(opened, refusal, at + 1, 3).left(at + 5).closed[0]

    once, again, new = one_per_failure([cold(0.0, first), cold(20.0, first), cold(40.0, resaved)])
    assert [i.kind for i in (once, again, new)] == [
        Kind.CHECKPOINT,
        Kind.RANK_EXIT,
        Kind.CHECKPOINT,
    ]
    assert from_record(new.key, new.record()) == new


def test_a_rank_exit_over_before_a_cold_restart_began_is_a_failure_of_its_own() -> None:
    """Node c's rank killed and healed in 1.1 s; every rank killed 0.4 s later (within
    SAME_FAILURE_S of the first): two failures, not one cold restart."""
    healed = IncidentLog("c").opened(Kind.RANK_EXIT, 100.0).acted(Action.HEAL).left(101.1)
    cold_a = IncidentLog("a").opened(Kind.RANK_EXIT, 101.5).acted(Action.COLD_RESTART)
    cold_c = IncidentLog("c").opened(Kind.RANK_EXIT, 101.5).acted(Action.COLD_RESTART)
    record = [*healed.closed, *cold_a.left(104.0).closed, *cold_c.left(104.5).closed]
    first, second = one_per_failure(record)
    assert (first.node, first.action, first.recovered) == ("c", Action.HEAL, 101.1)
    assert (second.action, second.recovered) == (Action.COLD_RESTART, 104.5)
