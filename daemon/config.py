"""The daemon's view of a job file: its own sections plus the trainer's.

Sections owned here: ``job``, ``etcd``, ``node``, ``lighthouse``, ``metrics``. The
trainer sections are validated by ``trainer.config`` (torch-free), so a bad job
file is refused by the daemon before anything starts, with the same one-sentence
errors and exit code 2.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from trainer.config import (
    TRAINER_SECTIONS,
    ConfigError,
    Section,
    TrainerConfig,
    apply_overrides,
    check_trainer,
    read_job_file,
    spec_hash,
    validate,
)

# The sections every node of a job must share; `node`, `etcd` and `metrics` are per node.
SHARED_SECTIONS: tuple[str, ...] = ("job", "lighthouse", *TRAINER_SECTIONS)


class JobConfig(Section):
    name: str = Field(
        "phalanx",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Job name; etcd keys live under /phalanx/<name>/.",
    )
    min_replicas: int = Field(1, ge=1, description="Replica groups needed to commit a step.")
    max_replicas: int = Field(
        8, ge=1, description="Replica-group slots (also the data-sharding group count)."
    )


class EtcdConfig(Section):
    endpoints: list[str] = Field(
        default_factory=list,
        description="host:port of etcd members; empty starts an embedded etcd on loopback.",
    )
    ca_file: str | None = Field(
        None, description="CA bundle that signed the etcd server certificate."
    )
    cert_file: str | None = Field(None, description="Client certificate for etcd TLS client auth.")
    key_file: str | None = Field(None, description="Private key of cert_file.")
    user: str | None = Field(None, description="etcd user for password auth.")
    password_file: str | None = Field(None, description="File holding the etcd password.")
    lease_ttl_s: int = Field(
        10, ge=2, description="Session lease TTL; a dead node's claims vanish after it."
    )
    timeout_s: float = Field(5.0, gt=0, description="Deadline of each etcd request.")


class NodeConfig(Section):
    id: str | None = Field(None, description="Node id (default: the hostname).")
    nproc: int = Field(1, ge=1, description="Ranks on this node = the replica group's world size.")
    device: str = Field(
        "auto",
        pattern="^(auto|cpu|cuda)$",
        description="auto, cpu or cuda; overrides parallel.device for this node's ranks.",
    )
    http_port: int = Field(
        29520,
        ge=0,
        le=65535,
        description="Port of /metrics /healthz /readyz /status (0 = any free port).",
    )
    http_host: str = Field("0.0.0.0", description="Address the HTTP server binds.")
    advertise_host: str | None = Field(
        None, description="Name peers use to reach this node (default: the hostname)."
    )
    lighthouse_port: int = Field(
        29510,
        ge=0,
        le=65535,
        description="Port this node's torchft_lighthouse binds when it leads (0 = any free port).",
    )
    lighthouse_bind: str = Field(
        "0.0.0.0", description="Address the lighthouse binds when this node leads."
    )
    lighthouse_proxy_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Local port the ranks reach the lighthouse through (0 = any free port).",
    )
    run_dir: str | None = Field(
        None, description="Directory for this node's files (default runs/<job>/<node>)."
    )
    max_restarts: int = Field(
        5, ge=0, description="Group restarts allowed within restart_window_s before giving up."
    )
    restart_window_s: float = Field(600.0, gt=0, description="Window of the restart budget.")
    restart_backoff_s: float = Field(
        1.0, ge=0, description="First restart delay; doubles per restart up to 30 s."
    )
    hang_timeout_s: float = Field(
        300.0, gt=0, description="A rank with no progress for this long is hung."
    )
    drain_grace_s: float = Field(
        30.0, gt=0, description="SIGTERM: time for ranks to leave the quorum before SIGKILL."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for the ranks (e.g. NCCL_*)."
    )


class LighthouseConfig(Section):
    """Quorum settings every node's lighthouse must share (where it listens is per node)."""

    join_timeout_ms: int = Field(
        60000, ge=0, description="How long a quorum waits for heartbeating stragglers."
    )
    heartbeat_timeout_ms: int = Field(
        5000, ge=100, description="A replica silent this long is dead."
    )
    quorum_tick_ms: int = Field(
        100, ge=1, description="How often the lighthouse re-checks for a quorum."
    )


