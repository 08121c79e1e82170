"""Issue 55: the semi-synchronous mode (``ft.semi_sync_method = "diloco"``) with real rank
processes and the real torchft lighthouse, one rank per group.

Rounds of ``ft.sync_steps`` inner steps, each group on its own share, then a sync. The
groups end bitwise alike, and every item of the job is trained by exactly one group, or,
for a group lost during a round, said lost (``items_lost``) by one group of the round: never
twice, never silently.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.diloco_runs import (
    BATCH,
    CONFIG,
    EVERY,
    Victim,
    coverage,
    diloco,
    resumed_against_whole,
    schedule_differs,
    trained,
)
from tests.support.etcd_control import ControlledEtcd
from tests.support.harness import (
    HOLD_PACE_S,
    PACE_S,
    hurry,
    slow,
    start_daemon,
    wait_for,
    write_pace,
)
from tests.support.job_queries import digest, status_json
from tests.support.pair_runs import heal_divergence_to_end, resumed_to_end, run_to_end
from tests.support.rank_groups import cleanup, launch_group, start_lighthouse

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("groups,bf16", [(2, False), (3, False), (2, True)])
def test_groups_train_their_own_shares_and_end_bitwise_alike(
    tmp_path: Path, groups: int, bf16: bool
) -> None:
    """Two and three groups; and two sending their pseudo-gradients as bfloat16."""
    steps = 40
    lighthouse = start_lighthouse(tmp_path, min_replicas=groups)
    overrides = [*diloco(steps), f"ft.sync_bf16={'true' if bf16 else 'false'}"]
    common = dict(num_groups=groups, lighthouse=lighthouse.address, overrides=overrides)
    launched = [launch_group(CONFIG, tmp_path, group=g, **common) for g in range(groups)]  # type: ignore[arg-type]
    with cleanup(lighthouse, *launched):
        for g in launched:
            assert g.wait(180) == [0], g.rank0.tail()
    done = [g.events("train_done")[0] for g in launched]
    assert {d["step"] for d in done} == {steps}
    assert len({d["params_sha256"] for d in done}) == 1, done
    # A round at a time, every group in every round, no item twice or lost.
    for g in launched:
        committed = [
            int(e["step"]) for e in g.events() if e["event"] in ("train_step", "step_items")
        ]
        assert committed == list(range(EVERY, steps + 1, EVERY)), committed
        share = EVERY * BATCH // groups
        assert all(len(r) in (share, share + 1) for r in trained(g.events())), trained(g.events())
    assert coverage(launched, steps) == ([], [])
    assert not any(g.events("items_lost") for g in launched)
    assert schedule_differs(launched) == {}


def test_a_group_killed_mid_round_costs_the_other_nothing_and_heals_at_a_sync(
    tmp_path: Path,
) -> None:
    """Group 1, joined at group 0's first sync, SIGKILLs itself in the third inner step of
    its third round; group 0 goes on and syncs alone; group 1, launched again, heals at a
    sync and trains the rounds after. The pseudo-gradients cross as int8, so a healing
    group also takes part in the exchange of the rows' maxima."""
    steps = 200
    int8 = ("ft.should_quantize=true",)
    run = Victim.start(tmp_path, steps, f"forward@+{2 * EVERY + 2}", extra=int8)
    survivor, victim = run.survivor, run.victim
    with cleanup(run.lighthouse, survivor, victim):
        assert victim.wait(120) != [0], victim.rank0.tail()
        killed_at = max([0, *(int(e["step"]) for e in survivor.events("train_step"))])
        wait_for(
            lambda: [e for e in survivor.events("train_step")
                     if e["participants"] == 1 and int(e["step"]) > killed_at],
            60, "group 0 to sync alone after the kill",
        )  # fmt: skip
        final = run.relaunch()
    done0, done1 = survivor.events("train_done")[0], final.events("train_done")[0]
    assert done0["step"] == done1["step"] == steps
    assert done0["params_sha256"] == done1["params_sha256"]
    # The killed group's share of the round it died in was trained by nobody, and said so.
    lost = survivor.events("items_lost")
    assert lost, "nobody accounted for the killed group's share"
    assert coverage([survivor, victim, final], steps) == ([], [])
    assert schedule_differs([survivor, victim, final]) == {}
    # The survivor never went back: its committed steps only grow, a round at a time.
    committed = [
        int(e["step"]) for e in survivor.events() if e["event"] in ("train_step", "step_items")
    ]
    assert committed == list(range(EVERY, steps + 1, EVERY)), committed


