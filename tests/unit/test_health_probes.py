"""What the health checks read from the machine (daemon/health/probes.py, etcd_clock.py,
monitor.py): real directories, a real tmpfs where this user may mount one, a stand-in
nvidia-smi on PATH, made-up /proc and cgroup files, and a local HTTP server for etcd's
Date header."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from daemon.config import load_daemon_config
from daemon.health import CHAOS_CLOCK, CHECKS, HealthMonitor, HealthSettings, run_checks
from daemon.health.checks import CheckResult
from daemon.health.etcd_clock import EtcdAccess, read_clock
from daemon.health.probes import (
    available_memory,
    count_cpus,
    count_gpus,
    injected_offset,
    newest_checkpoint_bytes,
    probe_checkpoint_dir,
    unmarked_bytes,
)
from tests.support.volumes import tmpfs
from trainer.contracts.checkpoint_names import MARKER

JOB = Path(__file__).parents[1] / "integration" / "daemon_job.toml"


def marker(step_dir: Path, sizes: list[int], mtime: float) -> None:
    step_dir.mkdir(parents=True)
    files = {f"f{i}": {"size": n, "sha256": "0"} for i, n in enumerate(sizes)}
    (step_dir / MARKER).write_text(json.dumps({"step": 1, "files": files}))
    os.utime(step_dir / MARKER, (mtime, mtime))


def test_a_writable_directory_is_created_probed_and_left_clean(tmp_path: Path) -> None:
    job_dir = tmp_path / "ckpt" / "itest"
    f = probe_checkpoint_dir(job_dir, "node-a")
    assert f.error is None and f.free_bytes and f.newest_bytes is None
    assert job_dir.is_dir() and list(job_dir.iterdir()) == []


def test_a_directory_under_a_file_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    f = probe_checkpoint_dir(tmp_path / "file" / "job", "node-a")
    assert f.error == "Not a directory"


def test_the_newest_complete_checkpoint_of_any_run_sizes_the_next_save(tmp_path: Path) -> None:
    assert newest_checkpoint_bytes(tmp_path) is None
    marker(tmp_path / "run-a" / "step-10", [100, 200], mtime=1000.0)
    marker(tmp_path / "run-b" / "step-5", [7, 8], mtime=2000.0)
    assert newest_checkpoint_bytes(tmp_path) == 15
    broken = tmp_path / "run-b" / "step-6"
    broken.mkdir()
    (broken / MARKER).write_text("{not json")
    os.utime(broken / MARKER, (3000.0, 3000.0))
    assert newest_checkpoint_bytes(tmp_path) == 15  # a marker it cannot read is passed over


def test_a_save_under_way_is_what_the_step_directories_newer_than_any_marker_hold(
    tmp_path: Path,
) -> None:
    marker(tmp_path / "run-a" / "step-10", [100], mtime=2000.0)
    old = tmp_path / "run-a" / "step-5"  # a partial save older than the marker: not counted
    old.mkdir()
    (old / "shard").write_bytes(b"x" * 50)
    os.utime(old, (1000.0, 1000.0))
    assert unmarked_bytes(tmp_path) == 0
    saving = tmp_path / "run-a" / "step-20" / "sub"
    saving.mkdir(parents=True)
    (saving / "shard").write_bytes(b"x" * 30)
    (saving.parent / "other").write_bytes(b"x" * 12)
    assert unmarked_bytes(tmp_path) == 42
    assert probe_checkpoint_dir(tmp_path, "n").pending_bytes == 42


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[tuple[Path, object]]:
    with tmpfs(tmp_path / "vol", "4m") as writable:
        yield tmp_path / "vol", writable


def test_a_read_only_then_full_volume_is_seen_and_then_its_recovery(
    volume: tuple[Path, object],
) -> None:
    path, writable = volume
    writable(False)  # type: ignore[operator]
    f = probe_checkpoint_dir(path / "job", "n")
    assert f.error == "Read-only file system"
    writable(True)  # type: ignore[operator]
    with (path / "filler").open("wb") as out:
        os.posix_fallocate(out.fileno(), 0, (f.free_bytes or 0) - 4096)
    full = probe_checkpoint_dir(path / "job", "n")
    assert full.error is None or "No space" in full.error
    assert (full.free_bytes or 0) <= 4096
    (path / "filler").unlink()
    assert probe_checkpoint_dir(path / "job", "n").free_bytes == f.free_bytes


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, code: int = 0) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {code}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_gpus_are_counted_from_nvidia_smi_within_cuda_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = "GPU 0: NVIDIA H100 (UUID: GPU-a)\n  MIG 1g.10gb Device 0: (UUID: MIG-b)\nGPU 1: NVIDIA H100 (UUID: GPU-c)"
    fake_smi(tmp_path, monkeypatch, listing)
    f = count_gpus(None)
    assert (f.kind, f.count, f.source, f.error) == ("cuda", 2, "nvidia-smi -L", None)
    narrowed = count_gpus("1")
    assert narrowed.count == 1 and "CUDA_VISIBLE_DEVICES" in narrowed.source


def test_a_gpu_nvidia_smi_cannot_reach_or_a_failing_nvidia_smi_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = "GPU 0: NVIDIA H100 (UUID: GPU-a)\nUnable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    fake_smi(tmp_path, monkeypatch, lost)
    assert (count_gpus(None).error or "").startswith("Unable to determine the device handle")
    fake_smi(tmp_path, monkeypatch, "Failed to initialize NVML: Driver/library mismatch", 9)
    assert count_gpus(None).error == (
        "nvidia-smi -L exited 9: Failed to initialize NVML: Driver/library mismatch"
    )


def test_cpu_cores_are_the_affinity() -> None:
    assert count_cpus().count == len(os.sched_getaffinity(0))


def test_memory_is_mem_available_or_what_the_cgroup_leaves(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemAvailable:     2048 kB\n")
    assert available_memory(meminfo, tmp_path / "none") == (2048 * 1024, "MemAvailable")
    assert available_memory(tmp_path / "absent", tmp_path / "none")[0] is None


def test_the_injected_clock_offset_is_read_at_every_check(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    assert injected_offset(None) == (0.0, None)
    assert injected_offset(str(path)) == (0.0, None)  # no file: nothing injected
    path.write_text("-42.5\n")
    assert injected_offset(str(path)) == (-42.5, None)
    path.write_text("soon")
    value, error = injected_offset(str(path))
    assert value == 0.0 and error and "holds 'soon', not seconds" in error


class _Dated(BaseHTTPRequestHandler):
    skew_s = 0.0

    def do_GET(self) -> None:
        body = b'{"etcdserver":"3.5.1"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def date_time_string(self, timestamp: float | None = None) -> str:
        return formatdate(time.time() + self.skew_s, usegmt=True)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def etcd_http() -> Iterator[tuple[str, type[_Dated]]]:
    handler = type("Dated", (_Dated,), {"skew_s": 0.0})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_etcds_clock_is_read_from_the_date_of_its_answer(
    etcd_http: tuple[str, type[_Dated]],
) -> None:
    endpoint, handler = etcd_http
    sample, why = read_clock(EtcdAccess(("127.0.0.1:1", endpoint), timeout_s=2.0))
    assert sample is not None and why == "" and sample.endpoint == endpoint
    assert sample.sent <= sample.received and abs(sample.etcd_date - sample.sent) < 2
    handler.skew_s = -100.0
    behind, _ = read_clock(EtcdAccess((endpoint,)))
    assert behind is not None and 98 < behind.sent - behind.etcd_date < 102
    none, why = read_clock(EtcdAccess(("127.0.0.1:1",), timeout_s=1.0))
    assert none is None and why.startswith("127.0.0.1:1: ConnectionRefusedError")


def test_every_check_runs_from_the_job_files_settings(
    tmp_path: Path, etcd_http: tuple[str, type[_Dated]]
) -> None:
    endpoint, handler = etcd_http
    overrides = [
        f'node.run_dir="{tmp_path / "run"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        "health.min_free_gb=0.001",
        "health.min_free_memory_gb=0.001",
    ]
    cfg = load_daemon_config(JOB, overrides, node_id="node-a")
    offset = tmp_path / "offset"
    env = {CHAOS_CLOCK: str(offset)}
    settings = HealthSettings.of(cfg, [endpoint], "cpu", env)
    assert settings.checkpoint_dir == tmp_path / "ckpt" / "itest"
    results = run_checks(settings)
    assert [r.name for r in results] == list(CHECKS) and all(r.ok for r in results), results
    offset.write_text("3600")
    clock = {r.name: r for r in run_checks(settings)}["clock"]
    assert not clock.ok and "off etcd's at" in clock.reason
    offset.unlink()
    handler.skew_s = 3600.0  # etcd's own clock an hour ahead
    assert not {r.name: r for r in run_checks(settings)}["clock"].ok


def test_on_cuda_the_layout_wants_node_nproc_gpus_unless_health_devices_says(
    tmp_path: Path,
) -> None:
    cfg = load_daemon_config(JOB, [f'node.run_dir="{tmp_path}"'], node_id="node-a")
    cuda = HealthSettings.of(cfg, ["e:1"], "cuda", {})
    assert (cuda.wanted_devices, cuda.devices_field) == (1, "node.nproc")
    cfg = load_daemon_config(JOB, [f'node.run_dir="{tmp_path}"', "health.devices=8"], "node-a")
    assert HealthSettings.of(cfg, ["e:1"], "cuda", {}).wanted_devices == 8
    assert HealthSettings.of(cfg, ["e:1"], "cpu", {}).devices_field == "health.devices"


def test_the_monitor_publishes_each_run_counts_failures_and_wakes_the_loop(
    tmp_path: Path,
) -> None:
    cfg = load_daemon_config(JOB, [f'node.run_dir="{tmp_path}"'], node_id="node-a")
    verdicts = [False, False, True]
    woken: list[int] = []

    def run(_: HealthSettings) -> tuple[CheckResult, ...]:
        return (CheckResult("clock", verdicts.pop(0) if verdicts else True, "r"),)

    monitor = HealthMonitor(
        HealthSettings.of(cfg, ["e:1"], "cpu", {}), 0.01, lambda: woken.append(1), run
    )
    assert monitor.latest is None
    assert monitor.check_now().failed_in_a_row == 1
    assert monitor.check_now().failed_in_a_row == 2
    assert monitor.check_now().ok and len(woken) == 3
    monitor.start()
    first = monitor.latest
    deadline = time.monotonic() + 5
    while monitor.latest is first and time.monotonic() < deadline:
        time.sleep(0.01)
    monitor.stop()
    assert monitor.latest is not first and monitor.latest is not None and monitor.latest.ok
