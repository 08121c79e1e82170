"""The daemon's view of a job file: its own sections plus the trainer's.

Sections owned here: ``job``, ``etcd``, ``node``, ``lighthouse``, ``hang``, ``metrics``,
``health``. The trainer sections are validated by ``trainer.config`` (torch-free), so a
bad job file is refused by the daemon before anything starts, with the same one-sentence
errors and exit code 2.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from daemon.config.detection import MAX_WAIT_S, HangConfig, HealthConfig
from daemon.config.netif import resolve
from trainer.config import (
    TRAINER_SECTIONS,
    Section,
    TrainerConfig,
    spec_hash,
)

# The sections every node of a job must share; `node`, `etcd`, `hang`, `metrics` and
# `health` are per node.
SHARED_SECTIONS: tuple[str, ...] = ("job", "lighthouse", *TRAINER_SECTIONS)

# What the shipped service definitions give a stopping daemon before SIGKILL:
# ops/systemd/phalanx.service TimeoutStopSec=60s and ops/k8s/statefulset.yaml
# terminationGracePeriodSeconds: 60 (a unit test parses both). After
# node.drain_grace_s the daemon still kills its ranks and stops its lighthouse and
# etcd, so the drain grace leaves STOP_MARGIN_S of that time.
STOP_MARGIN_S = 15.0
MAX_DRAIN_GRACE_S = 45.0

MAX_WAIT_MS = 86_400_000  # MAX_WAIT_S (daemon.config.detection) in milliseconds

PORT_FIELDS: tuple[str, ...] = ("http_port", "lighthouse_port", "lighthouse_proxy_port")


class JobConfig(Section):
    name: str = Field(
        "phalanx",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=63,
        description="Job name; etcd keys live under /phalanx/<name>/. At most 63 characters: "
        "letters, digits, '.', '_' and '-', starting with a letter or digit.",
    )
    min_replicas: int = Field(1, ge=1, description="Replica groups needed to commit a step.")
    max_replicas: int = Field(
        8, ge=1, description="Replica-group slots (also the data-sharding group count)."
    )
    nodes_per_group: int = Field(
        1,
        ge=1,
        le=1024,
        description="Nodes in each replica group: its world size is nodes_per_group x "
        "node.nproc, ranks numbered node by node as torchrun does. Every node needs the same "
        "node.nproc; a node that finds no free seat waits as a spare.",
    )
    on_no_state: Literal["restart", "stop"] = Field(
        "restart",
        description="When every group with state is gone and no checkpoint can be loaded, the "
        "job can only train again from step 0 (it logs job_started_over and counts "
        "phalanx_job_started_over_total). 'restart' trains again; 'stop' stops the node when "
        "it sees that step 1 (within a quarter of a second), exit 1, every start after that "
        'too, until the job\'s reached step is cleared (docs/operations.md, "Starting over").',
    )


class EtcdConfig(Section):
    endpoints: list[str] = Field(
        default_factory=list,
        description="host:port (or http:// or https://host:port, no user:password@) of etcd "
        "members; empty starts an embedded etcd on loopback.",
    )
    ca_file: str | None = Field(
        None, description="CA bundle that signed the etcd server certificate."
    )
    cert_file: str | None = Field(None, description="Client certificate for etcd TLS client auth.")
    key_file: str | None = Field(None, description="Private key of cert_file.")
    user: str | None = Field(None, description="etcd user for password auth.")
    password_file: str | None = Field(
        None,
        description="File holding the etcd password; needs TLS (ca_file or https://) unless "
        "every endpoint is on loopback or allow_insecure_password is set.",
    )
    allow_insecure_password: bool = Field(
        False, description="Send the etcd password over plain HTTP to a remote etcd (not advised)."
    )
    lease_ttl_s: int = Field(
        10,
        ge=2,
        le=300,
        description="Session lease TTL, 2 to 300 s; a dead node's claims vanish after it.",
    )
    timeout_s: float = Field(
        5.0, gt=0, description="Deadline of each etcd request; must be below lease_ttl_s."
    )
    leader_ttl_s: int = Field(
        1,
        ge=1,
        le=300,
        description="The leader key's own lease TTL, at most lease_ttl_s: a dead leader is "
        "replaced after it. etcd grants at least 1.5 election timeouts: 1 s needs "
        "--election-timeout of 750 ms or less (Phalanx's etcds run so); etcd's default "
        "1000 ms makes it 2 s.",
    )


class NodeConfig(Section):
    id: str | None = Field(
        None,
        description="Node id (default: the hostname): at most 63 characters, letters, digits, "
        "'.', '_' and '-', starting with a letter or digit.",
    )
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
        description="Port of /metrics /healthz /readyz /status (0 = any free port); "
        "must be free and differ from the node's other ports.",
    )
    advertise_host: str | None = Field(
        None,
        description="Name or address peers use to reach this node (default: the hostname; "
        "where that resolves to loopback and etcd is on another machine, this machine's "
        "address on the route to etcd). A loopback address with a remote etcd is refused.",
    )
    bind_host: str | None = Field(
        None,
        description="Address every listener other hosts reach binds: the HTTP server, the "
        "lighthouse and the ranks' store, torchft manager and healing server (default: the "
        'address node.advertise_host resolves to; "0.0.0.0" listens on every interface).',
    )
    http_host: str | None = Field(
        None, description="Address the HTTP server binds (default: node.bind_host)."
    )
    lighthouse_port: int = Field(
        29510,
        ge=0,
        le=65535,
        description="Port this node's torchft_lighthouse binds when it leads (0 = any free port); "
        "must differ from the node's other ports.",
    )
    lighthouse_bind: str | None = Field(
        None, description="Address the lighthouse binds when it leads (default: node.bind_host)."
    )
    lighthouse_proxy_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Local port the ranks reach the lighthouse through (0 = any free port); "
        "must be free and differ from the node's other ports.",
    )
    run_dir: str | None = Field(
        None,
        description="Directory for this node's files (default runs/<job>/<node>); must be "
        "writable, and one daemon at a time holds it (daemon.lock).",
    )
    max_restarts: int = Field(
        5, ge=0, description="Group restarts allowed within restart_window_s before giving up."
    )
    restart_window_s: float = Field(
        600.0, gt=0, le=MAX_WAIT_S, description="Window of the restart budget."
    )
    restart_backoff_s: float = Field(
        0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="Delay before a group restart; doubles per restart within restart_window_s "
        "up to 30 s. 0 restarts at once (a standby takes over); max_restarts bounds a crash loop.",
    )
    standby: bool = Field(
        True,
        description="Keep a pre-started standby process per local rank (torch imported, forked "
        "from one warm zygote per node) that replaces a failed rank at once; false saves their "
        "memory (a few hundred MB).",
    )
    announce_failures: bool = Field(
        True,
        description="When this node's ranks fail or hang, say so through etcd (failed/<group>) "
        "so every other group's ranks abandon the step at once, instead of the next quorum "
        "waiting lighthouse.join_timeout_ms for a group blocked further round the ring; false "
        "only to measure the job without it (bench/ring_failover.py).",
    )
    hang_timeout_s: float = Field(
        300.0,
        ge=5,
        le=86400,
        description="A rank with no progress for this long is hung (5 s to 86400 s): the "
        "ceiling of the learned step timeout and the default of every other phase's (see "
        "[hang]).",
    )
    wait_timeout_s: float = Field(
        0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="Give up (exit 1, so the service manager restarts it) after waiting this long "
        "for a lighthouse and job.min_replicas groups; 0 waits forever (reported every 30 s).",
    )
    drain_grace_s: float = Field(
        30.0,
        gt=0,
        description="SIGTERM: time for ranks to leave the quorum before SIGKILL; at most "
        f"{MAX_DRAIN_GRACE_S:g} s, so the daemon is done {STOP_MARGIN_S:g} s before the shipped "
        "systemd unit (TimeoutStopSec) and pod (terminationGracePeriodSeconds) kill it.",
    )
    straggler_drain: bool = Field(
        False,
        description="Drain this node (as SIGTERM does: it leaves the job and exits 0) when one "
        "of its ranks is a persistent straggler (ft.straggler_factor), so the other groups stop "
        "waiting for it.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for the ranks (e.g. NCCL_*)."
    )


class LighthouseConfig(Section):
    """Quorum settings every node's lighthouse must share (where it listens is per node)."""

    join_timeout_ms: int = Field(
        10000,
        ge=0,
        le=MAX_WAIT_MS,
        description="How long a new quorum waits for groups that heartbeat but have not asked "
        "to join (at most 86400000, one day); keep it above the longest step including a heal, or with three or more "
        "groups a late one is left out, heals, and leaves out the next (torchft: 60000). A "
        "dead group stops heartbeating, so it is waited for only heartbeat_timeout_ms.",
    )
    heartbeat_timeout_ms: int = Field(
        500,
        ge=100,
        le=MAX_WAIT_MS,
        description="A replica silent this long is dead (groups heartbeat every 100 ms); "
        "torchft's default is 5000.",
    )
    quorum_tick_ms: int = Field(
        20, ge=1, le=MAX_WAIT_MS, description="How often the lighthouse re-checks for a quorum."
    )


