"""The process group and DeviceMesh inside one replica group.

The mesh has the axes ``("pp", "dp_shard", "cp", "tp")`` over the group's ranks (any
of them may be 1), like torchtitan's ParallelDims. FSDP shards over dp_shard and cp
together (the cp ranks of a data shard hold the same parameters and see different
positions of the same items), as torchtitan's ``dp_shard_cp``. Replication across groups
is not a mesh axis: torchft's reconfigurable process group does it (fault_tolerance.py).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not in stubs
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.config import ParallelConfig
from trainer.config import env as rank_vars
from trainer.config.env import RankEnv, bind_host

AXES = ("pp", "dp_shard", "cp", "tp")


def pick_device(cfg: ParallelConfig, env: RankEnv) -> torch.device:
    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


@dataclass
class Layout:
    device: torch.device
    mesh: DeviceMesh | None  # None for a single-rank group
    pp: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1
    pp_rank: int = 0
    dp_rank: int = 0
    tp_rank: int = 0
    cp_rank: int = 0
    fsdp: DeviceMesh | None = None  # what FSDP shards over (see fsdp_mesh)
    backend: str | None = None  # the group's process group's (group_backend); None without one

    def sub(self, axis: str) -> DeviceMesh | None:
        """The 1-D mesh of one axis, or None when that axis has degree 1."""
        if self.mesh is None or getattr(self, axis) == 1:
            return None
        return self.mesh[axis]

    def group(self, axis: str) -> dist.ProcessGroup | None:
        sub = self.sub(axis)
        return sub.get_group() if sub is not None else None

    def degrees(self) -> dict[str, int]:
        """The layout as logged by rank_started and kept in a checkpoint's marker."""
        return {"pp": self.pp, "dp_shard": self.dp_shard, "cp": self.cp, "tp": self.tp}

    def fsdp_group(self) -> dist.ProcessGroup | None:
        """The ranks that share parameters and split the data (dp_shard x cp)."""
        return self.fsdp.get_group() if self.fsdp is not None else None


def fsdp_mesh(mesh: DeviceMesh, dp_shard: int, cp: int) -> DeviceMesh | None:
    """dp_shard and cp flattened into one axis (either alone where the other is 1), or
    None when both are 1. Flattening forms a process group: every rank calls this once."""
    if dp_shard * cp == 1:
        return None
    if cp == 1:
        return mesh["dp_shard"]
    if dp_shard == 1:
        return mesh["cp"]
    return mesh["dp_shard", "cp"]._flatten("dp_shard_cp")


_LISTENERS: list[socket.socket] = []  # the store serves on these for the process's life


def group_store(env: RankEnv, timeout: timedelta) -> TCPStore:
    """The group's TCPStore at MASTER_ADDR:MASTER_PORT; rank 0 serves it on the bind
    address only (torch's env:// server listens on every interface)."""
    assert env.master_addr and env.master_port
    if env.rank != 0:
        return TCPStore(env.master_addr, env.master_port, env.world_size, False, timeout)
    host = bind_host()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, env.master_port), family=family, backlog=1024)
    _LISTENERS.append(listener)
    return TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=listener.fileno(),
    )


def group_backend(device_type: str, registered: Sequence[str]) -> str:
    """The backend of a group's own process group. On CUDA, NCCL by an explicit name where
    torch has one: from torch 2.15 plain "nccl" means the new nccl2 implementation, which
    Phalanx has not run with (its GPU runs were on torch 2.11's ProcessGroupNCCL), so a
    torch that registers "nccl-legacy" gets that; an older torch's "nccl" is the same one."""
    if device_type != "cuda":
        return "gloo"
    nccl = "nccl-legacy" if "nccl-legacy" in registered else "nccl"
    return f"cpu:gloo,cuda:{nccl}"


def init_distributed(cfg: ParallelConfig, env: RankEnv, timeout_s: float) -> Layout:
    """Join the group's process group (rank 0 hosts its TCPStore) and build the mesh."""
    device = pick_device(cfg, env)
    backend: str | None = None
    if env.world_size > 1 or env.master_addr:
        backend = group_backend(device.type, dist.Backend.backend_list)
        timeout = timedelta(seconds=timeout_s)
        if env.master_addr and env.master_port and not env.torchelastic:
            dist.init_process_group(
                backend,
                store=group_store(env, timeout),
                rank=env.rank,
                world_size=env.world_size,
                timeout=timeout,
            )
        else:  # torchrun's agent hosts the store (or a lone rank on loopback)
            os.environ.setdefault(rank_vars.MASTER_ADDR, env.master_addr or "127.0.0.1")
            if env.master_port:
                os.environ.setdefault(rank_vars.MASTER_PORT, str(env.master_port))
            dist.init_process_group(
                backend,
                init_method="env://",
                rank=env.rank,
                world_size=env.world_size,
                timeout=timeout,
            )
    if env.world_size == 1:
        return Layout(device=device, mesh=None, backend=backend)
    shape = (cfg.pp, cfg.dp_shard, cfg.cp, cfg.tp)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=AXES)
    coords = mesh.get_coordinate()
    assert coords is not None
    return Layout(
        device=device,
        mesh=mesh,
        pp=cfg.pp,
        dp_shard=cfg.dp_shard,
        tp=cfg.tp,
        cp=cfg.cp,
        pp_rank=coords[0],
        dp_rank=coords[1],
        cp_rank=coords[2],
        tp_rank=coords[3],
        fsdp=fsdp_mesh(mesh, cfg.dp_shard, cfg.cp),
        backend=backend,
    )
