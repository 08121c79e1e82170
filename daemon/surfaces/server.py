"""The daemon's HTTP endpoints.

* ``/healthz``: liveness. 200 while the supervisor loop keeps ticking.
* ``/readyz``: readiness. 200 once registered in etcd with its group running on a healthy
  node; 503 otherwise, with the state and any failing health check's reason.
* ``/status``: this node's view as JSON.
* ``/metrics``: Prometheus text exposition (daemon and ranks).

Every answer is read from the node's published status (``daemon.node_state.status``): one
frozen value the supervisor swaps in each tick, never the view it is writing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from daemon.accounting import time_document
from daemon.health import HealthReport
from daemon.listener import Listener, bind
from daemon.node_state.states import State
from daemon.node_state.status import NodeStatus
from trainer import logs

STALE_LOOP_S = 10.0
MAX_CONNECTIONS = 128
BACKLOG = 128
HEAD_TIMEOUT_S = 5.0  # a request line and headers (a probe's arrive at once)
WRITE_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 8192


def _response(code: int, ctype: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
        f"Content-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def status_document(v: NodeStatus) -> dict[str, Any]:
    job = dataclasses.asdict(v.job) if v.job else None
    return {
        "node": v.node,
        "job": v.job_name,
        "state": v.state.value,
        "replica_group": v.slot,
        "node_rank": v.node_rank,  # this node's seat in its group (job.nodes_per_group)
        "generation": v.generation,  # the spanning group's generation the ranks run under
        "spare": v.spare,  # every seat was held when it last looked (seats.py)
        "leader": v.leader,
        "lighthouse": v.lighthouse,
        "etcd_up": v.etcd_up,
        "step": v.step,
        "loss": v.loss,
        "participants": v.participants,
        "restarts": dict(v.restarts),
        "heals": v.heals,
        "pids": list(v.pids),
        "standby_pids": list(v.standby_pids),
        "hang": {  # daemon/ranks/hang.py: seconds per phase, and each rank's phase now
            "timeouts": dict(v.hang_timeouts),
            "learned": v.hang_learned,
            "step_time_quantile_s": v.step_time_quantile_s,
            "step_time_median_s": v.step_time_median_s,
            "phases": list(v.phases),
        },
        "stragglers": dict(
            v.stragglers
        ),  # rank -> its compute over the other groups', while flagged
        "last_error": v.last_error,
        "waiting_for": v.waiting_for,
        "health": health_document(v.health),
        # Failing only a check every node fails (a shared volume): it trains regardless.
        "shared_fault": v.shared_fault,
        "ticks": v.ticks,
        # Where this daemon's time went (daemon.accounting), and its goodput.
        "time": None if v.ledger is None else time_document(v.ledger, time.monotonic()),
        # Its last incidents and the open one (recovered null), oldest first.
        "incidents": [i.shown() for i in (v.incidents.every() if v.incidents else ())],
        # Epoch s since etcd went unanswered, while that loss is not yet judged an outage
        # or a partition (an incident then); null while etcd answers.
        "etcd_lost": v.incidents.etcd_lost if v.incidents else None,
        "view": job,
    }


def health_document(report: HealthReport | None) -> dict[str, Any] | None:
    """The last health report for /status: ok, and each check's ok and reason by name."""
    if report is None:
        return None
    return {
        "ok": report.ok,
        "failed_in_a_row": report.failed_in_a_row,
        "checks": {c.name: {"ok": c.ok, "reason": c.reason} for c in report.checks},
    }


def readiness(v: NodeStatus) -> tuple[bool, str]:
    """Ready: registered, its group running, on a healthy node (an etcd outage does not
    unready a running group); else what it is doing and what is wrong, one per line."""
    ready = v.registered and v.state == State.RUNNING and v.healthy
    if ready:
        return True, "ready\n"
    lines = [v.state.value]
    if v.health is not None:
        lines += [f"unhealthy: {c.name}: {c.reason}" for c in v.health.failing]
    return False, "\n".join(lines) + "\n"


class StatusServer:
    """One event-loop thread serves every connection: an idle connection costs a socket,
    never a thread, so no number of clients can starve the supervisor loop, the etcd
    keepalive or the fence clock of the interpreter (a thread per connection did: 1,000
    idle probes made 1,021 threads, and their wake-up stalled the loop past its lease).

    Bounds, as etcd's and Kubernetes' servers keep them: at most ``MAX_CONNECTIONS`` open
    (at the cap, the oldest one still waiting for its request is closed to make room, so
    a flood of idle sockets cannot lock the kubelet's probe out); a request's head must
    arrive within ``HEAD_TIMEOUT_S`` and fit ``MAX_HEAD_BYTES``; a response must be taken
    within ``WRITE_TIMEOUT_S``; one request per connection (``Connection: close``).
    """

    def __init__(
        self,
        status: Callable[[], NodeStatus],
        host: str,
        port: int,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.status = status  # the node's published status (Supervisor.published)
        self.metrics = metrics
        # Bound here, so a taken port is an error of the constructor, as before.
        self.listener = Listener(
            bind(host, port, BACKLOG), self._connection, "http", MAX_HEAD_BYTES
        )
        self.port: int = self.listener.port
        self.waiting: dict[asyncio.StreamWriter, float] = {}  # no request yet: since when
        self.serving: set[asyncio.StreamWriter] = set()

    def start(self) -> StatusServer:
        self.listener.start()
        return self

    def stop(self) -> None:
        self.listener.stop()

    def _make_room(self) -> bool:
        """At the cap: close the connection that has waited longest for its request."""
        if len(self.waiting) + len(self.serving) < MAX_CONNECTIONS:
            return True
        if not self.waiting:
            return False
        oldest = min(self.waiting, key=self.waiting.__getitem__)
        del self.waiting[oldest]
        oldest.close()
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            return  # closed by the listener
        self.waiting[writer] = time.monotonic()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            if self.waiting.pop(writer, None) is None:
                return  # closed to make room meanwhile
            self.serving.add(writer)
            code, ctype, body = self._answer(head)
            response = _response(code, ctype, body)
            writer.write(
                response[: len(response) - len(body)] if head[:5] == b"HEAD " else response
            )
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # slow, silent or oversized: closed without an answer
        except ConnectionError:
            pass  # a scraper that hung up mid-response is routine
        except Exception as e:  # one structured event, never a traceback in the JSON log
            peer = writer.get_extra_info("peername")
            logs.get().warning(
                "http_error",
                client=peer[0] if peer else None,
                error=f"{type(e).__name__}: {e}",
            )
        finally:
            self.waiting.pop(writer, None)
            self.serving.discard(writer)

    def _answer(self, head: bytes) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, text, b"bad request\n"
        method, target = parts[0], parts[1].decode("ascii", "replace")
        if method not in (b"GET", b"HEAD"):
            return 405, text, b"only GET\n"
        return self.route(target.split("?", 1)[0])

    def route(self, path: str) -> tuple[int, str, bytes]:
        v = self.status()  # one tick's whole, however long the answer takes
        text = "text/plain; charset=utf-8"
        if path == "/healthz":
            fresh = time.monotonic() - v.last_tick < STALE_LOOP_S
            return (200, text, b"ok\n") if fresh else (503, text, b"supervisor loop stalled\n")
        if path == "/readyz":
            ready, why = readiness(v)
            return (200 if ready else 503), text, why.encode()
        if path == "/status":
            body = json.dumps(status_document(v), default=str, indent=2).encode()
            return 200, "application/json", body
        if path == "/metrics" and self.metrics is not None:
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics()
        return 404, text, b"not found\n"
