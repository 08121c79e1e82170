"""The environment contract between a launcher (the daemon or torchrun) and a rank.

torchrun's names (RANK, WORLD_SIZE, MASTER_ADDR, ...) so that ``torchrun -m trainer``
works without the daemon, plus the replica-group variables torchft uses and a few
Phalanx ones. Both sides are here: the daemon writes a :class:`RankEnv` with
:meth:`RankEnv.to_environ` (``daemon/ranks/spec.py``), a rank reads it back with
:meth:`RankEnv.from_environ`; each variable's name is spelled once, below
(``tests/unit/test_rank_env_contract.py``). Torch-free.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.config.sections import ConfigError

# torchrun's (torch.distributed.run) variables.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"  # the node's rank among the group's nodes
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent, never by the daemon
# torchft's.
REPLICA_GROUP_ID = "REPLICA_GROUP_ID"
NUM_REPLICA_GROUPS = "NUM_REPLICA_GROUPS"
TORCHFT_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"
# Phalanx's.
CONFIG = "PHALANX_CONFIG"  # the job file the daemon resolved (trainer/__main__.py's default)
MIN_REPLICAS = "PHALANX_MIN_REPLICAS"
HEARTBEAT = "PHALANX_HEARTBEAT"
LEASE_FILE = "PHALANX_LEASE_FILE"
NOTICE = "PHALANX_NOTICE"
JOB = "PHALANX_JOB"
NODE = "PHALANX_NODE"
ADVERTISE_HOST = "PHALANX_ADVERTISE_HOST"
BIND_HOST = "PHALANX_BIND_HOST"
ATTEMPT = "PHALANX_ATTEMPT"  # the group's start this rank belongs to, from 1
REPLICA_UUID = "PHALANX_REPLICA_UUID"
JOIN_TIMEOUT_MS = "PHALANX_JOIN_TIMEOUT_MS"


@dataclass(frozen=True)
class RankEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    replica_group: int = 0
    num_replica_groups: int = 1
    lighthouse: str | None = None  # TORCHFT_LIGHTHOUSE; unset = fault tolerance off
    min_replicas: int = 1
    heartbeat: Path | None = None  # a file this rank touches on progress
    lease_file: Path | None = (
        None  # the daemon's lease confirmations (trainer.checkpoint.lease_fence)
    )
    job: str | None = None
    node: str | None = None
    notice: Path | None = None  # PHALANX_NOTICE: the daemon's word that the lighthouse moved
    torchelastic: bool = False  # launched by torchrun (its agent hosts the store)
    # PHALANX_REPLICA_UUID: the uuid of the group's torchft replica id, kept by the daemon
    # across the group's restarts; unset: torchft's fresh one per process.
    replica_uuid: str | None = None
    # PHALANX_JOIN_TIMEOUT_MS: the lighthouse's lighthouse.join_timeout_ms, so a rank can
    # say when a quorum waited it out (trainer.ft.quorum_watch); unset: it cannot tell.
    join_timeout_ms: int | None = None
    group_rank: int = 0  # GROUP_RANK: this node's place among its group's nodes
    config: Path | None = None  # PHALANX_CONFIG
    advertise_host: str | None = None  # PHALANX_ADVERTISE_HOST (see advertise_host())
    bind_host: str | None = None  # PHALANX_BIND_HOST (see bind_host())
    attempt: int | None = None  # PHALANX_ATTEMPT

    @property
    def fault_tolerant(self) -> bool:
        return bool(self.lighthouse)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        env = os.environ if environ is None else environ

        def integer(name: str, default: int, minimum: int = 0) -> int:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(
                    f"environment variable {name}={raw!r} must be an integer."
                ) from None
            if value < minimum:
                raise ConfigError(
                    f"environment variable {name}={value} must be at least {minimum}."
                )
            return value

        world = integer(WORLD_SIZE, 1, 1)
        rank = integer(RANK, 0)
        if rank >= world:
            raise ConfigError(f"environment variable RANK={rank} must be below WORLD_SIZE={world}.")
        groups = integer(NUM_REPLICA_GROUPS, 1, 1)
        group = integer(REPLICA_GROUP_ID, 0)
        if group >= groups:
            raise ConfigError(
                f"environment variable REPLICA_GROUP_ID={group} must be below NUM_REPLICA_GROUPS={groups}."
            )
        port = integer(MASTER_PORT, 0)
        lighthouse = env.get(TORCHFT_LIGHTHOUSE) or None
        if lighthouse and not env.get(MASTER_ADDR):
            raise ConfigError(
                "TORCHFT_LIGHTHOUSE is set but MASTER_ADDR/MASTER_PORT are not; torchft needs the group's store."
            )
        heartbeat, lease_file = env.get(HEARTBEAT), env.get(LEASE_FILE)
        config = env.get(CONFIG)
        return cls(
            rank=rank,
            local_rank=integer(LOCAL_RANK, rank),
            world_size=world,
            local_world_size=integer(LOCAL_WORLD_SIZE, world, 1),
            master_addr=env.get(MASTER_ADDR) or None,
            master_port=port or None,
            replica_group=group,
            num_replica_groups=groups,
            lighthouse=lighthouse,
            min_replicas=integer(MIN_REPLICAS, 1, 1),
            heartbeat=Path(heartbeat) if heartbeat else None,
            lease_file=Path(lease_file) if lease_file else None,
            job=env.get(JOB) or None,
            node=env.get(NODE) or None,
            notice=Path(env[NOTICE]) if env.get(NOTICE) else None,
            torchelastic=bool(env.get(TORCHELASTIC_RUN_ID)),
            replica_uuid=replica_uuid(env.get(REPLICA_UUID)),
            join_timeout_ms=integer(JOIN_TIMEOUT_MS, 0) if env.get(JOIN_TIMEOUT_MS) else None,
            group_rank=integer(GROUP_RANK, 0),
            config=Path(config) if config else None,
            advertise_host=env.get(ADVERTISE_HOST) or None,
            bind_host=env.get(BIND_HOST) or None,
            attempt=integer(ATTEMPT, 0) if env.get(ATTEMPT) else None,
        )

    def to_environ(self) -> dict[str, str]:
        """The variables :meth:`from_environ` reads back as this value (the daemon's side;
        unset fields are left out). TORCHELASTIC_RUN_ID is torchrun's, never written."""
        optional: dict[str, object | None] = {
            MASTER_ADDR: self.master_addr,
            MASTER_PORT: self.master_port,
            TORCHFT_LIGHTHOUSE: self.lighthouse,
            HEARTBEAT: self.heartbeat,
            LEASE_FILE: self.lease_file,
            NOTICE: self.notice,
            JOB: self.job,
            NODE: self.node,
            REPLICA_UUID: self.replica_uuid,
            JOIN_TIMEOUT_MS: self.join_timeout_ms,
            CONFIG: self.config,
            ADVERTISE_HOST: self.advertise_host,
            BIND_HOST: self.bind_host,
            ATTEMPT: self.attempt,
        }
        return {
            RANK: str(self.rank),
            LOCAL_RANK: str(self.local_rank),
            WORLD_SIZE: str(self.world_size),
            LOCAL_WORLD_SIZE: str(self.local_world_size),
            GROUP_RANK: str(self.group_rank),
            REPLICA_GROUP_ID: str(self.replica_group),
            NUM_REPLICA_GROUPS: str(self.num_replica_groups),
            MIN_REPLICAS: str(self.min_replicas),
            **{name: str(value) for name, value in optional.items() if value is not None},
        }


def replica_id(group: int) -> str:
    """The torchft replica id of replica group `group` (zero-padded: torchft orders a
    quorum's groups by it, so the lowest id sorts first); torchft appends ``:<uuid>``."""
    return f"phalanx_group_{group:05d}"


def replica_uuid(raw: str | None) -> str | None:
    """PHALANX_REPLICA_UUID, checked: lowercase hex and dashes (a uuid), or unset."""
    if not raw:
        return None
    if not re.fullmatch(r"[0-9a-f-]{8,64}", raw):
        raise ConfigError(
            f"environment variable PHALANX_REPLICA_UUID={raw!r} must be a uuid (lowercase hex "
            "and dashes); unset it to let torchft pick one."
        )
    return raw


def advertise_host() -> str:
    return os.environ.get(ADVERTISE_HOST) or socket.gethostname()


def bind_host() -> str:
    """The address this rank's listeners bind: ``PHALANX_BIND_HOST`` (the daemon's
    node.bind_host), else the address the advertised name resolves to."""
    explicit = os.environ.get(BIND_HOST)
    if explicit:
        return explicit
    infos = socket.getaddrinfo(advertise_host(), None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])
