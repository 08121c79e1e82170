"""One replica group (one process) of the bare torchft peer of bench/peers.py.

A ``torchft.Manager`` over torchft's reconfigurable gloo process group, asynchronous
quorum, the Manager's default HTTP checkpoint transport for healing (state_dict and
load_state_dict of model and optimizer). Each step: start the quorum, forward and
backward, average the gradients across groups with ``manager.allreduce`` on one flat
buffer, then ``should_commit`` before the optimizer step.
``torchft.DistributedDataParallel`` is not used: in torchft 0.2.0 its comm hook takes
the surviving group down when a peer dies mid-all-reduce.

The process hosts its group's TCPStore itself (the Manager only connects to one), on
the fresh port bench/peers.py gives every launch. Environment: ``REPLICA_GROUP_ID``,
``NUM_REPLICA_GROUPS``, ``TORCHFT_LIGHTHOUSE``, ``MASTER_PORT``.

    python -m bench.peer_torchft --log-dir D
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not in stubs

from bench.peer_worker import StepLog, build, clip_and_step, gradients
from trainer.config import FaultToleranceConfig

HOST = "127.0.0.1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-dir", required=True)
    args = parser.parse_args()
    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    port = int(os.environ["MASTER_PORT"])
    log = StepLog(args.log_dir, f"torchft-g{group}")
    log.write(event="start", group=group)

    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    ft = FaultToleranceConfig()  # Phalanx's defaults for the manager's timeouts
    timeout = timedelta(seconds=ft.timeout_s)
    store = TCPStore(HOST, port, is_master=True, wait_for_workers=False)
    parts = build(group, groups)

    def state_dict() -> dict[str, Any]:
        return {"model": parts.model.state_dict(), "optim": parts.optimizer.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        parts.model.load_state_dict(sd["model"])
        parts.optimizer.load_state_dict(sd["optim"])
        log.write(event="healed", group=group)

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        use_async_quorum=True,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=ft.quorum_timeout_s),
        connect_timeout=timedelta(seconds=ft.connect_timeout_s),
        rank=0,
        world_size=1,
        store_addr=HOST,
        store_port=port,
        lighthouse_addr=os.environ["TORCHFT_LIGHTHOUSE"],
        replica_id=f"bench_group_{group}",
        hostname=HOST,
        init_sync=False,  # every group initialises the same weights from train.seed
        quorum_retries=ft.quorum_retries,
    )
    log.write(event="ready", group=group)
    params = list(parts.model.parameters())
    while manager.current_step() < parts.cfg.train.steps:
        manager.start_quorum()
        step = int(manager.current_step())
        gradients(parts, parts.model, step)
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        manager.allreduce(flat).wait()
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        if manager.should_commit():
            clip_and_step(parts, int(manager.current_step()) - 1)
            participants = int(manager.num_participants())
            log.write(
                event="commit",
                step=int(manager.current_step()),
                group=group,
                participants=participants,
            )
    manager.shutdown(wait=False)
    del store


if __name__ == "__main__":
    main()