def test_a_cold_restart_resumes_the_trajectory_of_a_run_without_one(tmp_path: Path) -> None:
    """One group, checkpoints every two rounds: killed in its fifth round and started
    again, it loads its last checkpoint (parameters, outer momentum, inner optimizer, LR
    schedule) and reaches the same losses, round by round, as a run never stopped."""
    overrides = [*diloco(40), f"checkpoint.interval_steps={2 * EVERY}"]
    loaded, after, whole, same_digest = resumed_against_whole(
        tmp_path, overrides, f"forward@+{4 * EVERY + 2}"
    )
    assert loaded in (2 * EVERY, 4 * EVERY), loaded
    assert after and after == whole
    assert same_digest


def test_a_failed_sync_is_not_applied_and_its_round_is_trained_again(tmp_path: Path) -> None:
    """Group 1 dies in its third round's sync, after the quorum, before sending: group 0's
    exchange fails, the sync is not committed (step_skipped), and the round is trained
    again, by group 0 alone or with group 1 launched anew, with the same items."""
    steps = 100
    run = Victim.start(tmp_path, steps, f"gradients@+{3 * EVERY - 1}", min_replicas=2)
    survivor, victim = run.survivor, run.victim
    with cleanup(run.lighthouse, survivor, victim):
        assert victim.wait(120) != [0], victim.rank0.tail()
        skipped = wait_for(lambda: survivor.events("step_skipped"), 60, "the failed sync")
        assert int(skipped[0]["step"]) == 2 * EVERY, skipped
        final = run.relaunch()
    assert [int(e["step"]) for e in victim.events("train_step")] == [EVERY, 2 * EVERY]
    # The round after the failed sync was committed once, by whoever trained it again.
    committed = [
        int(e["step"]) for e in survivor.events() if e["event"] in ("train_step", "step_items")
    ]
    assert committed == list(range(EVERY, steps + 1, EVERY)), committed
    assert coverage([survivor, victim, final], steps) == ([], [])
    assert not survivor.events("items_lost")
    done0, done1 = survivor.events("train_done")[0], final.events("train_done")[0]
    assert done0["params_sha256"] == done1["params_sha256"]


def test_a_group_joining_mid_job_takes_a_share_from_the_next_round(tmp_path: Path) -> None:
    # The third group must join before the job ends. Paced, a round (0.4-0.5 s) stays
    # under the lighthouse's join timeout (1 s), so no quorum forms without a group that
    # is on its way; 400 steps leave the third group about 40 s to start (a cold start
    # beside another test took over 10 s, longer than 100 steps left it). Once it has
    # committed, the rest runs unpaced.
    steps = 400
    lighthouse = start_lighthouse(tmp_path, min_replicas=2)
    common = dict(num_groups=3, lighthouse=lighthouse.address, overrides=diloco(steps))
    pace = write_pace(tmp_path / "pace", PACE_S)
    delay = {"PHALANX_CHAOS_DELAY": f"@{pace}"}
    first = [launch_group(CONFIG, tmp_path, group=g, env=delay, **common) for g in (0, 1)]  # type: ignore[arg-type]
    with cleanup(lighthouse, *first):
        wait_for(lambda: first[0].events("train_step"), 120, "two groups to commit a round")
        late = launch_group(CONFIG, tmp_path, group=2, env=delay, **common)  # type: ignore[arg-type]
        with cleanup(late):
            wait_for(lambda: late.events("train_step"), 120, "the third group to commit a round")
            write_pace(pace, 0.0)
            for g in (*first, late):
                assert g.wait(180) == [0], g.rank0.tail()
    everyone = [*first, late]
    assert len({g.events("train_done")[0]["params_sha256"] for g in everyone}) == 1
    assert min(int(e["step"]) for e in late.events("train_step")) > EVERY
    assert {e["participants"] for e in late.events("train_step")} == {3}
    assert coverage(everyone, steps) == ([], [])
    assert schedule_differs(everyone) == {}


