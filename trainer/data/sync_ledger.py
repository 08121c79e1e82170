"""What a DiLoCo sync says about the items of the job (trainer/round_loop.py): which
shares nobody trained, and, when the parameters sync a fragment at a time
(``ft.num_fragments`` > 1), which shares a fragment will never see.

A sync's exchange carries, for each round rank of its groups, the mark of the group
that trained that share (0: nobody did) and how many syncs back that group's ledger
reaches. A group's mark is a random number it draws whenever its parameters start
over (a new process, a heal), so a group that comes back is not taken for the one that
went. Fully lost: a share of this round whose group added nothing. Partly lost (with
fragments): a group that added a share at one of the last ``num_fragments - 1``
syncs and adds nothing now took its training of that share with it for the fragment
synced now, whose last sync came before that share. One group says so: the first round
rank whose ledger reaches furthest back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainer.data.shares import Quorum, split


def slots(groups: int) -> int:
    """The exchange's length: a mark and a depth per round rank, then the loss sum, the
    item count and the count of groups that trained."""
    return 2 * groups + 3


@dataclass(frozen=True)
class Added:
    """One committed sync: the share each group added, by its mark."""

    shares: Mapping[float, range]


@dataclass(frozen=True)
class Ledger:
    """Who added what at the job's last committed syncs, newest last, at most `keep`, as
    this group saw them; it starts over when this group's parameters do (it healed or
    resumed) or when it joined a sync of others' whose round it did not know."""

    keep: int  # ft.num_fragments - 1
    added: tuple[Added, ...] = ()

    def after(self, sync: Added) -> Ledger:
        return Ledger(self.keep, (*self.added, sync)[-self.keep :] if self.keep else ())


@dataclass(frozen=True)
class Settled:
    added: Added  # who added what in this sync
    lost: tuple[range, ...]  # shares of this round nobody added
    partly: tuple[range, ...]  # earlier shares the fragment synced now never saw
    tells: bool  # this group says so


def settle(
    which: Sequence[float],
    groups: int,
    members: Quorum,
    round_items: range,
    ledger: Ledger,
) -> Settled:
    """Read a committed sync's exchange (`which`, as summed over its groups)."""
    ranks = range(min(members.participants, groups))
    marks = {k: float(which[k]) for k in ranks if which[k]}
    shares = {mark: split(round_items, members.participants, k) for k, mark in marks.items()}
    added = Added(shares)
    lost = tuple(split(round_items, members.participants, k) for k in ranks if k not in marks)
    partly = tuple(
        share for sync in ledger.added for mark, share in sync.shares.items() if mark not in shares
    )
    depth = {k: int(which[groups + k]) for k in marks}
    deepest = max(depth.values(), default=0)
    teller = next((k for k in marks if depth[k] == deepest), None)
    return Settled(added, lost, partly, members.rank is not None and members.rank == teller)
