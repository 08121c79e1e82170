"""DiLoCo runs of real rank groups on the real lighthouse, for tests/integration/
test_diloco*.py: the job's overrides, what each group trained, and a group that dies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tests.support.harness import PACE_S, ROOT, Event, wait_for, write_pace
from tests.support.rank_groups import Group, Lighthouse, cleanup, launch_group, start_lighthouse

CONFIG = ROOT / "examples" / "single.toml"
EVERY, BATCH = 5, 8  # ft.sync_steps, and examples/single.toml's global batch


def diloco(steps: int) -> list[str]:
    return ['ft.semi_sync_method="diloco"', f"ft.sync_steps={EVERY}", f"train.steps={steps}"]


def trained(events: list[Event]) -> list[range]:
    """The items of each round a group committed (train_step, or step_items between logs)."""
    return [
        range(*e["items"])
        for e in events
        if e["event"] in ("train_step", "step_items") and e["items"][1] > e["items"][0]
    ]


def schedule_differs(groups: list[Group]) -> dict[int, set[float]]:
    """Steps whose learning rate differed between groups (the schedule is the job's, by
    step, whether a group healed, joined without healing, or not)."""
    lrs: dict[int, set[float]] = {}
    for g in groups:
        for e in g.events("train_step"):
            lrs.setdefault(int(e["step"]), set()).add(float(e["lr"]))
    return {step: lr for step, lr in lrs.items() if len(lr) > 1}


class Logged(Protocol):
    """A rank group, or a daemon (whose log holds its ranks' events)."""

    def events(self, name: str | None = None) -> list[Event]: ...


def coverage(groups: Sequence[Logged], steps: int) -> tuple[list[int], list[int]]:
    """(items trained more than once or never and not said lost, items said lost twice)."""
    count = [0] * (steps * BATCH)
    for g in groups:
        for items in trained(g.events()):
            for i in items:
                count[i] += 1
    lost = [0] * len(count)
    for g in groups:
        for e in g.events("items_lost"):
            for i in range(*e["items"]):
                lost[i] += 1
    wrong = [i for i, n in enumerate(count) if n + lost[i] != 1]
    return wrong, [i for i, n in enumerate(lost) if n > 1]


@dataclass
class Victim:
    """Group 0 paced, group 1 with a fault injected (PHALANX_CHAOS), on one lighthouse:
    `relaunch` starts group 1 again (no fault) and lets both finish at full pace."""

    tmp_path: Path
    steps: int
    lighthouse: Lighthouse
    pace: Path
    extra: tuple[str, ...] = ()  # overrides after diloco(steps)'s
    survivor: Group = field(init=False)
    victim: Group = field(init=False)

    @classmethod
    def start(
        cls,
        tmp_path: Path,
        steps: int,
        chaos: str,
        min_replicas: int = 1,
        extra: tuple[str, ...] = (),
    ) -> Victim:
        lighthouse = start_lighthouse(tmp_path, min_replicas=min_replicas)
        run = cls(tmp_path, steps, lighthouse, write_pace(tmp_path / "pace", PACE_S), extra)
        run.survivor = run.launch(0, "g0")
        if min_replicas == 1:  # group 0 trains from the first round; group 1 joins it
            wait_for(lambda: run.survivor.events("train_step"), 120, "group 0's first round")
        run.victim = run.launch(1, "g1-killed", {"PHALANX_CHAOS": chaos})
        return run

    def launch(self, group: int, name: str, env: dict[str, str] | None = None) -> Group:
        return launch_group(
            CONFIG, self.tmp_path, group=group, name=name, num_groups=2,
            lighthouse=self.lighthouse.address,
            overrides=[*diloco(self.steps), *self.extra],
            env={"PHALANX_CHAOS_DELAY": f"@{self.pace}", **(env or {})},
        )  # fmt: skip

    def relaunch(self) -> Group:
        final = self.launch(1, "g1-final")
        with cleanup(final):
            wait_for(lambda: final.events("heal_done"), 120, "the relaunched group to heal")
            write_pace(self.pace, 0.0)
            assert final.wait(180) == [0], final.rank0.tail()
            assert self.survivor.wait(60) == [0], self.survivor.rank0.tail()
        return final


def losses(events: list[Event]) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in events if e["event"] == "train_step"}


def resumed_against_whole(
    tmp_path: Path, overrides: list[str], kill: str
) -> tuple[int, dict[int, float], dict[int, float], bool]:
    """One group run whole, and once killed (PHALANX_CHAOS `kill`) and started again
    from its checkpoint: (the step it loaded, the losses after it of the restarted run
    and of the whole one at the same steps, whether their final digests agree)."""

    def run(name: str, env: dict[str, str] | None = None) -> Group:
        ckpt = tmp_path / ("ckpt-" + name.split("-")[0])
        argv = [*overrides, f'checkpoint.dir="{ckpt}"']
        return launch_group(CONFIG, tmp_path, name=name, overrides=argv, env=env)

    whole = run("whole")
    assert whole.wait(180) == [0], whole.rank0.tail()
    killed = run("cut-first", {"PHALANX_CHAOS": kill})
    assert killed.wait(180) != [0], killed.rank0.tail()
    again = run("cut-again")
    assert again.wait(180) == [0], again.rank0.tail()
    (loaded,) = again.events("checkpoint_loaded")
    step = int(loaded["step"])
    after = {s: v for s, v in losses(again.events()).items() if s > step}
    before = losses(whole.events())
    digests = {g.events("train_done")[0]["params_sha256"] for g in (whole, again)}
    return step, after, {s: before[s] for s in after if s in before}, len(digests) == 1
