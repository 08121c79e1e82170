"""A spanning group's member asked for a sign of life before its seat is given to a spare.

A node that lost power keeps its seat (``seats/<gid>/<rank>``, on its session lease)
until etcd expires the lease: ``etcd.lease_ttl_s``, 10 s by default, during which its
group cannot start again, though a spare waits. The group's surviving node sees the
loss at once (its ranks' links to the dead node fail) and waits on the dead member
(``spanning.SpanningGroup.blocker``). It then asks every daemon for its progress (the
``asks/progress`` put of ``daemon.coordination.progress``, which every daemon answers
within a round whatever its state) and reads who answered:

* the member answered: it is alive and reaches etcd (a split inside the group, or a
  member slow to stop its ranks), so this node waits on it as before;
* no answer within :data:`PROBE_WAIT_S`: the member's seat is deleted, if the member
  still holds it (``Coordinator.revoke_seat``), and a spare, or the member itself
  once back, claims it. A member alive behind a partition from etcd loses nothing it
  could use: it is fenced by its own lease clock, its ranks stop when the group's
  seats change (``SpanningGroup.must_stop``), and it finds its seat gone when etcd
  answers again (``Seats.holds``).

One ask per member and generation; nothing is sent while no member holds a group up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from daemon.coordination import Coordinator
from daemon.coordination.progress import Progress
from trainer import logs

PROBE_WAIT_S = 1.5  # a live daemon answers within a round or two (0.25 s each)

Attempt = Callable[[str, Callable[[], Any]], tuple[bool, Any]]


@dataclass(frozen=True)
class Asked:
    member: str
    seat: int
    generation: int
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
        self._asked: Asked | None = None

    def check(self, member: str, seat: int, generation: int) -> bool:
        """Ask `member` (holding seat `seat`, while the group is at `generation`) for a sign
        of life, or judge the answer; True when its seat was revoked this round."""
        asked = self._asked
        if asked is None or (asked.member, asked.seat, asked.generation) != (
            member,
            seat,
            generation,
        ):
            ok, revision = self.attempt("seat_probe", self.coord.ask_progress)
            if ok:
                self._asked = Asked(member, seat, generation, int(revision), self.clock())
            return False
        if asked.settled:
            return False
        ok, progress = self.attempt("seat_probe", self.coord.read_progress)
        if not ok:
            return False
        found: Progress | None = progress.get(member)
        waited = self.clock() - asked.at
        if found is not None and found.revision > asked.revision:
            self._asked = replace(asked, settled=True)
            self.log.info("seat_probe_answered", member=member, seat=seat, seconds=round(waited, 3))
            return False
        if waited < PROBE_WAIT_S:
            return False
        ok, revoked = self.attempt(
            "seat_probe", lambda: self.coord.revoke_seat(seat, self.nodes, member)
        )
        if not ok:
            return False
        self._asked = replace(asked, settled=True)
        if revoked:
            self.log.warning(
                "seat_revoked",
                member=member,
                seat=seat,
                waited_s=round(waited, 3),
                why="no sign of life while its group waited on it",
            )
        return bool(revoked)
