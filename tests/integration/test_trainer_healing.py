"""Live healing across replica groups with the real torchft lighthouse and real SIGKILLs.

Each replica group is its own set of rank processes (as the daemon starts them).
Group 1 is killed at chosen moments of a step (PHALANX_CHAOS makes its ranks
SIGKILL themselves exactly there); group 0 must keep committing alone, never
crash, and heal each relaunched group 1. At the end both groups' parameters are
bitwise identical.
"""

from __future__ import annotations

import functools
import signal
from pathlib import Path

import pytest

from tests.support.harness import PACE_S, ROOT, Event, wait_for, write_pace
from tests.support.rank_groups import Group, cleanup, launch_group, start_lighthouse
from trainer.exits import EXIT_FAILED, EXIT_NO_QUORUM

pytestmark = pytest.mark.integration

CONFIG = ROOT / "examples" / "single.toml"
KILLED = -signal.SIGKILL


def _solo_steps_after(group: Group, step: int) -> list[int]:
    return [
        int(e["step"])
        for e in group.events("train_step")
        if e["participants"] == 1 and int(e["step"]) > step
    ]


def _last_step(group: Group) -> int:
    steps = group.committed_steps()
    return steps[-1] if steps else 0


def _kill_relaunch_heal(
    tmp_path: Path, nproc: int, overrides: list[str], moments: list[str], steps: int
) -> None:
    lighthouse = start_lighthouse(tmp_path)
    common = dict(num_groups=2, nproc=nproc, lighthouse=lighthouse.address, overrides=overrides)
    pace = write_pace(tmp_path / "pace", PACE_S)  # 0 once the last group has healed
    delay = {"PHALANX_CHAOS_DELAY": f"@{pace}"}
    survivor = launch_group(CONFIG, tmp_path, group=0, env=delay, **common)  # type: ignore[arg-type]
    launched: list[Group] = []
    with cleanup(lighthouse, survivor):
        for round_, moment in enumerate(moments):
            victim = launch_group(
                CONFIG,
                tmp_path,
                group=1,
                name=f"g1-{moment}",
                env={**delay, "PHALANX_CHAOS": f"{moment}@+4"},
                **common,  # type: ignore[arg-type]
            )
            launched.append(victim)
            # The victim dies by SIGKILL at the chosen moment of its fifth step...
            codes = victim.wait(120)
            # Each rank SIGKILLs itself at that moment, unless its group-mate got there
            # first: then it fails on the broken group instead (exit 1, `rank_failed`;
            # seen: rank 1's should_commit RPC to rank 0's manager, which had just died;
            # 75 if the broken call was its quorum's and it timed out).
            assert KILLED in codes, f"round {round_}: victim exit codes {codes}"
            for rank, code in zip(victim.ranks, codes, strict=True):
                failed = code in (EXIT_FAILED, EXIT_NO_QUORUM) and rank.events("rank_failed")
                assert code == KILLED or failed, (
                    f"round {round_}: victim exit codes {codes}\n{rank.tail()}"
                )
            if round_ > 0:  # ...after it had healed from the survivor.
                assert victim.events("heal_done"), victim.rank0.tail()
            # ...and the survivor keeps committing steps with one participant.
            killed_at = _last_step(survivor)
            wait_for(
                functools.partial(_solo_steps_after, survivor, killed_at),
                60,
                f"group 0 to commit alone after the {moment} kill",
            )
            assert survivor.rank0.popen.poll() is None, survivor.rank0.tail()

        final = launch_group(CONFIG, tmp_path, group=1, name="g1-final", env=delay, **common)  # type: ignore[arg-type]
        launched.append(final)
        with cleanup(final):
            wait_for(lambda: final.events("heal_done"), 120, "the relaunched group to heal")
            write_pace(pace, 0.0)
            assert final.wait(180) == [0] * nproc, final.rank0.tail()
            assert survivor.wait(60) == [0] * nproc, survivor.rank0.tail()

    heal = final.events("heal_done")
    assert heal and heal[0]["step"] > 0, "the relaunched group did not heal from its peer"
    # A heal lands after the group's forward (torchft's async quorum), so that step's loss
    # was computed on stale parameters and is not reported: a group omits its loss exactly
    # on the steps in which it healed.
    assert final.events("train_step")[0]["loss"] is None
    for group in (survivor, final):
        assert_loss_omitted_exactly_where_healed(group.events())
    done0, done1 = survivor.events("train_done")[0], final.events("train_done")[0]
    assert done0["step"] == done1["step"] == steps
    assert len(done0["params_sha256"]) == 64
    assert done0["params_sha256"] == done1["params_sha256"]
    # The survivor's step count never went backwards: nothing committed was lost.
    committed = survivor.committed_steps()
    assert committed == sorted(committed) and committed[-1] == steps
    if nproc == 1:
        # Nor did the kills change a bit: two one-rank groups compute every share of a
        # step in micro-batches of their own, whichever group computes it, so the update
        # is the same bits as one group's alone (trainer/data/shares.py, fixed_cuts).
        alone = _lone_digest(tmp_path, overrides)
        assert done0["params_sha256"] == alone, (done0["params_sha256"], alone)
    if nproc == 1 and "gradients" in moments and "optimizer" in moments:
        # A one-rank survivor keeps the half it computed (trainer/loop.py, _reuse): after
        # the gradients kill its exchange failed (the peer died before it sent); after the
        # optimizer kill its peer was gone before the next step's quorum, which it had
        # guessed would hold both. (After the all-reduce kill either may come: the peer's
        # half can arrive before its SIGKILL, and the step commits with both; seen in CI.)
        why = {e["why"] for e in survivor.events("gradients_reused")}
        assert {"exchange_failed", "quorum_shrank"} <= why, why


