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
4. without a checkpoint of its own, a run does the same with
   ``checkpoint.resume_from`` (another run's directory or one of its steps), where
   finding nothing valid, or a checkpoint of another model, is bad input (exit 2);
5. before the first commit, the groups compare digests of the restored parameters
   and buffers (the vote of ``trainer.ft.divergence``); a group in the minority stops
   (:class:`RestoreMismatch`) and heals from the others rather than average
   gradients of a different model into theirs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from trainer.chaos import Chaos
from trainer.checkpoint.files import (
    FOREIGN,
    PREFIX,
    SCALARS,
    candidates,
    problem,
    resume_source,
    saved_at,
)
from trainer.checkpoint.safe_load import SafeReader, TensorOnlyPlanner
from trainer.checkpoint.saver import Checkpointer
from trainer.config import ConfigError
from trainer.contracts import rank_events as events
from trainer.ft.divergence import compare_groups
from trainer.ft.replication import Checkpointing
from trainer.ft.state import local
from trainer.parallel.group_ops import on_any_rank

NONE = -1
REFUSED = -2  # rank 0 found checkpoint.resume_from unusable: every rank exits 2


class RestoreMismatch(RuntimeError):
    """The groups restored different parameters from one agreed checkpoint."""


@dataclass(frozen=True)
class Source:
    """Where a resume looks: a run directory, perhaps one step of it; `strict` for
    checkpoint.resume_from (what it names must load, or the job exits 2)."""

    root: Path
    only: int | None = None
    strict: bool = False
    hidden: int = NONE  # chaos: a step invisible to this rank


def resume(
    ckpt: Checkpointer,
    replication: Checkpointing,
    chaos: Chaos | None = None,
    resume_from: str | None = None,
) -> int | None:
    """Load the checkpoint every group agrees on into the live state; its step, or None.

    This run's own checkpoints first; without one, checkpoint.resume_from.
    Collective: every rank of every group in the quorum calls it in the same step.
    """
    own = Source(ckpt.root)
    if chaos is not None and chaos.at("resume"):
        own = Source(
            ckpt.root, hidden=next((c.step for c in candidates(own.root) if c.marked), NONE)
        )
    step = _agree_and_load(ckpt, replication, own)
    ckpt.last_saved = step  # on disk already: the final save need not redo it
    if step is None and resume_from:
        root, only = resume_source(Path(resume_from))
        step = _agree_and_load(ckpt, replication, Source(root, only, strict=True))
        if step is None:  # every valid-looking one failed to load
            raise ConfigError(
                f"checkpoint.resume_from {resume_from}: no checkpoint there could be loaded "
                "(see checkpoint_invalid); fix the path or unset it."
            )
    if step is not None:
        _compare_digests(ckpt, replication, step, chaos)
    return step


def _agree_and_load(ckpt: Checkpointer, replication: Checkpointing, source: Source) -> int | None:
    bound: int | None = None
    while True:
        refusal: ConfigError | None = None
        mine = NONE
        if ckpt.rank == 0:
            try:
                mine = _newest_valid(ckpt, source, bound)
            except ConfigError as e:
                refusal, mine = e, REFUSED
        proposal = _from_rank0(ckpt, mine)
        if proposal == REFUSED:
            raise refusal or ConfigError("rank 0 refused checkpoint.resume_from (see its error).")
        (low,), (high,) = replication.across_groups([proposal])
        if low != high:
            bound = low
            continue
        if low == NONE:
            return None
        loaded = _load(ckpt, replication, source.root / f"{PREFIX}{low}")
        (every_group,), _ = replication.across_groups([1 if ckpt.agree(loaded) else 0])
        if every_group:
            return low
        bound = low - 1


def _newest_valid(ckpt: Checkpointer, source: Source, bound: int | None) -> int:
    """Rank 0: the newest trustworthy checkpoint of `source` no newer than bound (NONE:
    there is none). For checkpoint.resume_from, none at all is bad input."""
    reasons: list[str] = []
    for candidate in candidates(source.root):
        if source.only is not None and candidate.step != source.only:
            continue
        if (bound is not None and candidate.step > bound) or candidate.step == source.hidden:
            continue
        why = problem(candidate, ckpt.model_hash)
        if why is None:
            return candidate.step
        if source.strict and why == FOREIGN:
            raise ConfigError(
                f"checkpoint.resume_from: {candidate.path} was {why} (the model section "
                "differs); point it at a checkpoint of this model or unset it."
            )
        reasons.append(f"{candidate.path.name}: {why}")
        saved = saved_at(candidate.path)
        ckpt.note(
            "warning", events.CHECKPOINT_INVALID, path=str(candidate.path), reason=why, saved=saved
        )
    if source.strict and bound is None:
        found = "; ".join(reasons) or "no step-<N> directory there"
        raise ConfigError(
            f"checkpoint.resume_from {source.root if source.only is None else source.root / f'{PREFIX}{source.only}'} "
            f"holds no valid checkpoint ({found}); fix the path or unset it."
        )
    return NONE


def _from_rank0(ckpt: Checkpointer, value: int) -> int:
    """Rank 0's value, on every rank of the group."""
    if not ckpt.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, src=0, group=ckpt.pg)
    return int(t.item())


