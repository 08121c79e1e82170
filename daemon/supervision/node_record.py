"""This node's record in etcd, ``nodes/<node_id>``: what other nodes and ``phalanx status``
see of it.

It is written when anything but the step changed, and for a new step at most every
``RECORD_EVERY_S``: the step moves every training step, and each write is a request
to etcd and a change every other daemon's watch hears about.
"""

from __future__ import annotations

import os
import time
from typing import Any

from daemon import __version__
from daemon.config import DaemonConfig
from daemon.coordination.coordinator import Coordinator
from daemon.coordination.identity import machine_id
from daemon.node_state.view import NodeView

RECORD_EVERY_S = 2.0


class NodeRecord:
    def __init__(self, cfg: DaemonConfig, coord: Coordinator, view: NodeView) -> None:
        self.cfg = cfg
        self.coord = coord
        self.view = view
        self.http_port = cfg.node.http_port  # the bound port (EtcdUpkeep.serving_http)
        self._written: dict[str, Any] = {}
        self._written_at = 0.0
        self.machine = machine_id()  # tells this node's host from other machines'

    def build(self, epoch: int | None, epoch_step: int) -> dict[str, Any]:
        v = self.view
        return {
            "host": self.cfg.advertise_host,
            "machine": self.machine,
            "http_port": self.http_port,
            "pid": os.getpid(),
            "version": __version__,
            "group": v.slot,
            "state": v.state.value,
            "step": v.step,
            "participants": v.participants,
            "pids": v.pids,
            "epoch": epoch,
            "epoch_step": epoch_step,
        }

    def update(self, epoch: int | None, epoch_step: int, force: bool = False) -> None:
        """Write the record if it is due; raises the coordinator's errors."""
        record, now = self.build(epoch, epoch_step), time.monotonic()
        if force or self._due(record, now):
            self.coord.register(record)
            self._written, self._written_at = record, now

    def forget(self) -> None:
        """A new session: the next update writes whatever changed."""
        self._written = {}

    def _due(self, record: dict[str, Any], now: float) -> bool:
        if {k: x for k, x in record.items() if k != "step"} != {
            k: x for k, x in self._written.items() if k != "step"
        }:
            return True
        return record != self._written and now - self._written_at > RECORD_EVERY_S
