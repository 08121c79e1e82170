"""One rank of the cp sharding test: the slices `sequence_slice` gives this cp rank of a
batch and of a per-position buffer, through the all-gather attention's own sharding and
through torch's `context_parallel` (whose buffer sharding runs on a CPU; its attention
does not), and what is left after each context. Prints one JSON line.

Usage: torchrun --nproc-per-node 2 cp_shard_rank.py
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from trainer.data.sources import StepData
from trainer.parallel.context import ContextParallel, sequence_slice

SEQ = 16

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
model = nn.Module()
model.register_buffer("table", torch.arange(2 * SEQ).float() * 10)  # longer than SEQ
batch = StepData(torch.arange(2 * SEQ).reshape(2, SEQ), torch.arange(2 * SEQ).reshape(2, SEQ) + 100)
sdpa = F.scaled_dot_product_attention
out: dict[str, object] = {"rank": rank}
for attention in ("all_gather", "torch"):
    cp = ContextParallel(mesh, rank, 2, SEQ, ("table",), attention)
    with sequence_slice(cp, [model], batch) as mine:
        out[attention] = {
            "inputs": mine.inputs.tolist(),
            "targets": mine.targets.tolist(),
            "table": model.table.tolist(),  # type: ignore[operator]
            "sdpa_replaced": F.scaled_dot_product_attention is not sdpa,
        }
    out[f"{attention} after"] = {
        "table": model.table.tolist(),  # type: ignore[operator]
        "batch": batch.inputs.tolist(),
        "sdpa_restored": F.scaled_dot_product_attention is sdpa,
    }
# One write of the whole line: both ranks share torchrun's stdout, and print's two writes
# (the text, then the newline) once let the other rank's line in between.
sys.stdout.write(json.dumps(out) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
