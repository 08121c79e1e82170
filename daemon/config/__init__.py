"""The job file as the daemon reads it: its own sections (job, etcd, node, lighthouse,
hang, metrics, health) beside the trainer's, loading with overrides and cross-checks, the etcd
settings' one validation, the preflight checks of the machine, the network interface
of an address, and the generated configuration reference. Nothing here starts anything.
"""

from __future__ import annotations

from daemon.config.detection import HangConfig, HealthConfig
from daemon.config.etcd_settings import check_etcd_settings, read_password, split_endpoint
from daemon.config.job_file import check_node_id, load_daemon_config, write_rank_config
from daemon.config.netif import interface_for
from daemon.config.preflight import LOCK_FILE, cuda_present, node_device
from daemon.config.sections import (
    MAX_DRAIN_GRACE_S,
    STOP_MARGIN_S,
    DaemonConfig,
    LighthouseConfig,
    NodeConfig,
)

__all__ = [
    "LOCK_FILE",
    "MAX_DRAIN_GRACE_S",
    "STOP_MARGIN_S",
    "DaemonConfig",
    "HangConfig",
    "HealthConfig",
    "LighthouseConfig",
    "NodeConfig",
    "check_etcd_settings",
    "check_node_id",
    "cuda_present",
    "interface_for",
    "load_daemon_config",
    "node_device",
    "read_password",
    "split_endpoint",
    "write_rank_config",
]
