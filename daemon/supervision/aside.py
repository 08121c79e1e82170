"""A spanning group's node steps aside while it asks about a member whose host answers
nothing (DESIGN.md, "Groups across nodes", 8).

A member's status port silent twice in a row (``daemon.host_probe``) is a host without
power or network, or a split inside the group; the ask through etcd tells the two apart
within :data:`~daemon.supervision.seat_probe.SILENT_WAIT_S` (seat_probe.py). Meanwhile the
other groups' ranks sit in a collective with the lost member's, and torchft's lighthouse
keeps our group in their quorums for as long as our ranks heartbeat it (a group's first
node is its lighthouse client): the other groups went on only once the seat was revoked,
our ranks killed and the lighthouse's heartbeat timeout past, about 3 s after the loss.
So, as the ask goes out, the node

* announces its group's failure (``failed/<gid>``): the other groups' ranks abandon the
  step in flight, and
* pauses its ranks (SIGSTOP, as the fence does): they stop heartbeating, the lighthouse
  drops the group after ``lighthouse.heartbeat_timeout_ms``, and the other groups' next
  quorum forms without it.

Then, by what the ask comes to: a seat revoked (or the group's generation moved on), the
ranks are stopped and the group restarts, a spare in the seat. The member answered: it is
alive and reaches etcd, so its host's silence is a split inside the group, which can
finish no step; the ranks stay paused, out of the other groups' quorums (alive and
heartbeating, the group would hold every quorum for ``lighthouse.join_timeout_ms``),
until its host answers again. Then, after a short silence (two probes merely lost on the
way), they go on: their step, which the other groups left, fails and is healed as after
any announcement; after a longer one the group restarts under a new generation (its links
would come back only at TCP's next retransmission), never a counted restart. Once per
member, silence (a run of unanswered probes) and generation of our ranks; an ask still
out after :data:`ASIDE_MAX_S` (etcd away) resumes the ranks, the fence judging the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from daemon.fencing import Fence
from daemon.node_state.reports import RanksReport, UpkeepReport
from daemon.ranks.workers import ExitKind
from daemon.supervision.parts import Parts, Upkeep
from daemon.supervision.seat_probe import PROBE_WAIT_S, Asking, too_still
from daemon.supervision.spanning import SpanningGroup

ASIDE_MAX_S = PROBE_WAIT_S + 2.0  # the ask's own wait, and its revoke's round trips
# A split held longer than this restarts the group when it heals: TCP backs off while a
# link is cut (its retransmissions 0.2, 0.4, 0.8, ... s apart), so the ranks' links would
# come back only at their next retransmission, seconds after the heal; a new generation,
# started from warm standbys and healed from the other groups, is back sooner.
RESTART_AFTER_S = ASIDE_MAX_S


@dataclass(frozen=True)
class Aside:
    """The node's last step aside: for which generation of its ranks and which members,
    on which silence of its ranks (the ask's token), and whether FENCED is that step
    aside now (not the fence)."""

    generation: int | None = None
    members: frozenset[str] = frozenset()
    silence: float = 0.0
    active: bool = False

    def steps_for(self, mute: Iterable[str], asking: Asking, generation: int | None) -> bool:
        """Whether to step aside now: a member whose host answers nothing was asked about
        this round, and our ranks of this generation have not stepped aside for it in this
        silence (one whose host answered since is forgotten: :meth:`forgetting`)."""
        done = self._done_in(generation)
        return any(m in asking.began and m not in done for m in mute)

    def _done_in(self, generation: int | None) -> frozenset[str]:
        """The members stepped aside for under `generation` (none under another)."""
        return self.members if generation == self.generation else frozenset()

    def forgetting(self, mute: Iterable[str]) -> Aside:
        """Members whose host answers again are forgotten: their next silence is new."""
        return replace(self, members=self.members & frozenset(mute))

    def why(self, mute: Iterable[str]) -> str:
        return f"asking about {', '.join(mute)}, whose host answers nothing"

    def taken(self, mute: Iterable[str], generation: int | None, silence: float) -> Aside:
        return Aside(generation, self._done_in(generation) | frozenset(mute), silence, True)


def verdict(
    asking: Asking, moved: str | None, held_s: float, gid: int, split: bool = False
) -> tuple[Fence, str]:
    """What ranks paused for an ask do now, and why: DISCARD (a seat revoked, or the
    group's generation moved on: the group restarts), HOLD (the ask is still out; or the
    member answered it and its host still answers us nothing, `split`: a split inside
    the group, which could not finish a step, kept out of the other groups' quorums until
    it heals; a split held longer than :data:`RESTART_AFTER_S` then restarts the group),
    KEEP (the member answered and its host answers again soon, or nothing more will come
    of the ask)."""
    if moved is not None:
        return Fence.DISCARD, moved
    if asking.revoked:
        return Fence.DISCARD, f"replica group {gid} lost a member whose host answered nothing"
    if asking.waiting and held_s < ASIDE_MAX_S:
        return Fence.HOLD, f"replica group {gid}'s silent member to answer the ask"
    if asking.waiting:
        return Fence.KEEP, f"the ask had no outcome in {ASIDE_MAX_S:.1f} s (etcd away?)"
    if split:
        return Fence.HOLD, f"replica group {gid}'s split to heal (its member answers through etcd)"
    if held_s > RESTART_AFTER_S:
        return Fence.DISCARD, f"replica group {gid}'s split healed after {held_s:.1f} s"
    return Fence.KEEP, "the member that went silent answers again"


@dataclass(frozen=True)
class Watched:
    """What the running node's watch of its group's other members came to in a tick."""

    aside: Aside  # the node's step aside record from now on
    moved: str | None = None  # the group moved on or lost a member: our ranks stop
    word: dict[str, Any] | None = None  # our group's failure, to announce (revoked or aside)
    why: str | None = None  # step aside now, for this (the ranks pause while the ask is out)


def watch(
    spanning: SpanningGroup,
    up: UpkeepReport,
    r: RanksReport,
    aside: Aside,
    generation: int | None,
    parts: Parts,
) -> Watched:
    """A running node of a spanning group, each tick: stop when the group moved on (or a
    seat changed hands); ask about the other members when our ranks went still (a member
    dead without a word), a member's status port refused (its daemon died) or went silent
    (its host answers nothing: also step aside); announce our group's failure when a seat
    was revoked, so the other groups' ranks blocked with that member abandon the step."""
    upkeep, ranks = parts.upkeep, parts.ranks
    assert up.job is not None and up.slot is not None
    gone, mute, silence = up.members_gone, up.members_silent, r.quiet_since or 0
    aside = aside.forgetting(mute)
    moved = spanning.must_stop(up.job, up.slot)
    if moved is not None:
        return Watched(aside, moved)
    still = too_still(r.quiet_since, time.monotonic(), r.phases, r.step_time_median_s)
    if not (still or gone or mute):
        return Watched(aside)
    asking = upkeep.ask_members(up.job, silence, gone)
    stepping = aside.steps_for(mute, asking, generation)
    if not (asking.revoked or stepping):
        return Watched(aside)
    word = ranks.failure_word(ExitKind.HUNG, up.job.lighthouse)  # reads the heartbeats
    if asking.revoked:
        return Watched(aside, word=word)
    return Watched(aside.taken(mute, generation, silence), word=word, why=aside.why(mute))


def held(
    spanning: SpanningGroup | None, up: UpkeepReport, aside: Aside, upkeep: Upkeep, since: float
) -> tuple[Fence, str]:
    """Each tick of a step aside (since `since`, monotonic): what the ask came to
    (:func:`verdict`)."""
    job, slot, held_s = up.job, up.slot, time.monotonic() - since
    if up.job_completed:  # the others finished it while ours were held (a long split)
        return Fence.DISCARD, "the job completed elsewhere"
    if spanning is None or job is None or slot is None:
        return verdict(Asking(waiting=True), None, held_s, -1)
    asking = upkeep.ask_members(job, aside.silence)
    split = any(m in aside.members for m in up.members_silent)
    return verdict(asking, spanning.must_stop(job, slot), held_s, slot, split)
