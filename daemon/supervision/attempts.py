"""One coordination step at a time, with every etcd error turned into state.

:class:`Attempts` runs a step for the upkeep and the parts it drives: etcd unreachable
(or a lost lease) sets :attr:`Attempts.up` false, logs ``etcd_unavailable`` once per
outage and backs off (``BACKOFF_FIRST_S`` doubling to a cap: :meth:`due` says when the
next round may send again); a conflict (a lost compare-and-swap,
``NotLeader``, a key that keeps changing) is logged as ``etcd_retry`` and tried next
round. Only the refusals the caller names come out as exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from daemon.coordination import CoordinationError, EtcdUnavailable
from trainer import logs

T = TypeVar("T")
BACKOFF_FIRST_S, BACKOFF_CAP_S = 0.5, 5.0
TRIES_PER_TTL = 4  # the cap is at most a quarter of the node lease's TTL


def backoff_cap(lease_ttl_s: float) -> float:
    """The longest wait between two tries during an outage. etcd restores leases when it
    restarts, and a node must see it back well within the TTL the restored lease has
    left. With a 4 s TTL and a 5 s cap, a node whose last try fell just before etcd came
    back tried again only after its lease had lapsed (a pair test's leader saw etcd 2.4 s
    after it restarted, only because of where its backoff stood), and a lapsed lease
    makes the node a stranger whose ranks the fence judges anew."""
    return min(BACKOFF_CAP_S, max(BACKOFF_FIRST_S, lease_ttl_s / TRIES_PER_TTL))


class Attempts:
    def __init__(self, endpoints: list[str], cap_s: float = BACKOFF_CAP_S) -> None:
        self.up = False  # etcd answered the last step (the upkeep reports it)
        self.errors = 0  # steps that failed, in this daemon's life
        self.endpoints = endpoints
        self.cap_s = cap_s
        self.log = logs.get()
        self.retry_at = 0.0  # no request before this (monotonic)
        self._backoff = BACKOFF_FIRST_S
        self._outage_reported = False  # etcd_unavailable logged for the outage under way

    def due(self) -> bool:
        return time.monotonic() >= self.retry_at

    def __call__(
        self, what: str, fn: Callable[[], T], refusals: tuple[type[Exception], ...] = ()
    ) -> tuple[bool, T | None]:
        """Run one coordination step; every error becomes state, never an exception
        (but `refusals`, which the caller turns into a refusal to join)."""
        try:
            value = fn()
        except refusals:
            raise
        except EtcdUnavailable as e:  # includes a lost lease (SessionExpired)
            self.errors += 1
            if self.up or not self._outage_reported:  # also when never reached
                self._outage_reported = True
                self.log.warning(
                    "etcd_unavailable",
                    error=str(e),
                    during=what,
                    endpoints=self.endpoints,
                    ranks="untouched",
                    retrying=True,
                )
            self.up = False
            self.retry_at = time.monotonic() + self._backoff
            self._backoff = min(self.cap_s, self._backoff * 2)
            return False, None
        except CoordinationError as e:  # NotLeader, a lost compare-and-swap, "keeps changing"
            self.errors += 1
            self.log.warning("etcd_retry", error=str(e), kind=type(e).__name__, during=what)
            return False, None
        if not self.up:
            self.log.info("etcd_up", endpoints=self.endpoints)
        self.up = True
        self._outage_reported = False
        self._backoff = BACKOFF_FIRST_S
        return True, value
