"""What a node shows the world: the HTTP server (/status, /metrics, /healthz, drain),
the Prometheus metrics, and `phalanx status`.
"""

from __future__ import annotations

from daemon.surfaces.metrics import DaemonMetrics
from daemon.surfaces.server import StatusServer
from daemon.surfaces.status import dumps, status_json, status_table

__all__ = ["DaemonMetrics", "StatusServer", "dumps", "status_json", "status_table"]
