"""The node's health checks as pure functions: figures in, one :class:`CheckResult` out.

What the figures are read from (the volume, ``nvidia-smi``, etcd's clock, the kernel's
memory counters) is ``daemon.health.probes`` and ``daemon.health.etcd_clock``; here is
only the judgement, so a unit test can walk every branch with made-up figures. Each
failing result's reason is one sentence naming what is wrong, the figures and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_DIR = "checkpoint_dir"
DEVICES = "devices"
CLOCK = "clock"
MEMORY = "memory"
CHECKS = (CHECKPOINT_DIR, DEVICES, CLOCK, MEMORY)  # the order they run and are shown in

GB = 1e9
# Room asked for beyond the newest checkpoint's size, as the ranks ask before a save
# (trainer/checkpoint/space.py): the state may have grown a little since.
HEADROOM = 1.1


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: `reason` says what was found, and why it fails when it does."""

    name: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class HealthReport:
    """One run of every check. `at`: when it ended (monotonic); `failed_in_a_row`: how many
    runs in a row, this one included, had a failing check (0 when this one is healthy)."""

    checks: tuple[CheckResult, ...]
    at: float
    failed_in_a_row: int = 0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failing(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def summary(self) -> str:
        """The failing checks as one line: "clock: ...; devices: ..." ("" when healthy)."""
        return "; ".join(f"{c.name}: {c.reason}" for c in self.failing)


def size(n: float) -> str:
    """Bytes in words: "512.0 MB", "3.2 GB"."""
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.1f} MB"


# ------------------------------------------------------------------ checkpoint directory


@dataclass(frozen=True)
class DirFigures:
    """What the checkpoint directory's probe found."""

    directory: Path
    error: str | None = None  # why it cannot be created or written; None: it can
    free_bytes: int | None = None  # free on its volume; None: statvfs failed
    newest_bytes: int | None = None  # the newest complete checkpoint's size; None: none yet
    pending_bytes: int = 0  # written so far by a save under way (no marker yet)


def checkpoint_dir(f: DirFigures | None, min_free_bytes: int) -> CheckResult:
    """Writable, with room for the next save: the newest checkpoint's size x HEADROOM, or
    `min_free_bytes` (health.min_free_gb) while there is none. What a save under way has
    written counts as room it already has (the next save is that one), so the writer does
    not turn unhealthy in the middle of every save. None: no checkpoint.dir."""
    if f is None:
        return CheckResult(CHECKPOINT_DIR, True, "no checkpoint.dir: nothing to check")
    where = f"checkpoint.dir {f.directory}"
    if f.error is not None:
        return CheckResult(
            CHECKPOINT_DIR,
            False,
            f"{where} cannot be written ({f.error}); make its volume writable or point "
            "checkpoint.dir at one that is",
        )
    if f.newest_bytes is not None:
        needed = int(f.newest_bytes * HEADROOM)
        why = f"the newest checkpoint's {size(f.newest_bytes)} x {HEADROOM:g}"
    else:
        needed, why = min_free_bytes, "health.min_free_gb before the first checkpoint"
    if f.free_bytes is None:
        return CheckResult(CHECKPOINT_DIR, True, f"{where} is writable; its free space is unknown")
    room = f.free_bytes + f.pending_bytes
    saving = (
        f" and {size(f.pending_bytes)} written by the save under way" if f.pending_bytes else ""
    )
    if room < needed:
        return CheckResult(
            CHECKPOINT_DIR,
            False,
            f"{where} has {size(f.free_bytes)} free{saving}, the next save needs "
            f"{size(needed)} ({why}); free space on its volume",
        )
    return CheckResult(
        CHECKPOINT_DIR,
        True,
        f"{where} is writable, {size(f.free_bytes)} free{saving}, {size(needed)} needed",
    )


# ---------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class DeviceFigures:
    """The devices this node's ranks can use, as counted."""

    kind: str  # "cuda" or "cpu"
    count: int | None  # None: could not be counted
    source: str  # how they were counted: "nvidia-smi -L", "CPU affinity", ...
    error: str | None = None  # what nvidia-smi reported wrong (a lost GPU, a failed call)


