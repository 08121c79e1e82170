"""The daemon's HTTP endpoints.

* ``/healthz``: liveness. 200 while the supervisor loop keeps ticking.
* ``/readyz``: readiness. 200 once registered in etcd with its group running.
* ``/status``: this node's view as JSON.
* ``/metrics``: Prometheus text exposition (daemon and ranks).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from daemon.node_state.view import State
from daemon.supervision.supervisor import Supervisor
from trainer import logs

STALE_LOOP_S = 10.0


def status_document(sup: Supervisor) -> dict[str, Any]:
    v = sup.view
    job = dataclasses.asdict(v.job) if v.job else None
    return {
        "node": sup.cfg.node_id,
        "job": sup.cfg.job.name,
        "state": v.state.value,
        "replica_group": v.slot,
        "leader": v.leader,
        "lighthouse": v.lighthouse,
        "etcd_up": v.etcd_up,
        "step": v.step,
        "loss": v.loss,
        "participants": v.participants,
        "restarts": v.restarts,
        "heals": v.heals,
        "pids": v.pids,
        "standby_pids": v.standby_pids,
        "last_error": v.last_error,
        "waiting_for": v.waiting_for,
        "ticks": v.ticks,
        "view": job,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """A scraper that hung up mid-response is routine; anything else is one structured event
        (the stdlib would print a traceback into the daemon's JSON log)."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            return
        logs.get().warning(
            "http_error", client=client_address[0], error=f"{type(error).__name__}: {error}"
        )


class StatusServer:
    def __init__(
        self, sup: Supervisor, host: str, port: int, metrics: Callable[[], bytes] | None = None
    ) -> None:
        self.sup = sup
        self.metrics = metrics
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, ctype, body = server.route(self.path.split("?", 1)[0])
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = _Server((host, port), Handler)
        self.port: int = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="http")

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def route(self, path: str) -> tuple[int, str, bytes]:
        v = self.sup.view
        text = "text/plain; charset=utf-8"
        if path == "/healthz":
            fresh = time.monotonic() - v.last_tick < STALE_LOOP_S
            return (200, text, b"ok\n") if fresh else (503, text, b"supervisor loop stalled\n")
        if path == "/readyz":
            ready = (
                v.registered and v.state == State.RUNNING
            )  # etcd outages do not unready a running group
            return (200, text, b"ready\n") if ready else (503, text, f"{v.state.value}\n".encode())
        if path == "/status":
            body = json.dumps(status_document(self.sup), default=str, indent=2).encode()
            return 200, "application/json", body
        if path == "/metrics" and self.metrics is not None:
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics()
        return 404, text, b"not found\n"
