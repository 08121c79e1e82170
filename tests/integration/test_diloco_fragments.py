"""Issue 55, streaming DiLoCo (``ft.num_fragments``) with real rank processes and the real
torchft lighthouse, one rank per group: ``ft.sync_steps`` 5 in five fragments, so a sync
every step moves a fifth of the parameters (the built-in model's tensors, cut in model
order) and each fragment syncs every five steps.

A group lost costs the others nothing, its share of the step it died in is said lost,
and what it trained in the steps before, which some fragments never received, is said
too, once per fragment (``items_partly_lost``); a failed sync goes back to where its step
began; a cold restart resumes the trajectory (the checkpoint holds the synced parameters
beside the live ones); and the job's last sync, of every fragment, leaves the groups
bitwise alike.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.diloco_runs import (
    EVERY,
    Victim,
    coverage,
    diloco,
    resumed_against_whole,
    trained,
)
from tests.support.harness import wait_for
from tests.support.rank_groups import Group, cleanup

pytestmark = pytest.mark.integration

FRAGMENTS = (f"ft.num_fragments={EVERY}",)  # a sync every step


def committed_steps(group: Group) -> list[int]:
    return [int(e["step"]) for e in group.events() if e["event"] in ("train_step", "step_items")]


def test_a_group_killed_mid_run_is_told_lost_per_fragment_and_the_groups_end_alike(
    tmp_path: Path,
) -> None:
    """Group 1 SIGKILLs itself in its twelfth step; group 0 syncs alone, says the share
    of the step group 1 died in lost, and group 1's shares of the four steps before it
    partly lost: the share of the step right before for the four fragments that synced
    after it, the one before that for three, and so on. Group 1, launched again, heals."""
    steps = 400  # paced: group 0 still trains when group 1 is launched again
    run = Victim.start(tmp_path, steps, "forward@+12", extra=FRAGMENTS)
    survivor, victim = run.survivor, run.victim
    with cleanup(run.lighthouse, survivor, victim):
        assert victim.wait(120) != [0], victim.rank0.tail()
        wait_for(lambda: survivor.events("items_partly_lost"), 60, "group 0 to tell the loss")
        final = run.relaunch()
    done0, done1 = survivor.events("train_done")[0], final.events("train_done")[0]
    assert done0["step"] == done1["step"] == steps
    assert done0["params_sha256"] == done1["params_sha256"]
    assert committed_steps(survivor) == list(range(1, steps + 1))
    assert coverage([survivor, victim, final], steps) == ([], [])
    assert survivor.events("items_lost"), "nobody said the killed group's last share lost"
    # Partly lost: the killed group's last EVERY - 1 committed shares, the newest told
    # for EVERY - 1 different fragments, each older one for one fragment fewer.
    told: dict[range, list[int]] = defaultdict(list)
    for e in survivor.events("items_partly_lost"):
        told[range(*e["items"])].append(int(e["fragment"]))
    shares = trained(victim.events())[-(EVERY - 1) :]
    assert sorted(told, key=lambda r: r.start) == shares, (told, shares)
    for age, share in enumerate(reversed(shares)):
        fragments = told[share]
        assert len(fragments) == len(set(fragments)) == EVERY - 1 - age, (share, fragments)
    assert not final.events("items_partly_lost") and not victim.events("items_partly_lost")


def test_a_failed_fragment_sync_is_not_applied_and_its_step_is_trained_again(
    tmp_path: Path,
) -> None:
    """Group 1 dies in a sync after its quorum, before sending: group 0's sync fails, goes
    back to where that step began, and the step is trained again with the same items."""
    steps = 300
    run = Victim.start(tmp_path, steps, "gradients@+14", min_replicas=2, extra=FRAGMENTS)
    survivor, victim = run.survivor, run.victim
    with cleanup(run.lighthouse, survivor, victim):
        assert victim.wait(120) != [0], victim.rank0.tail()
        wait_for(lambda: survivor.events("step_skipped"), 60, "the failed sync")
        final = run.relaunch()
    assert committed_steps(survivor) == list(range(1, steps + 1))
    assert coverage([survivor, victim, final], steps) == ([], [])
    assert not survivor.events("items_lost")
    done0, done1 = survivor.events("train_done")[0], final.events("train_done")[0]
    assert done0["params_sha256"] == done1["params_sha256"]


def test_a_cold_restart_resumes_the_trajectory_with_the_synced_parameters(
    tmp_path: Path,
) -> None:
    """One group, checkpoints every seven steps, where most fragments' synced parameters
    are not the live ones: killed in step 23 and started again, it reaches the same
    losses, step by step, and the same final digest as a run never stopped."""
    overrides = [*diloco(35), *FRAGMENTS, "checkpoint.interval_steps=7"]
    loaded, after, whole, same_digest = resumed_against_whole(tmp_path, overrides, "forward@+23")
    assert loaded in (14, 21), loaded
    assert after and after == whole
    assert same_digest