def devices(f: DeviceFigures, wanted: int, field: str) -> CheckResult:
    """At least `wanted` devices (0: none asked for), named by `field` in the reason
    (node.nproc or health.devices), and no problem reported by the driver."""
    unit = "GPUs" if f.kind == "cuda" else "CPU cores"
    one = unit.removesuffix("s")
    if f.error is not None:
        return CheckResult(
            DEVICES,
            False,
            f"nvidia-smi reports a problem ({f.error}); check the GPUs (nvidia-smi, the "
            "kernel log's Xid lines) and reset or replace the failed one",
        )
    if f.count is None:
        return CheckResult(DEVICES, True, f"{unit} not counted ({f.source}): not checked")
    have = f"{f.count} {one if f.count == 1 else unit} ({f.source})"
    if wanted and f.count < wanted:
        return CheckResult(
            DEVICES,
            False,
            f"this node has {have}, {field} wants {wanted}; bring the missing ones back or "
            f"lower {field}",
        )
    needs = f", {wanted} wanted ({field})" if wanted else ", none wanted"
    return CheckResult(DEVICES, True, f"{have}{needs}")


# ------------------------------------------------------------------------------ clock


@dataclass(frozen=True)
class ClockSample:
    """One read of etcd's clock: the local wall clock when the request went out and when
    the answer came, and the answer's Date header (whole seconds, truncated)."""

    sent: float
    received: float
    etcd_date: float
    endpoint: str


def offset_bounds(sample: ClockSample, injected: float = 0.0) -> tuple[float, float]:
    """The offset of this node's clock from etcd's (positive: ours is ahead) that the
    sample allows, as (lowest, highest): etcd read its clock in [date, date + 1) at some
    moment within [sent, received] of ours. `injected` is added (a testing knob)."""
    low = sample.sent - (sample.etcd_date + 1.0) + injected
    high = sample.received - sample.etcd_date + injected
    return low, high


def clock(
    sample: ClockSample | None, max_offset_s: float, injected: float = 0.0, error: str = ""
) -> CheckResult:
    """This node's wall clock within `max_offset_s` of etcd's (0: not checked). Only an
    offset the sample proves larger fails: the Date header's 1 s resolution and the
    request's round trip are given to the node. No sample (etcd did not answer, `error`)
    leaves the clock unmeasured, not failed: an etcd outage is not this node's fault."""
    if max_offset_s <= 0:
        return CheckResult(CLOCK, True, "health.max_clock_offset_s = 0: not checked")
    if sample is None:
        return CheckResult(CLOCK, True, f"not measured ({error or 'no etcd answer'})")
    low, high = offset_bounds(sample, injected)
    estimate = (low + high) / 2
    least = 0.0 if low <= 0.0 <= high else min(abs(low), abs(high))
    if least > max_offset_s:
        return CheckResult(
            CLOCK,
            False,
            f"this node's clock is {estimate:+.1f} s off etcd's at {sample.endpoint} (at least "
            f"{least:.1f} s, health.max_clock_offset_s = {max_offset_s:g}); synchronise it "
            "(chrony or NTP)",
        )
    return CheckResult(
        CLOCK, True, f"{estimate:+.1f} s off etcd's (within {max_offset_s:g} s, 1 s resolution)"
    )


# ----------------------------------------------------------------------------- memory


def memory(available: int | None, min_bytes: int, source: str) -> CheckResult:
    """At least `min_bytes` available (0: not checked); `source` says what was read."""
    if min_bytes <= 0:
        return CheckResult(MEMORY, True, "health.min_free_memory_gb = 0: not checked")
    if available is None:
        return CheckResult(MEMORY, True, f"not measured ({source})")
    if available < min_bytes:
        return CheckResult(
            MEMORY,
            False,
            f"{size(available)} of memory available ({source}), health.min_free_memory_gb "
            f"wants {size(min_bytes)}; stop what uses it or lower health.min_free_memory_gb",
        )
    return CheckResult(MEMORY, True, f"{size(available)} available ({source})")
