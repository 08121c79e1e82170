"""A spanning group's member asked for a sign of life before its seat is given to a spare.

A node that lost power keeps its seat (``seats/<gid>/<rank>``, on its session lease)
until etcd expires the lease: ``etcd.lease_ttl_s``, 10 s by default, during which its
group cannot start again, though a spare waits. The group's surviving node notices
first, in one of two ways:

* its ranks fail at once (the dead node's host reset their links) and it waits on the
  dead member to start the next generation (``spanning.SpanningGroup.blocker``);
* or its ranks go still: blocked in a collective with a node that vanished without a
  word, or in the group's quorum that member never joins. Running ranks whose
  heartbeats have all been still for :data:`SILENCE_S` make the node ask about every
  other member of its group.

It then asks every daemon for its progress (the ``asks/progress`` put of
``daemon.coordination.progress``, which every daemon answers within a round whatever
its state) and reads who answered:

* the member answered: it is alive and reaches etcd (a split inside the group, a
  member slow to stop its ranks, a long step), so this node waits on it as before;
* its daemon's status port refuses two connections in a row, 0.1 s apart
  (``daemon.host_probe``: its host is up and no daemon listens, so its ranks died with
  it): the seat is revoked as below, without waiting out the ask. A port that answers
  nothing may be a split inside the group as well as a lost host: it is asked about;
* no answer within :data:`PROBE_WAIT_S` (:data:`SILENT_WAIT_S` while its status port
  answers nothing either): the member's seat is deleted, if the member
  still holds it (``Coordinator.revoke_seat``); our ranks stop because the group's
  seats changed (``SpanningGroup.must_stop``), and a spare, or the member itself once
  back, claims the seat. A member alive behind a partition from etcd loses nothing it
  could use: it is fenced by its own lease clock, its ranks stop when the group's
  seats change, and it finds its seat gone when etcd answers again (``Seats.holds``).

One ask per member and generation waited on, or per silence; nothing is sent while no
member holds a group up and the ranks beat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from daemon.coordination import Coordinator
from daemon.coordination.progress import Progress
from daemon.host_probe import HostProbe
from trainer import logs

PROBE_WAIT_S = 1.5  # a live daemon answers within a round or two (0.25 s each)
# The wait for a member whose status port answers nothing as well (its host lost, or cut
# from us): an answer through etcd came in 4-260 ms in the suite's splits, and the longer
# a lost host keeps its seat, the longer its group and the others wait for it.
SILENT_WAIT_S = 0.75
SILENCE_S = 2.0  # running ranks this long without a heartbeat: their group's members are asked

Attempt = Callable[[str, Callable[[], Any]], tuple[bool, Any]]
WAITING_PHASES = frozenset({"step", "quorum", "heal"})  # where a silent member blocks us


def too_still(
    quiet_since: float | None, now: float, phases: Sequence[str], step_median_s: float | None
) -> bool:
    """Whether running ranks have been still long enough to ask about their group's
    members: every rank in a phase a dead member blocks (a step's collectives, the
    group's quorum, a heal; not its build, a load, a save or an evaluation) and silent
    for :data:`SILENCE_S`, or twice the median step where steps are longer, so a job of
    long steps does not ask at every step."""
    if quiet_since is None or not phases or not set(phases) <= WAITING_PHASES:
        return False
    return now - quiet_since > max(SILENCE_S, 2.0 * (step_median_s or 0.0))


@dataclass(frozen=True)
class Asking:
    """What one round of asks about the group's other members came to."""

    began: tuple[str, ...] = ()  # members an ask was put out for this round
    waiting: bool = False  # an ask is still out: no answer yet, its seat not revoked
    revoked: bool = False  # a member's seat was revoked this round


@dataclass(frozen=True)
class Asked:
    token: object  # what this ask is about: a generation waited on, or a silence
    revision: int  # the ask's: an answer is a progress key modified after it
    at: float  # monotonic
    settled: bool = False  # answered, or the seat was revoked: nothing more to do


class SeatProbe:
    def __init__(
        self,
        coord: Coordinator,
        attempt: Attempt,
        nodes_per_group: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coord = coord
        self.clock = clock
        self.attempt = attempt  # EtcdUpkeep._attempt: errors become state, not exceptions
        self.nodes = nodes_per_group
        self.log = logs.get()
        self._asked: dict[tuple[str, int], Asked] = {}  # (member, seat) -> its latest ask
        self._listening: dict[tuple[str, int], HostProbe] = {}  # its status port, probed

    def check(
        self,
        member: str,
        seat: int,
        token: object,
        address: tuple[str, int] | None = None,
        unheard: bool = False,
    ) -> bool:
        """Ask `member` (holding seat `seat`) for a sign of life, once per `token` (the
        generation this node waits on it in, or the silence of our ranks it may cause),
        or judge the answer; True when its seat was revoked this round. `address`: its
        daemon's status server (host, port) as its record gives it, probed meanwhile;
        `unheard`: that port already refused while our ranks ran, no daemon listening
        there (seats.py), so the seat goes in the round that asks."""
        key = (member, seat)
        asked = self._asked.get(key)
        if asked is None or asked.token != token:
            ok, revision = self.attempt("seat_probe", self.coord.ask_progress)
            if ok:
                self._asked[key] = Asked(token, int(revision), self.clock())
                self._listen(key, address)
            if not (ok and unheard):
                return False
            asked = self._asked[key]
        if asked.settled:
            return False
        ok, progress = self.attempt("seat_probe", self.coord.read_progress)
        if not ok:
            return False
        found: Progress | None = progress.get(member)
        waited = self.clock() - asked.at
        if found is not None and found.revision > asked.revision:
            self._settle(key, asked)
            self.log.info("seat_probe_answered", member=member, seat=seat, seconds=round(waited, 3))
            return False
        listening = self._listening.get(key)
        unheard = unheard or (listening is not None and listening.refused)
        silent = listening is not None and listening.silent
        if waited < (SILENT_WAIT_S if silent else PROBE_WAIT_S) and not unheard:
            return False
        ok, revoked = self.attempt(
            "seat_probe", lambda: self.coord.revoke_seat(seat, self.nodes, member)
        )
        if not ok:
            return False
        self._settle(key, asked)
        if revoked:
            self.log.warning(
                "seat_revoked",
                member=member,
                seat=seat,
                waited_s=round(waited, 3),
                why=(
                    "its daemon's status port refused"
                    if unheard
                    else "no sign of life while its group waited on it"
                ),
            )
        return bool(revoked)

    def token(self, member: str, seat: int) -> object:
        """What the latest ask about `member` was for (None: never asked)."""
        asked = self._asked.get((member, seat))
        return None if asked is None else asked.token

    def pending(self, member: str, seat: int) -> bool:
        """An ask about `member` is out: not answered, its seat not revoked."""
        asked = self._asked.get((member, seat))
        return asked is not None and not asked.settled

    def _listen(self, key: tuple[str, int], address: tuple[str, int] | None) -> None:
        """Probe the asked member's status port from a thread while the ask runs."""
        old = self._listening.pop(key, None)
        if old is not None:
            old.close()
        if address is not None:
            probe = HostProbe(lambda: None)
            probe.follow(address)
            self._listening[key] = probe

    def _settle(self, key: tuple[str, int], asked: Asked) -> None:
        self._asked[key] = replace(asked, settled=True)
        probe = self._listening.pop(key, None)
        if probe is not None:
            probe.close()

    def close(self) -> None:
        for probe in self._listening.values():
            probe.close()
        self._listening.clear()
