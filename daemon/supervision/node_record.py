"""This node's record in etcd, ``nodes/<node_id>``, and its progress: what other nodes and
``phalanx status`` see of it.

The record is written when something in it changed (state, slot, address, ports,
pids, the failing health checks' reasons), never on a timer, and at most once every ``RECORD_GAP_S`` (changes within it
go out together, the latest values): every write is an event that every other
daemon's watch receives. What changes with training rather than with the node's
state lives apart, in its progress (``daemon.coordination.progress``): the step
(every step), the quorum size and the leader epoch (each time a node joins or leaves
the quorum, or the leader changes: in the record, one failure made every node write
and every node hear all N writes). Progress is written when it changed and the last
write is ``PROGRESS_EVERY_S`` old, at once on a new session and on the first step,
and at once when another node asks for everyone's progress (the job's
``asks/progress`` changed). Liveness is the lease's, not the record's.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from daemon import __version__
from daemon.accounting import Incident
from daemon.accounting.life_file import write_life
from daemon.config import DaemonConfig
from daemon.coordination.coordinator import Coordinator
from daemon.coordination.identity import machine_id
from daemon.coordination.progress import PROGRESS_EVERY_S
from daemon.node_state.status import NodeStatus
from daemon.supervision.health_gate import failing

_UNSET = object()
RECORD_GAP_S = 1.0
HOUR_S = 3600.0


def _nonzero(seconds: dict[str, float]) -> dict[str, float]:
    return {k: s for k, s in seconds.items() if s}


class NodeRecord:
    def __init__(
        self, cfg: DaemonConfig, coord: Coordinator, status: Callable[[], NodeStatus]
    ) -> None:
        self.cfg = cfg
        self.coord = coord
        self.status = status  # the node's published status: what the record is read from
        self.http_port = cfg.node.http_port  # the bound port (EtcdUpkeep.serving_http)
        self._written: dict[str, Any] = {}
        self._written_at = -RECORD_GAP_S
        self._progress: dict[str, Any] = {}  # as last written; empty: none since the session
        self._progress_at = 0.0
        self._reached = 0  # the highest step this node wrote as the job's reached step
        self._ask_answered: object = _UNSET  # the asks/progress value last answered
        self.machine = machine_id()  # tells this node's host from other machines'
        self._leading = False  # as the run directory's life file says (life_file.py)
        self._told: tuple[Incident, ...] = ()  # the closed incidents written to etcd
        self._hour: deque[tuple[float, dict[str, float]]] = deque()  # totals as written

    def build(self) -> dict[str, Any]:
        v = self.status()
        spanning = {"node_rank": v.node_rank, "generation": v.generation}
        ft = self.cfg.ft
        exchange: dict[str, Any] = {
            "semi_sync_method": ft.semi_sync_method,
            "sync_steps": ft.sync_steps,
        }
        if ft.num_fragments > 1:  # streaming: a fragment every sync_steps / num_fragments
            exchange["num_fragments"] = ft.num_fragments
        return {
            **(spanning if self.cfg.job.nodes_per_group > 1 else {}),
            **({"exchange": exchange} if ft.semi_sync_method != "none" else {}),
            "waiting_for": v.waiting_for,
            "spare": v.spare,  # every seat was held when it last looked
            "health": failing(v.health),  # the failing checks' reasons; {} when healthy
            "host": self.cfg.advertise_host,
            "machine": self.machine,
            "http_port": self.http_port,
            "pid": os.getpid(),
            "version": __version__,
            "group": v.slot,
            "state": v.state.value,
            "pids": list(v.pids),
        }

    def update(self, force: bool = False, last: bool = False) -> None:
        """Write the record if it changed and the last write is RECORD_GAP_S old (a later
        round writes what is held back), and the incidents that ended; `last`: the node
        leaves (its slot is given back next), so its open incident ends now. Raises the
        coordinator's errors."""
        record, now = self.build(), time.monotonic()
        if force or (record != self._written and now - self._written_at >= RECORD_GAP_S):
            self.coord.register(record)
            self._written, self._written_at = record, now
        v = self.status()
        if v.leader != self._leading:  # a lost life that led is a lost leader (life_file.py)
            write_life(self.cfg.run_dir, leading=v.leader)
            self._leading = v.leader
        log = v.incidents.left(time.time()) if last and v.incidents else v.incidents
        if log is not None and log.closed is not self._told:
            self._tell(log.closed)

    def _tell(self, closed: tuple[Incident, ...]) -> None:
        """Write the closed incidents not yet written (or changed since) to the job's
        record in etcd (incident_store.py); one that fails is tried again next round."""
        told = set(self._told)
        for incident in closed:
            if incident not in told:
                self.coord.incidents.write(incident)
        self._told = closed

    def update_progress(self, asked: object, epoch: int | None, epoch_step: int) -> None:
        """Write the progress if it is due, or if `asked` (the job's asks/progress value)
        is one not answered yet; raises the coordinator's errors. `epoch`, `epoch_step`:
        the leader epoch the ranks train under and our step when it began (fencing)."""
        v, now = self.status(), time.monotonic()
        progress = {
            "step": v.step, "participants": v.participants,
            "epoch": epoch, "epoch_step": epoch_step,
        }  # fmt: skip
        ask = asked is not None and asked != self._ask_answered
        stale = progress != self._progress and now - self._progress_at >= PROGRESS_EVERY_S
        began = self._progress.get("step") == 0 and v.step > 0  # status: training has begun
        if not (ask or stale or began or not self._progress):
            return
        # The job's reached step only ever rises (within a run): past what etcd held when
        # the ranks started and what this node wrote since, never below step 2. A group
        # that started over and trains again from step 1 leaves it as it was.
        reached = v.step > max(1, v.reached, self._reached)
        self.coord.put_progress({**progress, **self._time(v)}, reached=reached)
        self._progress, self._progress_at = progress, now
        if reached:
            self._reached = v.step
        self._ask_answered = asked

    def _time(self, v: NodeStatus) -> dict[str, Any]:
        """The node's seconds by activity since the daemon started and over the last hour
        (daemon.accounting), riding on a progress write that is made anyway: `phalanx
        status` sums them into the job's goodput. The hour's are the totals less those of
        the newest write at least an hour old (or the first, in a daemon's first hour)."""
        if v.ledger is None:
            return {}
        now = time.monotonic()
        totals = {a.value: round(s, 1) for a, s in v.ledger.totals(now).items()}
        kept = self._hour
        kept.append((now, totals))
        while len(kept) > 1 and kept[1][0] <= now - HOUR_S:
            kept.popleft()
        base = kept[0][1]
        hour = {k: round(s - base.get(k, 0.0), 1) for k, s in totals.items()}
        # Only what is not zero: the riders are most of what a progress write puts.
        return {"time": _nonzero(totals), "time_1h": _nonzero(hour)}

    def forget(self) -> None:
        """A new session: the next updates write the record and the step."""
        self._written, self._progress = {}, {}
