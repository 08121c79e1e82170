"""Peak memory of a rank that builds a large model: on the meta device, against full first.

Two ranks (gloo, this machine) build the built-in Llama at about 1B parameters with
``parallel.dp_shard = 2``, each way in its own pair of processes:

* ``meta``: Phalanx's path (trainer/run.py): build on the meta device, parallelize
  (FSDP2), then allocate and initialise only the local shards (trainer/parallel/materialize.py);
* ``full-first``: the previous path: build and initialise the whole model in CPU
  memory, then parallelize (FSDP2 keeps the shard and frees the rest).

Each rank reports its peak resident memory (``ru_maxrss``) once the model is
parallelized and initialised, as a fraction of the full fp32 model's bytes. The
target for ``meta`` is at most 0.6 (each rank holds half the parameters).

    .venv/bin/python -m bench.memory              # about 1B parameters
    .venv/bin/python -m bench.memory --layers 2   # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys

TARGET = 0.6


def rank(mode: str, layers: int) -> None:
    """One rank: build the model `mode`'s way, print its peak RSS as JSON."""
    import torch
    import torch.distributed as dist

    from trainer.config import ModelConfig, ParallelConfig
    from trainer.config.env import RankEnv
    from trainer.ft.state import local
    from trainer.parallel.materialize import build_materialized, materialize
    from trainer.parallel.mesh import init_distributed
    from trainer.parallel.parallelize import parallelize
    from trainer.workloads import Workload, build_meta
    from trainer.workloads.llama.model import Block, Transformer
    from trainer.workloads.llama.workload import cross_entropy, llama_init, tp_plan

    model_cfg = ModelConfig(
        vocab_size=32000,
        dim=2048,
        n_layers=layers,
        n_heads=16,
        ffn_hidden=5632,
        max_seq_len=256,
    )
    parallel = ParallelConfig(dp_shard=2)
    work = Workload(
        name="llama-1b",
        build_model=lambda: Transformer(model_cfg),
        init=llama_init(model_cfg),
        loss=cross_entropy,
        train_data=[],
        shard_units=Block,
        tp_plan=tp_plan(),
        trunk="layers",
    )
    layout = init_distributed(parallel, RankEnv.from_environ(), 600.0)
    torch.manual_seed(0)
    if mode == "meta":
        model = parallelize(build_meta(work, "bench"), work, parallel, layout)
        materialize(model, work.init, 0, layout.device, "bench")
    else:
        model = parallelize(build_materialized(work, 0), work, parallel, layout)
    params = list(model.parameters())
    full_bytes = sum(p.numel() for p in params) * 4  # DTensor numel is the global size
    local_bytes = sum(local(p).numel() * local(p).element_size() for p in params)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dist.barrier()
    print(
        json.dumps(
            {
                "mode": mode,
                "rank": dist.get_rank(),
                "params": sum(p.numel() for p in params),
                "full_bytes": full_bytes,
                "local_bytes": local_bytes,
                "peak_rss": peak,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


def launch(mode: str, layers: int) -> list[dict[str, float]]:
    from daemon.children import free_port

    port = str(free_port())
    procs = []
    for r in range(2):
        env = {
            **os.environ,
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
        }
        argv = [sys.executable, "-m", "bench.memory", "--rank", mode, "--layers", str(layers)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a {mode} rank failed with exit code {p.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=18, help="18 layers: about 1.06B parameters")
    parser.add_argument("--rank", choices=("meta", "full-first"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        rank(args.rank, args.layers)
        return 0
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs")
    results = {mode: launch(mode, args.layers) for mode in ("meta", "full-first")}
    params = results["meta"][0]["params"]
    full = results["meta"][0]["full_bytes"]
    print(f"model: {params / 1e9:.3f}B parameters, full fp32 {full / 2**30:.2f} GiB, dp_shard=2")
    print("mode        rank  local GiB  peak RSS GiB  peak / full fp32")
    worst: dict[str, float] = {}
    for mode, ranks in results.items():
        for r in ranks:
            share = r["peak_rss"] / r["full_bytes"]
            worst[mode] = max(worst.get(mode, 0.0), share)
            print(
                f"{mode:<10}  {int(r['rank']):>4}  {r['local_bytes'] / 2**30:>9.2f}  "
                f"{r['peak_rss'] / 2**30:>12.2f}  {share:>16.3f}"
            )
    met = "met" if worst["meta"] <= TARGET else "NOT met"
    print(
        f"ratio meta/full-first peak: {worst['meta'] / worst['full-first']:.3f}; "
        f"meta peak / full fp32: {worst['meta']:.3f} (target <= {TARGET}: {met})"
    )
    return 0 if worst["meta"] <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
