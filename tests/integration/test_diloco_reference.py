"""Issue 55: DiLoCo through real rank processes and the real torchft lighthouse, two and
three groups of one rank, against a reference worked out by hand in plain floats.

The workload is tests/support/two_weight_workload.py (y = w . x, two weights, mean
squared error). Two rounds of two inner steps; each group trains its share of a round
with the job's AdamW and LR schedule; at each sync the groups' pseudo-gradients (the
weights at the round's start less their own) are averaged and one Nesterov SGD step
moves the synced weights. The reference follows the same arithmetic with nothing
from the trainer: the round losses each group's log reports, the weights and the
outer momentum in the checkpoint of the last step must be the reference's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.support.harness import ROOT
from tests.support.rank_groups import cleanup, launch_group, start_lighthouse
from tests.support.two_weight_workload import BIAS, START, item

pytestmark = pytest.mark.integration

CONFIG = ROOT / "examples" / "single.toml"
H, ROUNDS, BATCH = 2, 2, 6  # inner steps per round, rounds, items per step (whole job)
LR, MIN_LR, DECAY, BETAS, EPS = 0.05, 0.01, 0.1, (0.9, 0.95), 1e-8  # the job's AdamW
OUTER_LR, MOMENTUM = 0.7, 0.9

JOB = [
    'workload.spec="tests.support.two_weight_workload:spec"',
    'ft.semi_sync_method="diloco"',
    f"ft.sync_steps={H}",
    f"ft.outer_lr={OUTER_LR}",
    f"ft.outer_momentum={MOMENTUM}",
    f"train.steps={H * ROUNDS}",
    f"train.batch_size={BATCH}",
    f"train.lr={LR}",
    f"train.min_lr={MIN_LR}",
    "train.warmup_steps=0",
    f"train.weight_decay={DECAY}",
    f"train.beta1={BETAS[0]}",
    f"train.beta2={BETAS[1]}",
    f"train.eps={EPS}",
    "train.max_grad_norm=0",
    "train.eval_every=0",
]


def lr_at(step: int) -> float:
    """No warmup; cosine from LR to MIN_LR over the job's steps."""
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * step / (H * ROUNDS)))


@dataclass
class Inner:
    """One group's weights and AdamW moments (they stay with the group across syncs)."""

    w: list[float]
    m: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    t: int = 0

    def step(self, items: range, lr: float) -> float:
        """One AdamW step on the mean squared error over `items`; their loss sum before it.
        A third weight is the bias (its input is 1)."""
        n = len(self.w)
        self.m, self.v = self.m or [0.0] * n, self.v or [0.0] * n
        xs = {i: [*item(i)[0], 1.0][:n] for i in items}
        errors = {i: sum(w * x for w, x in zip(self.w, xs[i], strict=True)) - item(i)[1]
                  for i in items}  # fmt: skip
        grad = [sum(2 * e * xs[i][k] for i, e in errors.items()) / len(items) for k in range(n)]
        self.t += 1
        b1, b2 = BETAS
        for k in range(n):
            self.w[k] *= 1 - lr * DECAY
            self.m[k] = b1 * self.m[k] + (1 - b1) * grad[k]
            self.v[k] = b2 * self.v[k] + (1 - b2) * grad[k] ** 2
            denom = math.sqrt(self.v[k]) / math.sqrt(1 - b2**self.t) + EPS
            self.w[k] -= lr / (1 - b1**self.t) * self.m[k] / denom
        return sum(e * e for e in errors.values())


@dataclass(frozen=True)
class Synced:
    """The reference after one sync."""

    loss: float  # the mean loss over the items trained since the last sync
    synced: list[float]  # the weights every group agrees on
    momentum: list[float]
    live: list[list[float]]  # each group's own