def _load(ckpt: Checkpointer, replication: Checkpointing, path: Path) -> bool:
    """Load the checkpoint at path on every rank of the group (collective); False if it failed."""
    try:
        reader = SafeReader(str(path))
        targets = ckpt.tensors()
        # Saved before buffers were kept: the buffers keep their initial values.
        keys = reader.read_metadata().state_dict_metadata
        has_buffers = any(k.startswith("buffers.") for k in keys)
        if not has_buffers:
            del targets["buffers"]
        # Saved in every-step mode (or before diloco): the outer momentum starts at zero.
        if "outer" in targets and not any(k.startswith("outer.") for k in keys):
            del targets["outer"]
        # Saved without fragments (or in every-step mode): the synced are the live ones.
        if "synced" in targets and not any(k.startswith("synced.") for k in keys):
            del targets["synced"]
        dcp_load(targets, storage_reader=reader, planner=TensorOnlyPlanner(), process_group=ckpt.pg)
        scalars: dict[str, Any] = json.loads((path / SCALARS).read_text())
    except Exception as e:  # DCP raises on every rank when any rank's read fails
        why = f"load failed: {e}"
        saved = saved_at(path)
        ckpt.note("warning", events.CHECKPOINT_INVALID, path=str(path), reason=why, saved=saved)
        return False
    ckpt.state.buffers.restore()  # the live buffers are the loaded (committed) ones
    if ckpt.state.outer is not None and "synced" not in targets:
        ckpt.state.outer.rebase()  # saved at a sync of every parameter: they are the live
    ckpt.state.load_scalars(scalars)
    replication.restore(int(scalars["step"]), scalars.get("torchft", {}))
    # Every rank says what it loaded: a test (and an operator) can see they agree.
    ckpt.log.info(
        events.CHECKPOINT_LOADED, step=int(scalars["step"]), source=str(path), buffers=has_buffers
    )
    return True


def _compare_digests(
    ckpt: Checkpointer, replication: Checkpointing, step: int, chaos: Chaos | None
) -> None:
    """Before the first commit: did every group restore the same parameters? The vote of
    trainer.ft.divergence: a group in the minority stops (its daemon restarts it and it heals
    from the others, who have restored and go on); the majority goes on."""
    if chaos is not None and chaos.at("restored"):  # perturb: this rank restored other values
        next(iter(ckpt.state.params.values())).data.add_(1e-3)
    shards = [
        *(local(p) for p in ckpt.state.params.values()),
        *ckpt.state.buffers.committed.values(),
    ]
    seen = compare_groups(shards, replication, on_any_rank)
    if seen is None:  # one group: nothing to compare with
        return
    if not seen.diverged:
        ckpt.note("info", "checkpoint_digests_agree", step=step)
        return
    ckpt.note(
        "warning",
        "checkpoint_digests_differ",
        step=step,
        group="minority: restarting to heal" if seen.minority else "majority",
    )
    if seen.minority:
        raise RestoreMismatch(
            f"this group restored other parameters from checkpoint step {step} than the "
            "majority of the groups; it restarts and heals from them."
        )
