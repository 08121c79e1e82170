"""The checks' settings as values, one run of every check, and the thread that runs them.

:class:`HealthMonitor` runs every check each ``health.interval_s`` on a thread of its
own (``nvidia-smi`` and etcd's clock may take seconds; the supervisor's loop must never
wait on them) and publishes each run as one immutable :class:`HealthReport`, which the
supervisor takes as it is (:attr:`HealthMonitor.latest`): nothing mutable is shared.
It logs ``node_unhealthy`` when the set of failing checks changes and ``node_healthy``
when none is left, and wakes the loop after each run so the gate acts at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from daemon.config import DaemonConfig
from daemon.health import checks
from daemon.health.checks import CheckResult, HealthReport
from daemon.health.etcd_clock import EtcdAccess, read_clock
from daemon.health.probes import (
    available_memory,
    count_cpus,
    count_gpus,
    injected_offset,
    probe_checkpoint_dir,
)
from trainer import logs

CHAOS_CLOCK = "PHALANX_CHAOS_CLOCK_OFFSET_FILE"  # a testing knob (probes.injected_offset)
GB = int(checks.GB)


@dataclass(frozen=True)
class HealthSettings:
    """Everything the checks need, fixed when the daemon starts."""

    checkpoint_dir: Path | None  # <checkpoint.dir>/<job>; None: no checkpoint.dir
    probe_tag: str  # names the probe file (the node id)
    min_free_bytes: int
    device: str  # "cuda" or "cpu": what the ranks train on
    wanted_devices: int
    devices_field: str  # the setting that asks for them, for the reason
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES as the ranks get it
    etcd: EtcdAccess
    max_clock_offset_s: float
    min_free_memory_bytes: int
    chaos_clock_file: str | None = None

    @classmethod
    def of(
        cls,
        cfg: DaemonConfig,
        endpoints: Sequence[str],
        device: str,
        environ: Mapping[str, str] | None = None,
    ) -> HealthSettings:
        """From the job file, the etcd endpoints in use (an embedded etcd's too) and the
        device type the ranks resolve to; `environ`: the daemon's (default os.environ)."""
        env = os.environ if environ is None else environ
        h, e = cfg.health, cfg.etcd
        if device == "cuda" and not h.devices:
            wanted, field = cfg.node.nproc, "node.nproc"
        else:
            wanted, field = h.devices, "health.devices"
        visible = cfg.node.env.get("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
        return cls(
            checkpoint_dir=Path(cfg.checkpoint.dir) / cfg.job.name if cfg.checkpoint.dir else None,
            probe_tag=cfg.node_id,
            min_free_bytes=int(h.min_free_gb * GB),
            device=device,
            wanted_devices=wanted,
            devices_field=field,
            visible_devices=visible,
            etcd=EtcdAccess(tuple(endpoints), e.ca_file, e.cert_file, e.key_file, e.timeout_s),
            max_clock_offset_s=h.max_clock_offset_s,
            min_free_memory_bytes=int(h.min_free_memory_gb * GB),
            chaos_clock_file=env.get(CHAOS_CLOCK),
        )


def run_checks(s: HealthSettings) -> tuple[CheckResult, ...]:
    """Every check once, in :data:`checks.CHECKS` order. A check that raises (a bug) is
    reported as not checked, with the error, rather than taking the node out."""
    return tuple(_guarded(name, s) for name in checks.CHECKS)


def _guarded(name: str, s: HealthSettings) -> CheckResult:
    try:
        return _run(name, s)
    except Exception as e:
        logs.get().warning("health_check_error", check=name, error=f"{type(e).__name__}: {e}")
        return CheckResult(name, True, f"not checked ({type(e).__name__}: {e})")


def _run(name: str, s: HealthSettings) -> CheckResult:
    if name == checks.CHECKPOINT_DIR:
        figures = (
            probe_checkpoint_dir(s.checkpoint_dir, s.probe_tag)
            if s.checkpoint_dir is not None
            else None
        )
        return checks.checkpoint_dir(figures, s.min_free_bytes)
    if name == checks.DEVICES:
        counted = count_gpus(s.visible_devices) if s.device == "cuda" else count_cpus()
        return checks.devices(counted, s.wanted_devices, s.devices_field)
    if name == checks.CLOCK:
        injected, bad = injected_offset(s.chaos_clock_file)
        if bad is not None:
            return CheckResult(checks.CLOCK, False, bad)
        if s.max_clock_offset_s <= 0:
            return checks.clock(None, 0.0)
        sample, why = read_clock(s.etcd)
        return checks.clock(sample, s.max_clock_offset_s, injected, why)
    available, source = available_memory()
    return checks.memory(available, s.min_free_memory_bytes, source)


def next_report(
    results: tuple[CheckResult, ...], previous: HealthReport | None, at: float
) -> HealthReport:
    """The report of a run that follows `previous`: its failures in a row counted on."""
    report = HealthReport(results, at)
    if report.ok:
        return report
    before = previous.failed_in_a_row if previous is not None else 0
    return HealthReport(results, at, before + 1)


class HealthMonitor:
    """Runs the checks every `interval_s` on its own thread; :attr:`latest` is the last
    run's report (None before the first). `wake` is called after each run."""

    def __init__(
        self,
        settings: HealthSettings,
        interval_s: float,
        wake: Callable[[], None] | None = None,
        run: Callable[[HealthSettings], tuple[CheckResult, ...]] = run_checks,
    ) -> None:
        self.settings = settings
        self.interval_s = interval_s
        self._wake = wake
        self._run = run
        self._latest: HealthReport | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)
        self.log = logs.get()

    @property
    def latest(self) -> HealthReport | None:
        return self._latest

    def start(self) -> HealthMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)  # a check under way may hold it (daemon thread)

    def check_now(self) -> HealthReport:
        """One run, published as the latest (the thread's loop body)."""
        previous = self._latest
        report = next_report(self._run(self.settings), previous, time.monotonic())
        self._latest = report
        self._tell(previous, report)
        if self._wake is not None:
            self._wake()
        return report

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.check_now()
            self._stop.wait(self.interval_s)

    def _tell(self, previous: HealthReport | None, report: HealthReport) -> None:
        was = {c.name for c in previous.failing} if previous is not None else set()
        now = {c.name for c in report.failing}
        if now and now != was:
            failing = {c.name: c.reason for c in report.failing}
            self.log.warning("node_unhealthy", failing=failing)
        elif was and not now:
            self.log.info("node_healthy", checks={c.name: c.reason for c in report.checks})