def test_under_daemons_a_killed_rank_is_restarted_and_heals_at_a_sync(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """Two `phalanx run` daemons on a diloco job: node-b's rank SIGKILLed mid-run is
    restarted by its daemon and heals at a sync; node-a's ranks are never restarted;
    `phalanx status` says the mode; the digests agree at the end."""
    steps = 200
    job = [*diloco(steps), "train.eval_every=0"]
    a, b = (start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("node-a", "node-b"))
    try:
        wait_for(lambda: a.step() > EVERY and b.step() > EVERY, 120, "both groups to sync")
        shown = wait_for(
            lambda: status_json(etcd_endpoint).get("exchange", {}).get("semi_sync_method") == "diloco",
            30, "phalanx status to say the mode",
        )  # fmt: skip
        assert shown
        slow(a, b)
        victim = b.rank_pids()[0]
        os.kill(victim, signal.SIGKILL)
        restarted = wait_for(lambda: b.events("group_restarted"), 60, "node-b's group to restart")
        wait_for(lambda: b.events("heal_done"), 90, "node-b to heal at a sync")
        hurry(a, b)
    except BaseException:
        for d in (a, b):
            d.stop()
        raise
    run_to_end([a, b])
    assert restarted[0]["reason"] == "rank_exit"
    assert not a.events("group_restarted")
    assert digest(a) == digest(b)
    # node-a committed a round at a time to the end, never back (from whichever round
    # its group joined in: the node whose ranks started first trains the first alone).
    steps_a = [int(e["step"]) for e in a.events("train_step")]
    assert steps_a and steps_a == list(range(steps_a[0], steps + 1, EVERY)), steps_a


def test_under_daemons_the_leaders_loss_leaves_the_other_training_its_rounds(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """Two `phalanx run` daemons on a diloco job; the leader's daemon is SIGKILLed (its
    ranks and lighthouse die with it): the other node starts a lighthouse, and its ranks,
    never restarted, sync alone on it, a round at a time, to the end. Every item is
    trained once or said lost."""
    steps = 200
    job = [*diloco(steps), "train.eval_every=0"]
    a, b = (start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("node-a", "node-b"))
    try:
        wait_for(lambda: a.step() > EVERY and b.step() > EVERY, 120, "both groups to sync")
        leader, other = (a, b) if a.require_status()["leader"] else (b, a)
        pids = other.rank_pids()
        os.kill(leader.pid, signal.SIGKILL)
        wait_for(lambda: other.events("lighthouse_started"), 30, "the other node to lead")
        at = other.step()
        wait_for(lambda: other.step() >= at + 2 * EVERY, 90, "rounds on the new lighthouse")
        hurry(other)
        assert other.wait(180) == 0, other.proc.tail()
    finally:
        a.stop()
        b.stop()
    assert not other.events("group_restarted")
    assert [e["pids"] for e in other.events("group_started")] == [pids]
    rounds = [int(e["step"]) for e in other.events("train_step")]
    assert rounds == sorted(set(rounds)) and rounds[-1] == steps
    assert all(r % EVERY == 0 for r in rounds), rounds
    assert coverage([a, b], steps) == ([], [])


def test_under_daemons_an_etcd_outage_fences_a_diloco_job_and_restarts_nothing(
    tmp_path: Path, etcd: ControlledEtcd
) -> None:
    """Two daemons on a diloco job lose etcd for 10 s: their ranks may be paused (fenced,
    SIGSTOP) wherever they are in a round, never restarted; once etcd is back the rounds
    go on and the groups end alike."""
    steps = 100
    job = [*diloco(steps), "train.eval_every=0"]
    a, b = (
        start_daemon(tmp_path, n, [etcd.endpoint], overrides=job, pace_s=HOLD_PACE_S)
        for n in ("node-a", "node-b")
    )
    try:
        wait_for(lambda: a.step() > EVERY and b.step() > EVERY, 120, "both groups to sync")
        etcd.stop()
        time.sleep(10)
        etcd.restart()
        resumed_to_end([a, b])
    finally:
        a.stop()
        b.stop()
    for d in (a, b):
        assert d.events("fenced"), d.node_id
        assert not d.events("group_restarted") and not d.events("group_failed"), d.node_id
        assert len(d.events("group_started")) == 1, d.node_id
    assert digest(a) == digest(b)
    assert coverage([a, b], steps) == ([], [])


def test_a_group_that_drifts_is_found_right_after_a_sync_and_heals(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """Three daemons on a diloco job comparing digests after every sync: node-c's ranks
    add 1e-3 to a parameter right after the sync at step 25; the comparison there finds
    it, node-c (a minority of one) restarts and heals at a later sync, and the job ends
    with every group alike."""
    job = [
        *diloco(150),
        "job.max_replicas=3",
        "job.min_replicas=2",
        f"ft.digest_every={EVERY}",
        "train.eval_every=0",
    ]
    daemons = [
        start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("node-a", "node-b")
    ]
    perturb = {"PHALANX_CHAOS": f"optimizer@{5 * EVERY - 1}:perturb"}
    daemons.append(start_daemon(tmp_path, "node-c", [etcd_endpoint], overrides=job, env=perturb))
    a, b, c = daemons
    heal_divergence_to_end(daemons, c)
    found = c.events("replicas_diverged")
    assert len(found) == 1 and found[0]["group"].startswith("minority"), found
    assert int(found[0]["step"]) == 5 * EVERY  # the sync right after the perturbation
    for d in (a, b):
        assert [e["group"] for e in d.events("replicas_diverged")] == ["majority"]
        assert not d.events("group_restarted")
    assert len({digest(d) for d in daemons}) == 1
