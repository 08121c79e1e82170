"""Cold start: every group that restores from disk loads the same checkpoint, or none.

A quorum in which no group has committed a step (the whole job was stopped and
started again) resumes from ``checkpoint.dir``. Reading the directory is not
enough to agree: a shared volume can show two readers different files (a marker
not yet visible, a file cached stale), and DCP loads collectively, so ranks that
chose differently would each read their shards of different steps. So:

1. rank 0 of each group alone scans and validates the candidates (marker, sizes,
   checksums) and tells its group the newest valid step (-1: none);
2. the groups agree on one step through their cross-group process group: while
   the proposals differ, each group proposes again its newest valid step no newer
   than the smallest proposal, so they meet at the newest step every group trusts;
3. every rank of every group loads that step; if any rank of any group fails to,
   all groups go back to step 2 below it;
4. before the first commit, the groups compare a digest of the restored
   parameters; a difference stops the ranks (:class:`RestoreMismatch`) rather than
   average gradients of different models.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from trainer.chaos import Chaos
from trainer.checkpoint import Checkpointer
from trainer.checkpoint_files import PREFIX, SCALARS, candidates, problem
from trainer.digest import params_sha256
from trainer.fault_tolerance import Replication
from trainer.safe_load import SafeReader, TensorOnlyPlanner

NONE = -1


class RestoreMismatch(RuntimeError):
    """The groups restored different parameters from one agreed checkpoint."""


def resume(
    ckpt: Checkpointer,
    replication: Replication,
    pp_group: dist.ProcessGroup | None,
    chaos: Chaos | None = None,
) -> int | None:
    """Load the checkpoint every group agrees on into the live state; its step, or None.

    Collective: every rank of every group in the quorum calls it in the same step.
    """
    hidden = NONE  # chaos: the newest marked checkpoint, invisible to this rank
    if chaos is not None and chaos.at("resume"):
        hidden = next((c.step for c in candidates(ckpt.root) if c.marked), NONE)
    bound: int | None = None
    while True:
        mine = _newest_valid(ckpt, bound, hidden) if ckpt.rank == 0 else NONE
        proposal = _from_rank0(ckpt, mine)
        (low,), (high,) = replication.across_groups([proposal])
        if low != high:
            bound = low
            continue
        if low == NONE:
            return None
        loaded = _load(ckpt, replication, low)
        (every_group,), _ = replication.across_groups([1 if ckpt.agree(loaded) else 0])
        if every_group:
            break
        bound = low - 1
    _compare_digests(ckpt, replication, pp_group, low)
    ckpt.last_saved = low  # on disk already: the final save need not redo it
    return low


def _newest_valid(ckpt: Checkpointer, bound: int | None, hidden: int) -> int:
    """Rank 0: the newest trustworthy checkpoint no newer than bound (NONE: there is none)."""
    for candidate in candidates(ckpt.root):
        if (bound is not None and candidate.step > bound) or candidate.step == hidden:
            continue
        why = problem(candidate, ckpt.model_hash)
        if why is None:
            return candidate.step
        ckpt.note("warning", "checkpoint_invalid", path=str(candidate.path), reason=why)
    return NONE


def _from_rank0(ckpt: Checkpointer, value: int) -> int:
    """Rank 0's value, on every rank of the group."""
    if not ckpt.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, src=0, group=ckpt.pg)
    return int(t.item())


def _load(ckpt: Checkpointer, replication: Replication, step: int) -> bool:
    """Load step-<step> on every rank of the group (collective); False if it failed."""
    path = ckpt.root / f"{PREFIX}{step}"
    try:
        dcp_load(
            ckpt.tensors(),
            storage_reader=SafeReader(str(path)),
            planner=TensorOnlyPlanner(),
            process_group=ckpt.pg,
        )
        scalars: dict[str, Any] = json.loads((path / SCALARS).read_text())
    except Exception as e:  # DCP raises on every rank when any rank's read fails
        ckpt.note("warning", "checkpoint_invalid", path=str(path), reason=f"load failed: {e}")
        return False
    ckpt.state.load_scalars(scalars)
    replication.restore(int(scalars["step"]), scalars.get("torchft", {}))
    # Every rank says what it loaded: a test (and an operator) can see they agree.
    ckpt.log.info("checkpoint_loaded", step=step, source=str(path))
    return True


def _compare_digests(
    ckpt: Checkpointer, replication: Replication, pp_group: dist.ProcessGroup | None, step: int
) -> None:
    digest = params_sha256(ckpt.state.params, pp_group)
    # 60 bits of the SHA-256 fit an int64: equal prefixes on every group, or a mismatch.
    (low,), (high,) = replication.across_groups([int(digest[:15], 16)])
    if low != high:
        raise RestoreMismatch(
            f"the replica groups restored different parameters from checkpoint step {step} "
            f"(this group's params_sha256 {digest[:15]}...); none of them commits a step."
        )
    ckpt.note("info", "checkpoint_digests_agree", step=step, params_sha256=digest)
