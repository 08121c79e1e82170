"""Hot-spare ranks (daemon/ranks/standby.py): a node's first standby is spawned and its zygote
(daemon/ranks/zygote.py) started once that one is ready; a standby forked by the zygote
replaces a killed rank; a dead standby or zygote is replaced;
`node.standby = false` starts ranks cold; SIGTERM and a SIGKILL of the daemon take the
standbys along; a standby handed its start while it warms leaves idle priority at once.
Real daemons, etcd, lighthouse and rank processes; real SIGKILL/SIGSTOP/SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.ranks.spec import rank_env
from daemon.ranks.standby import REFILL_DELAY_S, Standby
from daemon.ranks.zygote import parent_of
from tests.support.group_specs import one_rank_spec
from tests.support.harness import (
    Daemon,
    Event,
    alive,
    children,
    event_time,
    free_port,
    hurry,
    ready_standby,
    start_daemon,
    wait_for,
)
from trainer.spares.scheduling import IDLE_AUTOGROUP_NICE, autogroup_nice, may_leave_idle

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "examples" / "single.toml"


def restart_after(d: Daemon, count: int, timeout: float = 60) -> Event:
    """The `count`-th group_restarted event of `d`."""
    events = wait_for(
        lambda: len(d.events("group_restarted")) >= count and d.events("group_restarted"),
        timeout,
        f"restart {count} of {d.node_id}",
    )
    event: Event = events[count - 1]
    return event


def group_nice(pid: int) -> int | None:
    return autogroup_nice(Path(f"/proc/{pid}/autogroup"))


def expect_nice(nice: int) -> int | None:
    """`nice`, or None on a kernel built without session groups (no autogroup file)."""
    return nice if Path("/proc/self/autogroup").exists() else None


def heals(d: Daemon) -> int:
    return len(d.events("heal_done"))


def test_standbys_replace_killed_ranks_and_are_replaced_when_they_die(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    # Paced at 1 s a step until hurried. At HOLD_PACE_S a loaded machine (warming the
    # idle-priority standbys for minutes) once spent 195 of 200 steps before node-b's
    # kill: node-a finished, and node-b's new rank had no peer to heal from. At most
    # about 130 steps were spent there at this pace; the rest run unpaced.
    steps, pace_s = ["train.steps=300", "node.standby=true"], 1.0
    # Two threads per rank, as the daemon sets by default here: numpy's OpenBLAS then runs a
    # thread of its own in the zygote when it forks (trainer/spares/zygote.py).
    a = start_daemon(
        tmp_path,
        "node-a",
        [etcd_endpoint],
        overrides=steps,
        env={"OMP_NUM_THREADS": "2"},
        pace_s=pace_s,
    )
    b = start_daemon(
        tmp_path,
        "node-b",
        [etcd_endpoint],
        overrides=[*steps, "node.standby=false"],
        pace_s=pace_s,
    )
    try:
        wait_for(lambda: a.step() > 3 and b.step() > 3, 120, "both groups to train")

        # A node's first standby is spawned; as root it waits at idle priority, its
        # session group at nice 19 where the kernel groups by session (trainer/spares/scheduling.py).
        first = ready_standby(a)
        assert not next(e for e in a.events("standby_spawned") if e["pid"] == first)["forked"]
        assert may_leave_idle() and os.sched_getscheduler(first) == os.SCHED_IDLE
        assert group_nice(first) == expect_nice(IDLE_AUTOGROUP_NICE)
        assert next(e for e in a.events("standby_ready") if e["pid"] == first)["idle_priority"]
        # The zygote is started once the first standby is ready, so the two do not warm
        # on the same idle CPU.
        zygote = wait_for(lambda: a.events("standby_zygote_ready"), 120, "node-a's zygote")[0]
        ready = next(e for e in a.events("standby_ready") if e["pid"] == first)
        assert event_time(a.events("standby_zygote_spawned")[0]) >= event_time(ready)

        # A standby that dies while waiting is reaped and replaced, now forked warm by the
        # zygote, adopted by the daemon, in a session of its own.
        os.kill(first, signal.SIGKILL)
        wait_for(
            lambda: [e for e in a.events("standby_exited") if e["pid"] == first],
            30,
            "node-a to notice its first standby died",
        )
        spare = wait_for(
            lambda: [p for p in (a.status() or {}).get("standby_pids", []) if p != first],
            30,
            "a forked standby",
        )[0]
        assert next(e for e in a.events("standby_spawned") if e["pid"] == spare)["forked"]
        assert parent_of(spare) == a.pid and os.getsid(spare) == spare
        assert parent_of(zygote["pid"]) == a.pid
        assert ready_standby(a) == spare and os.sched_getscheduler(spare) == os.SCHED_IDLE

        # The daemon reaps a forked standby too, and sees its exit status; the next is forked.
        os.kill(spare, signal.SIGKILL)
        exited = wait_for(
            lambda: [e for e in a.events("standby_exited") if e["pid"] == spare],
            30,
            "node-a to notice its forked standby died",
        )
        assert exited[0]["code"] == -signal.SIGKILL
        replacement = wait_for(
            lambda: [
                p for p in (a.status() or {}).get("standby_pids", []) if p not in (first, spare)
            ],
            30,
            "a new standby",
        )[0]
        assert next(e for e in a.events("standby_spawned") if e["pid"] == replacement)["forked"]

        # The rank dies (the replacement may still be importing): the standby becomes the rank.
        healed_before = heals(a)
        victim = a.rank_pids()[0]
        os.kill(victim, signal.SIGKILL)
        restarted = restart_after(a, 1)
        assert restarted["reason"] == "rank_exit"
        assert restarted["standbys_used"] == 1 and restarted["pids"] == [replacement]
        wait_for(lambda: heals(a) > healed_before, 90, "node-a's new rank to heal")
        # As a rank it schedules like one started cold.
        assert os.sched_getscheduler(replacement) == os.SCHED_OTHER
        assert group_nice(replacement) == expect_nice(0)
        # As root the standbys warm at idle priority, so the one the start used is
        # replaced at once (trainer/spares/scheduling.py), not REFILL_DELAY_S later.
        refill = [e for e in a.events("standby_spawned") if event_time(e) > event_time(restarted)]
        assert refill and event_time(refill[0]) - event_time(restarted) < REFILL_DELAY_S

        # node.standby = false: node-b never spawns one and restarts its rank cold.
        healed_before = heals(b)
        os.kill(b.rank_pids()[0], signal.SIGKILL)
        cold = restart_after(b, 1)
        assert cold["standbys_used"] == 0
        wait_for(lambda: heals(b) > healed_before, 90, "node-b's new rank to heal")

        hurry(a, b)
        assert a.wait(240) == 0, a.proc.tail()
        assert b.wait(60) == 0, b.proc.tail()
    finally:
        a.stop()
        b.stop()
    assert not b.events("standby_spawned") and not b.events("standby_ready")
    done = [d.events("train_done")[0] for d in (a, b)]
    assert done[0]["step"] == done[1]["step"] == 300
    assert done[0]["params_sha256"] == done[1]["params_sha256"]  # the takeover healed exactly
    # The standby's process is the rank that trained after the kill.
    assert [e for e in a.events("rank_started") if e["pid"] == replacement]


def test_sigterm_takes_the_standbys_along(tmp_path: Path, etcd_endpoint: str) -> None:
    # 120 steps at 1 s a step outlast ready_standby's 90 s wait (at HOLD_PACE_S the job ended
    # in under 40 s, before a loaded machine had warmed node-a's idle-priority standby).
    steps, pace_s = ["train.steps=120", "node.standby=true"], 1.0
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=steps, pace_s=pace_s)
    b = start_daemon(tmp_path, "node-b", [etcd_endpoint], overrides=steps, pace_s=pace_s)
    try:
        wait_for(lambda: a.step() > 3 and b.step() > 3, 120, "both groups to train")
        spare = ready_standby(a)
        tree = [a.pid, *children(a.pid)]
        assert spare in tree and set(a.rank_pids()) <= set(tree)
        os.kill(a.pid, signal.SIGTERM)
        assert a.wait(60) == 0, a.proc.tail()
        assert not [p for p in tree if alive(p)], "a process of node-a outlived its drain"
        hurry(b)
        assert b.wait(240) == 0, b.proc.tail()
    finally:
        a.stop()
        b.stop()
    assert a.events("group_drained") and not a.events("group_restarted")
    assert not [e for e in a.events("rank_started") if e["pid"] == spare]  # it never trained
    assert b.events("train_done")[0]["step"] == 120


def test_a_standby_handed_its_start_while_it_warms_leaves_idle_priority_at_once(
    tmp_path: Path,
) -> None:
    """A start that comes while the standby warms at idle priority lifts it from the
    daemon's side: the standby's own thread may not run for a long time (it needs the
    interpreter lock, which loading libtorch holds). The standby is stopped (SIGSTOP)
    when the start comes, so only the daemon can lift it."""
    # The lighthouse is never reached: the rank is killed first.
    spec = one_rank_spec(tmp_path, EXAMPLE, "http://127.0.0.1:9")
    events: list[dict[str, object]] = []
    standby = Standby(0, spec, lambda rank, event: events.append(event), None)
    pid = standby.pid
    try:
        assert may_leave_idle()  # as root (CI): it warms at idle priority
        wait_for(
            lambda: (
                os.sched_getscheduler(pid) == os.SCHED_IDLE
                and group_nice(pid) == expect_nice(IDLE_AUTOGROUP_NICE)
            ),
            30,
            "the standby to lower itself",
        )
        os.kill(pid, signal.SIGSTOP)
        assert standby.assign(rank_env(spec, 0, free_port(), 1), 0, lambda r, e: None)
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        assert {os.sched_getscheduler(t) for t in tids} == {os.SCHED_OTHER}
        assert group_nice(pid) == expect_nice(0)
        assert not standby.ready.is_set()  # it was handed its start while it warmed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        standby.kill()


def test_a_killed_zygote_is_replaced_and_everything_dies_with_the_daemon(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """The zygote (trainer/spares/zygote.py) is a child of the daemon like its standbys: one
    that dies is replaced without touching the group or the standbys it forked, and a
    SIGKILL of the daemon takes the zygote, the forked standby and the rank along."""
    a = start_daemon(
        tmp_path, "node-a", [etcd_endpoint], overrides=["train.steps=100000", "node.standby=true"]
    )
    try:
        ready = wait_for(lambda: a.events("standby_zygote_ready"), 120, "node-a's zygote")
        zygote = ready[0]["pid"]
        first = ready_standby(a)  # spawned: the zygote starts once it is ready
        os.kill(first, signal.SIGKILL)
        spare = wait_for(
            lambda: [
                e["pid"] for e in a.events("standby_spawned") if e["forked"] and e["pid"] != first
            ],
            30,
            "a standby forked by the zygote",
        )[0]
        assert parent_of(zygote) == a.pid and a.rank_pids()
        os.kill(zygote, signal.SIGKILL)
        gone = wait_for(
            lambda: [e for e in a.events("standby_zygote_exited") if e["pid"] == zygote],
            30,
            "node-a to notice its zygote died",
        )
        assert gone[0]["code"] == -signal.SIGKILL and gone[0]["ready"]
        wait_for(
            lambda: [e for e in a.events("standby_zygote_ready") if e["pid"] != zygote],
            120,
            "a new zygote",
        )
        assert alive(spare) and not a.events("group_restarted")
        step = a.step()
        wait_for(lambda: a.step() > step, 60, "node-a to go on training")
        tree = children(a.pid)
        assert spare in tree and set(a.rank_pids()) <= set(tree)
        os.kill(a.pid, signal.SIGKILL)
        wait_for(lambda: not [p for p in tree if alive(p)], 30, "node-a's processes to die with it")
    finally:
        a.stop()


def test_a_zygote_started_by_hand_without_its_socket_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "--zygote", "--config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --zygote needs --control-fd (the daemon's socket); it is not started by hand"
    ]