def reference(
    groups: int,
    outer_lr: float = OUTER_LR,
    momentum: float = MOMENTUM,
    int8: bool = False,
    fragments: int = 1,
) -> list[Synced]:
    """The reference after each sync. Without fragments, round r is steps r*H .. r*H+H-1
    and their H*BATCH items; group g trains the g-th of `groups` contiguous parts, the
    i-th of H parts of it in inner step i, and each sync moves every weight. With two
    fragments (the weight, then the bias) a sync comes every H/2 steps and moves one of
    them in turn, the last sync both. With `int8` each pseudo-gradient crosses as a
    whole number of steps: the largest magnitude in any group's (the weight is one row)
    over 127 // groups, rounded half to even."""
    start = [*START, BIAS][: 2 if fragments == 1 else 3]
    parts = [list(range(len(start)))] if fragments == 1 else [[0, 1], [2]]
    synced, buf = list(start), [0.0] * len(start)
    inner = [Inner(list(start)) for _ in range(groups)]
    every = H // fragments
    out = []
    for s in range(ROUNDS * fragments):
        items = range(s * every * BATCH, (s + 1) * every * BATCH)
        loss = 0.0
        for g, group in enumerate(inner):
            share = part(items, groups, g)
            for i in range(every):
                loss += group.step(part(share, every, i), lr_at(s * every + i))
        last = s == ROUNDS * fragments - 1
        for names in parts if last else [parts[s % fragments]]:
            moved = [[synced[k] - group.w[k] for k in names] for group in inner]
            if int8:
                step = max(abs(v) for d in moved for v in d) / (127 // groups)
                moved = [[round(v / step) * step for v in d] for d in moved]
            for j, k in enumerate(names):
                mean = sum(d[j] for d in moved) / groups
                buf[k] = momentum * buf[k] + mean
                synced[k] -= outer_lr * (mean + momentum * buf[k])
                for group in inner:
                    group.w[k] = synced[k]
        lives = [list(group.w) for group in inner]
        out.append(Synced(loss / len(items), list(synced), list(buf), lives))
    return out


def part(items: range, parts: int, index: int) -> range:
    lo, hi = index * len(items) // parts, (index + 1) * len(items) // parts
    return range(items.start + lo, items.start + hi)


@pytest.mark.parametrize(
    "groups,int8,fragments", [(2, False, 1), (3, False, 1), (3, True, 1), (2, False, 2)]
)
def test_diloco_matches_a_reference_worked_by_hand(
    tmp_path: Path, groups: int, int8: bool, fragments: int
) -> None:
    """Two and three groups; three sending their pseudo-gradients as int8; and two
    streaming two fragments (the weight, then a bias), a sync every step."""
    lighthouse = start_lighthouse(tmp_path, min_replicas=groups)
    job = [
        *JOB,
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        f"checkpoint.interval_steps={H}",
        f"ft.should_quantize={str(int8).lower()}",
        f"ft.num_fragments={fragments}",
        *(["workload.options.bias=true"] if fragments > 1 else []),
    ]
    common = dict(num_groups=groups, lighthouse=lighthouse.address, overrides=job)
    launched = [launch_group(CONFIG, tmp_path, group=g, **common) for g in range(groups)]  # type: ignore[arg-type]
    with cleanup(lighthouse, *launched):
        for g in launched:
            assert g.wait(120) == [0], g.rank0.tail()
    want = reference(groups, int8=int8, fragments=fragments)
    every = H // fragments
    for g in launched:
        steps = [(int(e["step"]), float(e["loss"])) for e in g.events("train_step")]
        assert [s for s, _ in steps] == [every * (k + 1) for k in range(len(want))], steps
        assert [loss for _, loss in steps] == pytest.approx([w.loss for w in want], rel=1e-5)
    # Each checkpoint (steps H and 2H) holds the writer's (group 0's) live weights, and
    # the synced weights and momentum every group agrees on (with fragments the live
    # weight of step H is group 0's own: only the bias synced there).
    for step in (H, 2 * H):
        at = want[step // every - 1]
        held = saved(tmp_path, step)
        assert weights(held["model"]) == pytest.approx(at.live[0], abs=1e-6)
        assert weights(held["outer"]) == pytest.approx(at.momentum, abs=1e-6)
        if fragments > 1:
            assert weights(held["synced"]) == pytest.approx(at.synced, abs=1e-6)
        else:
            assert "synced" not in held and at.live[0] == at.synced
    if fragments > 1:
        assert abs(want[H // every - 1].live[0][0] - want[H // every - 1].synced[0]) > 1e-4
    # The checks tell DiLoCo from the plain average of the groups' weights (an outer
    # step of rate 1 and no momentum), and int8 from float32.
    end = want[-1].synced
    plain = reference(groups, 1.0, 0.0, int8, fragments)[-1].synced
    assert max(abs(a - b) for a, b in zip(plain, end, strict=True)) > 1e-3
    other = reference(groups, int8=not int8, fragments=fragments)[-1].synced
    assert max(abs(a - b) for a, b in zip(other, end, strict=True)) > 1e-5


def saved(tmp_path: Path, step: int) -> dict[str, dict[str, torch.Tensor]]:
    (found,) = list((tmp_path / "ckpt").glob(f"**/step-{step}"))
    dcp_to_torch_save(found, tmp_path / f"step-{step}.pt")
    held: dict[str, dict[str, torch.Tensor]] = torch.load(
        tmp_path / f"step-{step}.pt", weights_only=True
    )
    return held


def weights(section: dict[str, torch.Tensor]) -> list[float]:
    """The weight's two values, then the bias where there is one."""
    bias = section["fc.bias"].flatten().tolist() if "fc.bias" in section else []
    return [*section["fc.weight"].flatten().tolist(), *bias]
