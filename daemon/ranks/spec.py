"""What one start of this node's ranks needs (:class:`GroupSpec`, built from the
daemon's config) and the environment each rank gets from it: torchrun's variables,
torchft's replica-group ones and Phalanx's own. Shared by the worker group, the
standbys and the zygote, which spawn ranks with the same environment."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from daemon.config import DaemonConfig
from daemon.config.netif import interface_for
from trainer.config import env as rank_vars
from trainer.config.env import RankEnv
from trainer.contracts import heartbeat as heartbeat_file
from trainer.contracts import lease_file, notice_file

RANK_ARGV = [sys.executable, "-m", "trainer"]


@dataclass(frozen=True)
class Seat:
    """This node's place in its replica group: node `node_rank` of the group's `nodes`,
    each with the same number of ranks (torchrun's GROUP_RANK and NNODES). Node rank 0's
    ranks host the group's store at `master_addr`; None: this node's own address (the
    first node's, or a standby's placeholder)."""

    node_rank: int = 0
    nodes: int = 1
    master_addr: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.node_rank < self.nodes:
            raise ValueError(f"node rank {self.node_rank} is not within {self.nodes} nodes")
        if self.node_rank > 0 and not self.master_addr:
            raise ValueError("a group's node other than its first needs the store's address")


@dataclass(frozen=True)
class GroupPart:
    """One node's part in one generation of a group that spans nodes: its seat, the store
    port its first node chose and the group's torchft replica uuid (the first node's)."""

    seat: Seat
    generation: int
    master_port: int
    replica_uuid: str


@dataclass
class GroupSpec:
    """What the ranks of one start need; built by the supervisor."""

    nproc: int
    slot: int
    num_slots: int
    lighthouse: str  # URL of this daemon's lighthouse forwarder
    config_path: Path
    run_dir: Path
    min_replicas: int
    job: str
    node: str
    advertise_host: str
    bind_host: str  # the address the ranks' listeners bind
    extra_env: dict[str, str]
    metrics_dir: Path | None  # PROMETHEUS_MULTIPROC_DIR, or None when metrics are off
    python_path: list[str]  # workload.python_path, absolute: first on the ranks' PYTHONPATH
    # The uuid of the group's torchft replica id (PHALANX_REPLICA_UUID), kept across the
    # group's restarts by NodeGroup; "" lets torchft pick one per process.
    replica_uuid: str = ""
    seat: Seat = Seat()  # this node's place in a group of several nodes
    # lighthouse.join_timeout_ms (PHALANX_JOIN_TIMEOUT_MS): a rank says when a quorum
    # waited it out (trainer.ft.quorum_watch); 0 leaves it unset.
    join_timeout_ms: int = 0

    @classmethod
    def for_node(
        cls,
        cfg: DaemonConfig,
        slot: int,
        lighthouse: str,
        config_path: Path,
        replica_uuid: str = "",
        seat: Seat | None = None,
    ) -> GroupSpec:
        """The spec of this node's group in `slot`, from the daemon's config; `seat`: this
        node's place in it (default: the first of job.nodes_per_group, as a standby has)."""
        node = cfg.node
        return cls(
            nproc=node.nproc,
            slot=slot,
            num_slots=cfg.job.max_replicas,
            lighthouse=lighthouse,
            config_path=config_path,
            run_dir=cfg.run_dir,
            min_replicas=cfg.job.min_replicas,
            job=cfg.job.name,
            node=cfg.node_id,
            advertise_host=cfg.advertise_host,
            bind_host=cfg.bind_host,
            extra_env=node.env,
            metrics_dir=cfg.metrics_dir if cfg.metrics.enabled else None,
            python_path=[str(Path(p).resolve()) for p in cfg.workload.python_path],
            replica_uuid=replica_uuid,
            seat=seat or Seat(0, cfg.job.nodes_per_group),
            join_timeout_ms=cfg.lighthouse.join_timeout_ms,
        )


def heartbeat_path(spec: GroupSpec, rank: int) -> Path:
    return heartbeat_file.path(spec.run_dir, rank)


def rank_env(spec: GroupSpec, rank: int, master_port: int, attempt: int) -> dict[str, str]:
    """The environment of local rank `rank` in one start of the group (a standby is spawned
    with the same variables, placeholders for the start's own, and gets these on takeover).
    The group's ranks are numbered as torchrun numbers them: node by node."""
    s, seat = spec, spec.seat
    contract = RankEnv(
        rank=seat.node_rank * s.nproc + rank,
        local_rank=rank,
        world_size=seat.nodes * s.nproc,
        local_world_size=s.nproc,
        group_rank=seat.node_rank,
        # The group's rank 0 hosts the store; torchft publishes it to the other groups.
        master_addr=seat.master_addr or s.advertise_host,
        master_port=master_port,
        replica_group=s.slot,
        num_replica_groups=s.num_slots,
        lighthouse=s.lighthouse,
        min_replicas=s.min_replicas,
        heartbeat=heartbeat_path(s, rank),
        lease_file=s.run_dir / lease_file.NAME,
        notice=s.run_dir / notice_file.NAME,
        job=s.job,
        node=s.node,
        replica_uuid=s.replica_uuid or None,
        join_timeout_ms=s.join_timeout_ms or None,
        config=s.config_path,
        advertise_host=s.advertise_host,
        bind_host=s.bind_host,
        attempt=attempt,
    )
    env = {**os.environ, **s.extra_env, **contract.to_environ(), "PYTHONUNBUFFERED": "1"}
    if not s.replica_uuid:  # not inherited from the daemon's own environment either
        env.pop(rank_vars.REPLICA_UUID, None)
    if s.metrics_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(s.metrics_dir)
    if s.python_path:
        env["PYTHONPATH"] = os.pathsep.join(
            [*s.python_path, *filter(None, [env.get("PYTHONPATH")])]
        )
    interface = interface_for(s.advertise_host)
    if interface is not None:  # peers on other hosts must reach gloo/NCCL at this address
        env.setdefault("GLOO_SOCKET_IFNAME", interface)
        env.setdefault("NCCL_SOCKET_IFNAME", interface)
    # torchrun's marker and systemd's notify socket belong to the daemon, not its ranks.
    for inherited in (
        rank_vars.TORCHELASTIC_RUN_ID,
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
    ):
        env.pop(inherited, None)
    env.setdefault("RUST_LOG", "warn")  # torchft's Rust manager logs every quorum at info
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // s.nproc)))
    return env
