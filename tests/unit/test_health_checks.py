"""The node's health checks (daemon/health/checks.py): figures in, a verdict out.

Every branch with made-up figures; what the figures are read from is
test_health_probes.py.
"""

from __future__ import annotations

from pathlib import Path

from daemon.health import checks
from daemon.health.checks import (
    CheckResult,
    ClockSample,
    DeviceFigures,
    DirFigures,
    HealthReport,
    offset_bounds,
)
from daemon.health.monitor import next_report

MB, GB = 10**6, 10**9
DIR = Path("/ckpt/job")


def test_no_checkpoint_dir_is_nothing_to_check() -> None:
    assert checks.checkpoint_dir(None, GB).ok


def test_a_directory_that_cannot_be_written_fails_naming_it_and_why() -> None:
    r = checks.checkpoint_dir(DirFigures(DIR, "Read-only file system", 10 * GB, None), GB)
    assert not r.ok and r.name == "checkpoint_dir"
    assert r.reason.startswith("checkpoint.dir /ckpt/job cannot be written (Read-only file system)")


def test_before_the_first_checkpoint_the_minimum_is_health_min_free_gb() -> None:
    low = checks.checkpoint_dir(DirFigures(DIR, None, 300 * MB, None), GB)
    assert not low.ok
    assert "has 300.0 MB free, the next save needs 1.0 GB (health.min_free_gb" in low.reason
    assert checks.checkpoint_dir(DirFigures(DIR, None, 2 * GB, None), GB).ok


def test_after_one_the_next_save_needs_the_newest_ones_size_with_headroom() -> None:
    # 100 MB checkpoint: 110 MB needed, whatever health.min_free_gb says.
    ok = checks.checkpoint_dir(DirFigures(DIR, None, 111 * MB, 100 * MB), 5 * GB)
    assert ok.ok and "111.0 MB free, 110.0 MB needed" in ok.reason
    short = checks.checkpoint_dir(DirFigures(DIR, None, 105 * MB, 100 * MB), 0)
    assert not short.ok
    assert "needs 110.0 MB (the newest checkpoint's 100.0 MB x 1.1)" in short.reason


def test_what_a_save_under_way_wrote_is_room_the_next_save_already_has() -> None:
    mid_save = DirFigures(DIR, None, 60 * MB, 100 * MB, pending_bytes=80 * MB)
    r = checks.checkpoint_dir(mid_save, 0)
    assert r.ok and "60.0 MB free and 80.0 MB written by the save under way" in r.reason
    short = checks.checkpoint_dir(DirFigures(DIR, None, 20 * MB, 100 * MB, 80 * MB), 0)
    assert not short.ok and "has 20.0 MB free and 80.0 MB written by the save" in short.reason


def test_unknown_free_space_is_not_a_failure() -> None:
    assert checks.checkpoint_dir(DirFigures(DIR, None, None, None), GB).ok


def test_too_few_gpus_fail_naming_the_setting_that_wants_them() -> None:
    r = checks.devices(DeviceFigures("cuda", 2, "nvidia-smi -L"), 4, "node.nproc")
    assert not r.ok
    assert r.reason.startswith("this node has 2 GPUs (nvidia-smi -L), node.nproc wants 4")
    assert checks.devices(DeviceFigures("cuda", 4, "nvidia-smi -L"), 4, "node.nproc").ok


def test_a_gpu_in_trouble_fails_even_when_enough_are_counted() -> None:
    figures = DeviceFigures("cuda", 8, "nvidia-smi -L", "Unable to determine the device handle")
    r = checks.devices(figures, 1, "node.nproc")
    assert not r.ok and "Unable to determine the device handle" in r.reason


def test_cpu_cores_are_checked_only_when_wanted_and_uncountable_devices_pass() -> None:
    assert checks.devices(DeviceFigures("cpu", 2, "CPU affinity"), 0, "health.devices").ok
    r = checks.devices(DeviceFigures("cpu", 2, "CPU affinity"), 64, "health.devices")
    assert not r.ok and "2 CPU cores (CPU affinity), health.devices wants 64" in r.reason
    assert checks.devices(DeviceFigures("cuda", None, "none"), 8, "node.nproc").ok


def test_the_offset_bounds_give_the_node_the_date_resolution_and_the_round_trip() -> None:
    # etcd said 1000 (so 1000.0-1000.999) while our clock went 1000.2 -> 1000.4.
    sample = ClockSample(1000.2, 1000.4, 1000.0, "e:2379")
    low, high = offset_bounds(sample)
    assert round(low, 6) == -0.8 and round(high, 6) == 0.4
    assert offset_bounds(sample, injected=30.0) == (low + 30.0, high + 30.0)


def test_only_an_offset_the_sample_proves_too_large_fails() -> None:
    in_step = ClockSample(1000.2, 1000.4, 1000.0, "e:2379")
    assert checks.clock(in_step, 1.0).ok
    assert checks.clock(in_step, 0.5, injected=0.9).ok  # low bound 0.1: within 0.5
    ahead = checks.clock(in_step, 5.0, injected=30.0)
    assert not ahead.ok
    assert "clock is +29.8 s off etcd's at e:2379 (at least 29.2 s" in ahead.reason
    behind = checks.clock(ClockSample(990.0, 990.2, 1000.0, "e:2379"), 5.0)
    assert not behind.ok and "-10.4 s off etcd's at e:2379 (at least 9.8 s" in behind.reason


def test_an_unmeasured_or_unchecked_clock_passes() -> None:
    assert checks.clock(None, 5.0, error="timed out").reason == "not measured (timed out)"
    assert checks.clock(None, 5.0).ok
    far = ClockSample(0.0, 0.1, 1000.0, "e")
    assert checks.clock(far, 0.0).ok  # max_clock_offset_s = 0: not checked


def test_memory_below_the_minimum_fails() -> None:
    r = checks.memory(200 * MB, GB // 2, "MemAvailable")
    assert not r.ok and "200.0 MB of memory available (MemAvailable)" in r.reason
    assert checks.memory(2 * GB, GB // 2, "MemAvailable").ok
    assert checks.memory(None, GB, "no MemAvailable").ok
    assert checks.memory(1, 0, "MemAvailable").ok


def test_a_report_lists_its_failing_checks_and_counts_failures_in_a_row() -> None:
    good = (CheckResult("clock", True, "fine"), CheckResult("memory", True, "fine"))
    bad = (CheckResult("clock", False, "off"), CheckResult("memory", False, "low"))
    first = next_report(bad, None, 1.0)
    assert not first.ok and first.failed_in_a_row == 1
    assert first.summary() == "clock: off; memory: low"
    second = next_report(bad, first, 2.0)
    assert second.failed_in_a_row == 2
    healed = next_report(good, second, 3.0)
    assert healed.ok and healed.failed_in_a_row == 0 and healed.summary() == ""
    assert next_report(bad, healed, 4.0).failed_in_a_row == 1
    assert HealthReport((), 0.0).ok