class MetricsConfig(Section):
    enabled: bool = Field(True, description="Serve /metrics (daemon and ranks).")


class DaemonConfig(TrainerConfig):
    """A whole job file: the trainer's sections plus the daemon's."""

    job: JobConfig = JobConfig()
    etcd: EtcdConfig = EtcdConfig()
    node: NodeConfig = NodeConfig()
    lighthouse: LighthouseConfig = LighthouseConfig()
    metrics: MetricsConfig = MetricsConfig()

    @property
    def node_id(self) -> str:
        return self.node.id or socket.gethostname()

    @property
    def run_dir(self) -> Path:
        return Path(self.node.run_dir or Path("runs") / self.job.name / self.node_id)

    @property
    def metrics_dir(self) -> Path:
        """PROMETHEUS_MULTIPROC_DIR of this node's ranks."""
        return self.run_dir / "metrics"

    @property
    def advertise_host(self) -> str:
        return self.node.advertise_host or socket.gethostname()

    def trainer_sections(self) -> dict[str, Any]:
        """The resolved trainer sections, as the ranks will read them."""
        data = self.model_dump(mode="json", by_alias=True, include=set(TRAINER_SECTIONS))
        if self.node.device != "auto":
            data["parallel"]["device"] = self.node.device
        return data

    def spec(self) -> dict[str, str]:
        """Per-section hashes of what every node must share."""
        dumped = self.model_dump(mode="json", by_alias=True)
        return {name: spec_hash(dumped, [name]) for name in SHARED_SECTIONS}


def load_daemon_config(
    path: str | Path, overrides: Sequence[str] = (), node_id: str | None = None
) -> DaemonConfig:
    """Read, override and validate a job file for the daemon; raise ConfigError on any problem."""
    data = apply_overrides(read_job_file(path), overrides)
    if node_id:
        data.setdefault("node", {})["id"] = node_id
    cfg = validate(DaemonConfig, data, str(path))
    try:  # the trainer's own cross-field checks, with this node's group size
        check_trainer(cfg, cfg.node.nproc)
    except ConfigError as e:
        message = str(e).replace("the replica group has", "node.nproc gives the replica group")
        raise ConfigError(f"{path}: {message}") from None
    etcd = cfg.etcd
    for field in ("ca_file", "cert_file", "key_file", "password_file"):
        value = getattr(etcd, field)
        if value and not Path(value).is_file():
            raise ConfigError(
                f"{path}: etcd.{field} {value} does not exist; point it at the file or remove it."
            )
    if bool(etcd.cert_file) != bool(etcd.key_file):
        raise ConfigError(
            f"{path}: etcd.cert_file and etcd.key_file go together; set both or neither."
        )
    if bool(etcd.user) != bool(etcd.password_file):
        raise ConfigError(
            f"{path}: etcd.user and etcd.password_file go together; set both or neither."
        )
    for endpoint in etcd.endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{path}: etcd.endpoints entry {endpoint!r} must be host:port.")
    if cfg.job.min_replicas > cfg.job.max_replicas:
        raise ConfigError(
            f"{path}: job.min_replicas ({cfg.job.min_replicas}) exceeds job.max_replicas ({cfg.job.max_replicas})."
        )
    return cfg


def read_password(cfg: DaemonConfig) -> str | None:
    if not cfg.etcd.password_file:
        return None
    return Path(cfg.etcd.password_file).read_text().strip()


def write_rank_config(cfg: DaemonConfig, path: Path) -> Path:
    """Write the resolved config the ranks read (PHALANX_CONFIG), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cfg.model_dump(mode="json", by_alias=True, exclude={"etcd"})
    data.update(cfg.trainer_sections())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path
