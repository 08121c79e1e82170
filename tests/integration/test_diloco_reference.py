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
from tests.support.two_weight_workload import START, item

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
    f"checkpoint.interval_steps={H * ROUNDS}",
]


def lr_at(step: int) -> float:
    """No warmup; cosine from LR to MIN_LR over the job's steps."""
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * step / (H * ROUNDS)))


@dataclass
class Inner:
    """One group's weights and AdamW moments (they stay with the group across rounds)."""

    w: list[float]
    m: list[float] = field(default_factory=lambda: [0.0, 0.0])
    v: list[float] = field(default_factory=lambda: [0.0, 0.0])
    t: int = 0

    def step(self, items: range, lr: float) -> float:
        """One AdamW step on the mean squared error over `items`; their loss sum before it."""
        errors = [(sum(w * x for w, x in zip(self.w, item(i)[0], strict=True)) - item(i)[1], i)
                  for i in items]  # fmt: skip
        grad = [sum(2 * e * item(i)[0][k] for e, i in errors) / len(items) for k in range(2)]
        self.t += 1
        b1, b2 = BETAS
        for k in range(2):
            self.w[k] *= 1 - lr * DECAY
            self.m[k] = b1 * self.m[k] + (1 - b1) * grad[k]
            self.v[k] = b2 * self.v[k] + (1 - b2) * grad[k] ** 2
            denom = math.sqrt(self.v[k]) / math.sqrt(1 - b2**self.t) + EPS
            self.w[k] -= lr / (1 - b1**self.t) * self.m[k] / denom
        return sum(e * e for e, _ in errors)


def reference(
    groups: int, outer_lr: float = OUTER_LR, momentum: float = MOMENTUM, int8: bool = False
) -> tuple[list[float], list[float], list[float]]:
    """(each round's mean loss, the synced weights and the outer momentum at the end).
    Round r is steps r*H .. r*H+H-1 and their H*BATCH items; group g trains the g-th of
    `groups` contiguous parts, the i-th of H parts of it in inner step i. With `int8`
    each pseudo-gradient crosses as a whole number of steps: the largest magnitude in
    any group's (the weight is one row) over 127 // groups, rounded half to even."""
    synced, buf = list(START), [0.0, 0.0]
    inner = [Inner(list(START)) for _ in range(groups)]
    losses = []
    for r in range(ROUNDS):
        items = range(r * H * BATCH, (r + 1) * H * BATCH)
        loss, moved = 0.0, []
        for g, group in enumerate(inner):
            share = part(items, groups, g)
            group.w = list(synced)
            for i in range(H):
                loss += group.step(part(share, H, i), lr_at(r * H + i))
            moved.append([synced[k] - group.w[k] for k in range(2)])
        if int8:
            step = max(abs(v) for d in moved for v in d) / (127 // groups)
            moved = [[round(v / step) * step for v in d] for d in moved]
        mean = [sum(d[k] for d in moved) / groups for k in range(2)]
        buf = [momentum * buf[k] + mean[k] for k in range(2)]
        synced = [synced[k] - outer_lr * (mean[k] + momentum * buf[k]) for k in range(2)]
        losses.append(loss / len(items))
    return losses, synced, buf


def part(items: range, parts: int, index: int) -> range:
    lo, hi = index * len(items) // parts, (index + 1) * len(items) // parts
    return range(items.start + lo, items.start + hi)


@pytest.mark.parametrize("groups,int8", [(2, False), (3, False), (3, True)])
def test_diloco_matches_a_reference_worked_by_hand(tmp_path: Path, groups: int, int8: bool) -> None:
    """Two and three groups; and three sending their pseudo-gradients as int8."""
    lighthouse = start_lighthouse(tmp_path, min_replicas=groups)
    job = [*JOB, f'checkpoint.dir="{tmp_path / "ckpt"}"', f"ft.should_quantize={str(int8).lower()}"]
    common = dict(num_groups=groups, lighthouse=lighthouse.address, overrides=job)
    launched = [launch_group(CONFIG, tmp_path, group=g, **common) for g in range(groups)]  # type: ignore[arg-type]
    with cleanup(lighthouse, *launched):
        for g in launched:
            assert g.wait(120) == [0], g.rank0.tail()
    losses, synced, momentum = reference(groups, int8=int8)
    for g in launched:
        steps = [(int(e["step"]), float(e["loss"])) for e in g.events("train_step")]
        assert [s for s, _ in steps] == [H * (r + 1) for r in range(ROUNDS)], steps
        assert [loss for _, loss in steps] == pytest.approx(losses, rel=1e-5), steps
    (saved,) = list((tmp_path / "ckpt").glob(f"**/step-{H * ROUNDS}"))
    dcp_to_torch_save(saved, tmp_path / "final.pt")
    held = torch.load(tmp_path / "final.pt", weights_only=True)
    assert held["model"]["fc.weight"].flatten().tolist() == pytest.approx(synced, abs=1e-6)
    assert held["outer"]["fc.weight"].flatten().tolist() == pytest.approx(momentum, abs=1e-6)
    # The checks above tell DiLoCo from the plain average of the groups' weights
    # (an outer step of rate 1 and no momentum), and int8 from float32.
    _, plain, _ = reference(groups, outer_lr=1.0, momentum=0.0, int8=int8)
    assert max(abs(a - b) for a, b in zip(plain, synced, strict=True)) > 1e-3
    _, other, _ = reference(groups, int8=not int8)
    assert max(abs(a - b) for a, b in zip(other, synced, strict=True)) > 1e-5