def _lone_digest(tmp_path: Path, overrides: list[str]) -> str:
    """The digest one group of a two-group job ends on when it trains every step alone."""
    logs = tmp_path / "alone"
    logs.mkdir()
    lighthouse = start_lighthouse(logs)
    group = launch_group(
        CONFIG, logs, num_groups=2, lighthouse=lighthouse.address, overrides=overrides
    )
    with cleanup(lighthouse, group):
        assert group.wait(180) == [0], group.rank0.tail()
    assert {e["participants"] for e in group.events("train_step")} == {1}
    return str(group.events("train_done")[0]["params_sha256"])


def test_sharded_groups_survive_kills_and_heal(tmp_path: Path) -> None:
    """Groups of 2 ranks (FSDP2, cross-group all-reduce in FSDP's all-reduce hook)."""
    steps = 220
    _kill_relaunch_heal(
        tmp_path,
        nproc=2,
        overrides=["parallel.dp_shard=2", f"train.steps={steps}"],
        moments=["allreduce", "optimizer"],
        steps=steps,
    )


def test_unsharded_groups_survive_kills_at_every_moment(tmp_path: Path) -> None:
    """Groups of 1 rank (the bucketed all-reduce after backward)."""
    steps = 420  # each kill, restart and heal took about 75 of the survivor's steps
    _kill_relaunch_heal(
        tmp_path,
        nproc=1,
        overrides=[f"train.steps={steps}"],
        moments=["forward", "gradients", "allreduce", "optimizer"],
        steps=steps,
    )


def test_killing_one_rank_fails_its_group_and_the_other_goes_on(tmp_path: Path) -> None:
    """SIGKILL one rank of a 2-rank group: its peer exits non-zero (it never hangs or exits 0),
    and the other group goes on alone.

    How soon the peer exits depends on where the kill lands: inside a gloo collective
    it fails at once; waiting in torchft's should_commit or quorum it fails when that
    call's configured timeout expires. So the bound is those timeouts (plus time to
    exit on a loaded machine), not a race. With a daemon, the group is stopped within a
    tick of the rank's exit anyway.

    Until the victim's peer exits, its manager keeps the group's lighthouse heartbeat
    alive, so the survivor's quorum waits for it: the survivor's quorum timeout must
    outlast the victim's timeouts (with equal ones the survivor's quorum call, started
    in the same step, timed out first in about 1 run in 5 and failed the survivor)."""
    timeout_s = 20
    lighthouse = start_lighthouse(tmp_path)

    def group(index: int, quorum_timeout_s: int) -> Group:
        return launch_group(
            CONFIG,
            tmp_path,
            group=index,
            num_groups=2,
            nproc=2,
            lighthouse=lighthouse.address,
            overrides=[
                "parallel.dp_shard=2",
                "train.steps=100000",
                f"ft.timeout_s={timeout_s}",
                f"ft.quorum_timeout_s={quorum_timeout_s}",
            ],
            env={"PHALANX_CHAOS_DELAY": "0.02"},
        )

    survivor = group(0, 3 * timeout_s)
    victim = group(1, timeout_s)
    with cleanup(lighthouse, survivor, victim):
        wait_for(
            lambda: any(e["participants"] == 2 for e in victim.events("train_step")),
            90,
            "both groups to step together",
        )
        victim.ranks[1].popen.send_signal(signal.SIGKILL)
        code = victim.ranks[0].wait(timeout_s + 30)
        assert code not in (0, None)
        assert victim.ranks[0].events("rank_failed"), victim.ranks[0].tail()
        killed_at = _last_step(survivor)
        wait_for(lambda: _solo_steps_after(survivor, killed_at), 60, "group 0 to go on alone")
        assert survivor.rank0.popen.poll() is None


def assert_loss_omitted_exactly_where_healed(events: list[Event]) -> None:
    """A committed step reports its loss unless the group healed in it: the attempt after a
    heal_done is a train_step without a loss, or a step_skipped (not committed: seen when a
    late-starting group healed from a peer that died in that same step); a train_step
    without a loss comes only right after a heal_done. A step_skipped without a heal (a
    peer died in it) reports nothing either way."""
    healed = False
    for e in events:
        if e["event"] == "heal_done":
            healed = True
        elif e["event"] in ("train_step", "step_skipped"):
            reported = e["event"] == "train_step" and e["loss"] is not None
            if healed:
                assert not reported, ("a loss reported in the step that healed", e)
            elif e["event"] == "train_step":
                assert reported, ("a committed step without a loss and without a heal", e)
            healed = False
