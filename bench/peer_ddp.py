"""One rank of the plain DDP peer of bench/peers.py, run by `torchrun --nproc_per_node 2`.

torch.nn.parallel.DistributedDataParallel over gloo; a synchronous DCP save
(``dcp.save``) of model and optimizer every ``--save-every`` steps, marked complete
by rank 0 once the save has returned; on start, every rank loads the newest marked
save. This is torchrun's restart-the-world recovery: a dead worker makes torchrun
stop the others and start them all again, and they go back to that save.

Each process writes its own log: ``start`` (imports done), ``resumed`` (the step
it continues from) and one ``commit`` line per optimizer step, with the wall time.

    torchrun --nproc_per_node 2 -m bench.peer_ddp --log-dir D --ckpt-dir C
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.nn.parallel import DistributedDataParallel

from bench.peer_worker import Parts, StepLog, build, clip_and_step, gradients
from daemon.children import die_with_parent

MARKER = "COMPLETE"
KEEP = 2


def saves(root: Path) -> list[tuple[int, Path]]:
    """Marked saves under root, newest first."""
    found = []
    for d in root.glob("step-*"):
        if (d / MARKER).exists() and d.name.removeprefix("step-").isdigit():
            found.append((int(d.name.removeprefix("step-")), d))
    return sorted(found, reverse=True)


def state(ddp: DistributedDataParallel, parts: Parts) -> dict[str, object]:
    model, optim = get_state_dict(ddp, parts.optimizer)
    return {"model": model, "optim": optim}


def load_newest(root: Path, ddp: DistributedDataParallel, parts: Parts) -> int:
    """Load the newest save every rank sees as marked; the step it holds (0: none)."""
    newest = saves(root)
    step = torch.tensor(newest[0][0] if newest else 0)
    dist.all_reduce(step, op=dist.ReduceOp.MIN)
    if int(step) == 0:
        return 0
    loaded = state(ddp, parts)
    dcp_load(loaded, checkpoint_id=str(root / f"step-{int(step)}"))
    set_state_dict(
        ddp,
        parts.optimizer,
        model_state_dict=loaded["model"],  # type: ignore[arg-type]
        optim_state_dict=loaded["optim"],  # type: ignore[arg-type]
    )
    return int(step)


def save(root: Path, step: int, ddp: DistributedDataParallel, parts: Parts) -> None:
    """Synchronous DCP save; rank 0 marks it complete and keeps the newest KEEP."""
    path = root / f"step-{step}"
    dcp_save(state(ddp, parts), checkpoint_id=str(path))
    if dist.get_rank() == 0:
        tmp = path / f"{MARKER}.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, path / MARKER)
        for _, old in saves(root)[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--save-every", type=int, default=20)
    args = parser.parse_args()
    die_with_parent(os.getppid())()  # no orphan if the torchrun agent is killed
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = StepLog(args.log_dir, f"ddp-r{rank}")
    log.write(event="start", rank=rank, attempt=attempt)
    dist.init_process_group("gloo")
    parts = build(rank, world)
    ddp = DistributedDataParallel(parts.model)
    root = Path(args.ckpt_dir)
    step = load_newest(root, ddp, parts)
    log.write(event="resumed", step=step, rank=rank, attempt=attempt)
    while step < parts.cfg.train.steps:
        gradients(parts, ddp, step)  # DDP averages the gradients during backward
        clip_and_step(parts, step)
        step += 1
        log.write(event="commit", step=step, group=0, rank=rank)
        if step % args.save_every == 0:
            save(root, step, ddp, parts)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