class MetricsConfig(Section):
    enabled: bool = Field(True, description="Serve /metrics (daemon and ranks).")


class DaemonConfig(TrainerConfig):
    """A whole job file: the trainer's sections plus the daemon's."""

    job: JobConfig = JobConfig()
    etcd: EtcdConfig = EtcdConfig()
    node: NodeConfig = NodeConfig()
    lighthouse: LighthouseConfig = LighthouseConfig()
    hang: HangConfig = HangConfig()
    metrics: MetricsConfig = MetricsConfig()
    health: HealthConfig = HealthConfig()
    _resolved_bind_host: str | None = PrivateAttr(None)
    _chosen_advertise_host: str | None = PrivateAttr(None)

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
        """node.advertise_host, else the address :meth:`advertising` set, else the hostname."""
        return self.node.advertise_host or self._chosen_advertise_host or socket.gethostname()

    @property
    def bind_host(self) -> str:
        """node.bind_host, else the address the advertised name resolves to (OSError if
        it does not); :meth:`pin_bind_host` resolves it once for a daemon's life."""
        return self.node.bind_host or self._resolved_bind_host or resolve(self.advertise_host)

    @property
    def http_host(self) -> str:
        return self.node.http_host or self.bind_host

    @property
    def lighthouse_host(self) -> str:
        return self.node.lighthouse_bind or self.bind_host

    def advertising(self, address: str) -> DaemonConfig:
        """A copy that advertises `address` while node.advertise_host is unset (the
        address ``daemon.config.advertise`` chose in place of a loopback hostname)."""
        pinned = self.model_copy()
        pinned._chosen_advertise_host = address
        return pinned

    def pin_bind_host(self) -> DaemonConfig:
        """A copy whose default bind address is resolved now (OSError when the name does not
        resolve): a name that resolves differently later must not move the listeners."""
        pinned = self.model_copy()
        pinned._resolved_bind_host = self.bind_host
        return pinned

    def trainer_sections(self) -> dict[str, Any]:
        """The resolved trainer sections, as the ranks will read them."""
        data = self.model_dump(mode="json", by_alias=True, include=set(TRAINER_SECTIONS))
        if self.node.device != "auto":
            data["parallel"]["device"] = self.node.device
        return data

    def spec(self) -> dict[str, str]:
        """Per-section hashes of what every node must share."""
        dumped = self.model_dump(mode="json", by_alias=True)
        spec = {name: spec_hash(dumped, [name]) for name in SHARED_SECTIONS}
        if self.job.nodes_per_group > 1:  # a group's nodes split its layout evenly
            spec["node.nproc"] = str(self.node.nproc)
            spec["job.nodes_per_group"] = str(self.job.nodes_per_group)  # for phalanx status
        return spec
