"""A replica group's ``torchft.Manager``, built as Phalanx runs it (torchft_group.py).

Its process group (Gloo on CPU, NCCL on CUDA) is scoped to the group's stores and,
with Gloo, interruptible by the daemon's notices (torchft_adapter.py); its checkpoint
transport heals from a copy at the advertised host (transport.py); rank 0's manager
server listens on the bind address only; the replica id keeps the daemon's uuid across
the group's restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from trainer.config import FaultToleranceConfig
from trainer.config.env import RankEnv, replica_id
from trainer.ft import torchft_adapter as ft
from trainer.ft.transport import (
    SnapshotTransport,
    advertise_host,
    bind_host,
    checkpoint_transport,
    cross_group_nccl,
)


def build_manager(
    cfg: FaultToleranceConfig,
    env: RankEnv,
    device: torch.device,
    load_state_dict: Callable[[dict[str, Any]], None],
    state_dict: Callable[[], dict[str, Any]],
) -> tuple[Any, Any, SnapshotTransport]:
    """The manager, its process group (configured by each quorum for this rank's peers
    in every group) and its checkpoint transport. `load_state_dict` / `state_dict`:
    torchft's load of a peer's state while healing, and its read of ours for a healer."""
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    timeout = timedelta(seconds=cfg.timeout_s)
    nccl = cross_group_nccl(cfg.backend, device)
    # NCCL connects lazily: only gloo's build can be stuck.
    pg = ft.scoped_process_group(
        ProcessGroupNCCL if nccl else ProcessGroupGloo, interruptible=not nccl
    )(timeout=timeout)
    transport = checkpoint_transport(timeout)
    # Rank 0's manager server listens on the bind address only (torchft: every interface).
    with ft.manager_server_bound_to(bind_host()), ft.replica_uuid(env.replica_uuid):
        manager = Manager(
            pg=pg,
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=env.min_replicas,
            # DiLoCo: every quorum is a sync, where a healing group must be at the round's
            # start before the exchange (round_loop.py), so it heals in start_quorum.
            use_async_quorum=cfg.async_quorum and cfg.semi_sync_method == "none",
            timeout=timeout,
            quorum_timeout=timedelta(seconds=cfg.quorum_timeout_s),
            connect_timeout=timedelta(seconds=cfg.connect_timeout_s),
            rank=env.rank,
            world_size=env.world_size,
            store_addr=env.master_addr,
            store_port=env.master_port,
            lighthouse_addr=env.lighthouse,
            # The lowest id sorts first in a quorum (the checkpoint writer, see is_writer).
            replica_id=replica_id(env.replica_group),
            hostname=advertise_host(),
            checkpoint_transport=transport,
            # Every group initialises identical weights from train.seed.
            init_sync=False,
            # torchft 0.2.0's manager does not tell its ranks when a lighthouse call fails
            # (they wait out the quorum timeout); retrying, with a fresh lighthouse client
            # each time, rides out a leader change behind the daemon's forwarder.
            quorum_retries=cfg.quorum_retries,
        )
    if env.replica_uuid is not None:
        # The daemon keeps a group's replica id across its restarts: the replacement
        # takes the place of the process it replaces at the lighthouse at once, where
        # a new id would wait out the dead one's heartbeat timeout (DESIGN.md).
        ft.count_as_new(manager)
    return manager, pg, transport


def managed_process_group(manager: Any) -> Any:
    """torchft's process group whose all-reduce the manager averages and gates."""
    from torchft.process_group import ManagedProcessGroup

    return ManagedProcessGroup(manager)
