"""Loading a job file for the daemon: read, override, validate, cross-check; and the
resolved config a node writes for its ranks."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from daemon.config.etcd_settings import NODE_ID, NODE_ID_RULE, check_etcd_job
from daemon.config.sections import MAX_DRAIN_GRACE_S, PORT_FIELDS, DaemonConfig
from trainer.config import (
    ConfigError,
    apply_overrides,
    read_job_file,
    validate,
)
from trainer.config.checks import check_trainer
from trainer.config.limits import shorten


def check_node_id(node_id: str | None, source: str) -> None:
    """Refuse a node id that cannot be an etcd key segment and a directory name.

    ``node_id`` is the id given by ``source`` (``--node-id``, ``node.id``), or
    None for the default, the hostname.
    """
    value = node_id or socket.gethostname()
    if NODE_ID.fullmatch(value):
        return
    if node_id:
        raise ConfigError(f"{source} {shorten(value)} {NODE_ID_RULE}; choose another node id.")
    raise ConfigError(
        f"the hostname {shorten(value)} is not a valid node id (it {NODE_ID_RULE}); "
        "set one with --node-id or node.id."
    )


def _check_node(cfg: DaemonConfig, path: str | Path) -> None:
    node = cfg.node
    if node.drain_grace_s > MAX_DRAIN_GRACE_S:
        raise ConfigError(
            f"{path}: node.drain_grace_s ({node.drain_grace_s:g}) exceeds {MAX_DRAIN_GRACE_S:g} s, "
            "the most the shipped systemd unit and Kubernetes pod leave the daemon to drain "
            f"before they kill it; lower it to {MAX_DRAIN_GRACE_S:g} or less."
        )
    taken: dict[int, str] = {}
    for field in PORT_FIELDS:
        port = getattr(node, field)
        if port and port in taken:
            raise ConfigError(
                f"{path}: node.{taken[port]} and node.{field} are both {port}; "
                "give each its own port (0 = any free port)."
            )
        taken[port] = field


def load_daemon_config(
    path: str | Path, overrides: Sequence[str] = (), node_id: str | None = None
) -> DaemonConfig:
    """Read, override and validate a job file for the daemon; raise ConfigError on any problem."""
    data = apply_overrides(read_job_file(path), overrides)
    if node_id:
        check_node_id(node_id, "--node-id")
        data.setdefault("node", {})["id"] = node_id
    cfg = validate(DaemonConfig, data, str(path))
    try:
        check_node_id(cfg.node.id, "node.id")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if cfg.node.id else str(e)) from None
    _check_node(cfg, path)
    nodes = cfg.job.nodes_per_group
    try:  # the trainer's own cross-field checks, with the group's size
        check_trainer(cfg, cfg.node.nproc * nodes)
    except ConfigError as e:
        source = "node.nproc" if nodes == 1 else f"node.nproc x job.nodes_per_group ({nodes})"
        message = str(e).replace("the replica group has", f"{source} gives the replica group")
        raise ConfigError(f"{path}: {message}") from None
    check_etcd_job(cfg, path)
    if cfg.job.min_replicas > cfg.job.max_replicas:
        raise ConfigError(
            f"{path}: job.min_replicas ({cfg.job.min_replicas}) exceeds job.max_replicas ({cfg.job.max_replicas})."
        )
    return cfg


def write_rank_config(cfg: DaemonConfig, path: Path) -> Path:
    """Write the resolved config the ranks read (PHALANX_CONFIG), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cfg.model_dump(mode="json", by_alias=True, exclude={"etcd"})
    data.update(cfg.trainer_sections())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path
