"""Fault injection at precise moments of a step, for tests, demos and game days.

``PHALANX_CHAOS`` holds comma-separated ``point@step[:action]`` entries:

* ``point``: ``start`` (after setup, before the first step), ``forward``,
  ``gradients`` (this rank's gradients are computed, not yet averaged across
  groups; with diloco, a sync's quorum formed, nothing sent yet), ``allreduce`` (the cross-group gradient all-reduce has been issued and
  is in flight), ``optimizer`` (the step was committed, the optimizer has not
  run; with diloco, the sync was committed and applied), ``buffers`` (the step
  was committed and the buffers' averaged changes applied), ``checkpoint`` (the writer group has just launched an asynchronous save),
  ``resume`` (a cold start is about to choose a checkpoint; the step is 0),
  ``restored`` (a cold start loaded one, the groups have not compared it yet; 0) or
  ``finish`` (the rank has left its group, after the job's last step or a drain its
  group agreed on, and is about to exit; 0).
* ``step``: ``N`` is the step being attempted (N steps are committed; for
  ``checkpoint``, N is the step being saved); ``+N`` is this process's N-th step
  attempt counting from 0, useful for a relaunched group whose step is only
  known after it heals.
* ``action``: ``kill`` (default; the rank SIGKILLs itself, a real, uncatchable
  death), ``crash`` (an exception, like a bug), ``stop`` (SIGSTOP, a hang),
  ``nan`` (at ``gradients`` only: the rank's gradients become NaN, as a numerical
  blow-up would make them), ``hide`` (at ``resume`` only: the newest marked
  checkpoint is invisible to this rank, as a stale view of a shared volume would be),
  ``perturb`` (at ``optimizer`` and ``restored`` only: the rank adds 1e-3 to its
  first parameter shard, so its group's parameters silently differ from the
  other groups'; at ``buffers``: to its first floating-point buffer, such as a
  BatchNorm running mean), ``sleep`` (the rank sleeps ``PHALANX_CHAOS_SLEEP``
  seconds, default 10, there: at ``checkpoint``, a save that blocks training; at
  ``finish``, a rank slower to leave than its group's others), ``slow`` (at
  ``checkpoint`` only, with ``checkpoint.async_save``: the save's write in the
  background completes ``PHALANX_CHAOS_SLEEP`` seconds late while training goes on, as
  on a loaded volume; a save that falls due meanwhile is skipped).

``PHALANX_CHAOS_RANKS`` (comma-separated ranks of the group; default every rank)
limits the faults to those ranks.

``PHALANX_CHAOS_DELAY`` (seconds) is slept at the start of every forward: it
simulates a bigger model, so a demo or test can watch a slow job. ``@PATH`` instead of a
number reads the seconds from the file PATH, again whenever the file changes: a test
paces a job while it injects faults, then lets it finish at full speed.

Without these variables every call is a cheap no-op.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# The variables, read by every rank and checked by the daemon's preflight.
CHAOS = "PHALANX_CHAOS"
CHAOS_RANKS = "PHALANX_CHAOS_RANKS"
CHAOS_DELAY = "PHALANX_CHAOS_DELAY"
CHAOS_SLEEP = "PHALANX_CHAOS_SLEEP"

POINTS = (
    "start", "forward", "gradients", "allreduce", "optimizer", "buffers", "checkpoint", "resume",
    "restored", "finish",
)  # fmt: skip
ACTIONS = ("kill", "crash", "stop", "nan", "hide", "perturb", "sleep", "slow")
ONLY_AT: dict[str, tuple[str, ...]] = {  # actions that mean something at some points only
    "nan": ("gradients",),
    "hide": ("resume",),
    "perturb": ("optimizer", "restored", "buffers"),
    "slow": ("checkpoint",),
}


class InjectedCrash(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    point: str
    step: int
    action: str
    relative: bool = False


def parse(spec: str) -> list[Fault]:
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        where, _, action = item.partition(":")
        point, _, step = where.partition("@")
        action = action or "kill"
        relative = step.startswith("+")
        digits = step.removeprefix("+")
        if (
            point not in POINTS
            or action not in ACTIONS
            or point not in ONLY_AT.get(action, POINTS)
            or not re.fullmatch("[0-9]+", digits)
        ):
            raise ValueError(
                f"PHALANX_CHAOS entry {item!r} must be point@[+]step[:action] with point in "
                f"{', '.join(POINTS)} and action in {', '.join(ACTIONS)} (nan at gradients only, "
                "hide at resume only, perturb at optimizer, restored or buffers only, slow at "
                "checkpoint only)."
            )
        faults.append(Fault(point, int(digits), action, relative))
    return faults


def parse_delay(text: str | None, name: str = CHAOS_DELAY) -> float:
    """Seconds of ``PHALANX_CHAOS_DELAY`` (or `name`; unset or empty: 0; ``@PATH`` for
    the delay only: the number in the file PATH now); ValueError when malformed."""
    if text and text.startswith("@") and name == CHAOS_DELAY:
        path = text[1:]
        try:
            text = Path(path).read_text().strip()
        except OSError as e:
            raise ValueError(f"{name} file {path!r} cannot be read ({e.strerror}).") from None
    try:
        delay = float(text or 0)
    except ValueError:
        delay = math.nan
    if not (math.isfinite(delay) and delay >= 0):
        raise ValueError(f"{name} {text!r} must be a number of seconds, 0 or more.")
    return delay


def parse_ranks(text: str | None) -> set[int] | None:
    """``PHALANX_CHAOS_RANKS`` (unset or empty: every rank); ValueError when malformed."""
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch("[0-9]+", p) for p in parts):
        raise ValueError(f"PHALANX_CHAOS_RANKS {text!r} must be comma-separated rank numbers.")
    return {int(p) for p in parts}


class Pace:
    """The delay slept at every forward: fixed, or (``@PATH``) the file's number, read
    again when the file's modification time changes; a file that turns unreadable or
    malformed keeps the last good delay (its writer replaces it whole)."""

    def __init__(self, text: str | None) -> None:
        self.seconds = parse_delay(text)
        self.path = Path(text[1:]) if text and text.startswith("@") else None
        self._stamp = self._modified()

    def _modified(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns if self.path is not None else None
        except OSError:
            return None

    def now(self) -> float:
        if self.path is not None and (stamp := self._modified()) != self._stamp:
            self._stamp = stamp
            with contextlib.suppress(ValueError):
                self.seconds = parse_delay(f"@{self.path}")
        return self.seconds


class Chaos:
    def __init__(self, spec: str | None = None, delay: float | None = None, rank: int = 0) -> None:
        """`rank`: this rank's in its group (RankEnv.rank), which PHALANX_CHAOS_RANKS picks."""
        self.faults = parse(spec if spec is not None else os.environ.get(CHAOS, ""))
        ranks = parse_ranks(os.environ.get(CHAOS_RANKS))
        if ranks is not None and rank not in ranks:
            self.faults = []
        self.pace = Pace(str(delay) if delay is not None else os.environ.get(CHAOS_DELAY))
        self.sleep_s = parse_delay(os.environ.get(CHAOS_SLEEP) or "10", CHAOS_SLEEP)
        self.step = 0  # the committed step being attempted
        self.attempt = -1  # this process's step attempts, from 0

    def begin_step(self, step: int) -> None:
        self.step = step
        self.attempt += 1

    def at(self, point: str, step: int | None = None) -> bool:
        """Inject what is due here; True when the caller must act (nan: poison its
        gradients; hide: skip the newest checkpoint; perturb: change a parameter; slow:
        delay its save's completion, with :func:`completes_late`)."""
        if point == "forward" and (delay := self.pace.now()) > 0:
            time.sleep(delay)
        poison = False
        for fault in self.faults:
            current = self.attempt if fault.relative else (self.step if step is None else step)
            if fault.point != point or fault.step != current:
                continue
            if fault.action in ONLY_AT:
                poison = True
            elif fault.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.action == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fault.action == "sleep":
                time.sleep(self.sleep_s)
            else:
                raise InjectedCrash(f"injected crash at {point}@{self.step}")
        return poison


def completes_late(done: Future[T], seconds: float) -> Future[T]:
    """A future with `done`'s outcome, `seconds` after `done` completes (a slow write)."""
    late: Future[T] = Future()

    def settle(source: Future[T]) -> None:
        error = source.exception()
        if error is not None:
            late.set_exception(error)
        else:
            late.set_result(source.result())

    def wait(source: Future[T]) -> None:
        timer = threading.Timer(seconds, settle, (source,))
        timer.daemon = True
        timer.start()

    done.add_done_callback(wait)
    return late
