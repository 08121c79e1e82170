"""One `phalanx run` daemon: embedded etcd, hang detection, restart budget, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import (
    BIN,
    DAEMON_JOB,
    ROOT,
    alive,
    children,
    start_daemon,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_embedded_default_trains_to_completion_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """No etcd.endpoints: the daemon starts its own etcd and lighthouse, trains, exits 0, cleans up."""
    daemon = start_daemon(
        tmp_path,
        "solo",
        None,
        config=ROOT / "examples" / "single.toml",
        overrides=["train.steps=40"],
    )
    seen: set[int] = set()
    try:
        while daemon.proc.popen.poll() is None:
            seen.update(children(daemon.pid))
            time.sleep(0.2)
        assert daemon.wait(5) == 0, daemon.proc.tail()
    finally:
        daemon.stop()
    names = {e["event"] for e in daemon.events()}
    assert {"etcd_embedded", "leader_elected", "group_started", "train_done"} <= names
    assert daemon.events("train_done")[0]["step"] == 40
    # etcd, the lighthouse and the rank were all children at some point; none survives.
    assert len(seen) >= 3
    time.sleep(1)
    assert [pid for pid in seen if alive(pid)] == []


def test_a_stopped_rank_is_found_by_the_learned_step_timeout_and_a_slow_save_is_not(
    tmp_path: Path, recovery: Callable[[str, float], None]
) -> None:
    """Issue 38: the steady-step hang timeout is learned from step times (floored at
    ft.timeout_s + hang.margin_s), far below node.hang_timeout_s; a checkpoint save that
    takes longer than it (its own phase) is not a hang; a SIGSTOPped rank is."""
    ceiling, save_s = 120.0, 7.0
    daemon = start_daemon(
        tmp_path,
        "hang",
        None,
        overrides=[
            f"node.hang_timeout_s={ceiling}",
            "ft.timeout_s=2",
            "hang.margin_s=1",
            "hang.step_min_s=1",
            "hang.step_samples=10",
            "train.steps=100000",
            f'checkpoint.dir="{tmp_path / "ckpt"}"',
            "checkpoint.interval_steps=60",
        ],
        # The save of step 60 blocks 7 s; the rank stops itself (SIGSTOP) at the forward
        # of its 110th step, after the step's beat and before its quorum.
        env={
            "PHALANX_CHAOS": "checkpoint@60:sleep,forward@+110:stop",
            "PHALANX_CHAOS_SLEEP": f"{save_s}",
        },
    )
    try:

        def learned() -> dict[str, Any] | None:
            doc = daemon.status()
            return doc["hang"] if doc and doc["hang"]["learned"] else None

        hang = wait_for(learned, 120, "the step timeout to be learned")
        assert daemon.step() < 60, "learned only after the slow save: raise the save's step"
        step_timeout = hang["timeouts"]["step"]
        assert step_timeout == 3.0  # the floor: ft.timeout_s + margin (steps take ~0.05 s)
        assert hang["timeouts"]["save"] == ceiling and save_s > 2 * step_timeout
        median, q99 = hang["step_time_median_s"], hang["step_time_quantile_s"]
        pids = daemon.rank_pids()
        wait_for(lambda: daemon.step() > 70, 120, "training past the slow save")
        assert not daemon.events("group_failed"), daemon.events("group_failed")
        assert daemon.rank_pids() == pids
        wait_for(
            lambda: [e for e in daemon.events("checkpoint_saved") if e.get("step") == 60],
            60,
            "the slow save to complete",
        )

        stopped = wait_for(
            lambda: (
                daemon.require_status()["hang"]["phases"] == ["step"]
                and _stopped(pids[0])
                and time.monotonic()
            ),
            120,
            "the rank to stop itself",
        )
        failed = wait_for(lambda: daemon.events("group_failed"), 60, "the hang to be detected")
        detected_after = time.monotonic() - stopped
        assert failed[0]["kind"] == "hung"
        # The timeout that fired is the learned one, not node.hang_timeout_s (the ceiling).
        reason = failed[0]["reason"]
        assert f"no progress for {step_timeout:.1f}s in phase step" in reason, reason
        assert "(its timeout, learned)" in reason, reason
        restarted = wait_for(lambda: daemon.events("group_restarted"), 30, "the restart")
        assert restarted[0]["reason"] == "hang"
        assert set(restarted[0]["pids"]).isdisjoint(pids)
        assert all(not alive(pid) for pid in pids)  # the stopped rank was killed
        # Learned values survive the group's restart.
        assert daemon.require_status()["hang"]["learned"]
        print(
            f"\nlearned step timeout {step_timeout:.2f}s (step time median {median:.3f}s, "
            f"q99 {q99:.3f}s); "
            f"SIGSTOP detected after {detected_after:.2f}s; a {save_s:.0f}s save not flagged"
        )
        recovery("rank hang (SIGSTOP): detected, learned step timeout", detected_after)
    finally:
        daemon.stop()


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (state T in /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def test_a_rank_that_always_crashes_exhausts_the_restart_budget(
    tmp_path: Path, recovery: Callable[[str, float], None]
) -> None:
    daemon = start_daemon(
        tmp_path,
        "crashy",
        None,
        overrides=["node.max_restarts=2", "node.restart_backoff_s=0.2"],
        env={"PHALANX_CHAOS": "start@0:crash"},
    )
    started = time.monotonic()
    try:
        code = daemon.wait(180)
    finally:
        daemon.stop()
    recovery("crash loop: gave up after 2 restarts (exit 1)", time.monotonic() - started)
    assert code == 1
    restarts = daemon.events("group_restarted")
    assert len(restarts) == 2
    delays = [e["delay_s"] for e in daemon.events("state_changed") if e.get("to") == "restarting"]
    assert delays == sorted(delays) and delays[0] < delays[-1]  # exponential backoff
    last = [e for e in daemon.events() if e["event"] != "library_log"][-1]
    assert last["event"] == "daemon_exit" and "injected crash" in last["error"]


def _phalanx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "phalanx"), *args], capture_output=True, text=True, timeout=60)


def test_bad_flags_and_files_exit_2(tmp_path: Path) -> None:
    cases = [
        (["run", "--config", str(tmp_path / "absent.toml")], "does not exist"),
        (["run", "--config", str(DAEMON_JOB), "--set", "node.nproc=zero"], "node.nproc"),
        (["run", "--config", str(DAEMON_JOB), "--set", "job.min_replicas=3"], "job.min_replicas"),
        (
            ["run", "--config", str(DAEMON_JOB), "--set", 'etcd.endpoints=["nohost"]'],
            "etcd.endpoints",
        ),
        (
            ["run", "--config", str(DAEMON_JOB), "--set", "node.nproc=2"],
            "parallel.dp_shard*cp*tp*pp",
        ),
        (
            ["run", "--config", str(DAEMON_JOB), "--set", "etcd.ca_file=/nonexistent.pem"],
            "etcd.ca_file",
        ),
        (["status", "--config", str(DAEMON_JOB), "--set", "lighthouse.nope=1"], "lighthouse.nope"),
    ]
    for argv, field in cases:
        proc = _phalanx(*argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    bad_command = _phalanx("explode")
    assert bad_command.returncode == 2
    for command in ("run", "status", "demo"):
        assert _phalanx(command, "--help").returncode == 0


def test_an_advertised_name_that_does_not_resolve_exits_1_not_2(tmp_path: Path) -> None:
    """DNS may not be up yet (a pod's record, a booting host): systemd must retry it."""
    proc = _phalanx(
        "run",
        "--config",
        str(DAEMON_JOB),
        "--set",
        'node.advertise_host="no-such-host.invalid"',
        "--set",
        f'node.run_dir="{tmp_path / "run"}"',
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "node.advertise_host 'no-such-host.invalid' does not resolve" in lines[0]
    )
    assert not (tmp_path / "run").exists()


def test_a_node_with_a_different_job_file_is_refused(tmp_path: Path, etcd_endpoint: str) -> None:
    first = start_daemon(tmp_path, "first", [etcd_endpoint], overrides=["train.steps=100000"])
    try:
        wait_for(lambda: first.step() > 0, 90, "the first node to train")
        other = start_daemon(
            tmp_path, "other", [etcd_endpoint], overrides=["train.lr=0.1", "model.dim=32"]
        )
        assert other.wait(60) == 2
        failure = other.events("node_failed")[0]["error"]
        assert "different job file" in failure and "model" in failure and "train" in failure
        assert first.proc.popen.poll() is None
    finally:
        first.stop()


def test_a_node_asks_first_for_the_slot_its_run_dir_remembers(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """A daemon restarted on its run_dir claims the slot it held before (its data shard),
    not the lowest free one."""
    (tmp_path / "back").mkdir()
    (tmp_path / "back" / "slot").write_text("1\n")
    d = start_daemon(tmp_path, "back", [etcd_endpoint], overrides=["train.steps=100000"])
    try:
        claimed = wait_for(lambda: d.events("slot_claimed"), 60, "the slot claim")
        assert claimed[0]["slot"] == 1, claimed
        wait_for(lambda: d.status() and d.require_status()["replica_group"] == 1, 30, "status")
    finally:
        d.stop()
    assert (tmp_path / "back" / "slot").read_text() == "1\n"


def test_status_before_any_daemon_is_a_clear_error(tmp_path: Path) -> None:
    proc = _phalanx("status", "--config", str(DAEMON_JOB), "--set", f'node.run_dir="{tmp_path}"')
    assert proc.returncode == 2 and "etcd.endpoints" in proc.stderr


def test_status_with_an_unusable_password_file_is_one_line(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_bytes(b"\xff\xfe")  # not UTF-8
    proc = _phalanx(
        "status",
        "--config",
        str(DAEMON_JOB),
        *("--set", 'etcd.endpoints=["127.0.0.1:2379"]', "--set", "etcd.user=u"),
        *("--set", f'etcd.password_file="{password}"'),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert f"etcd.password_file {password}" in proc.stderr and "Traceback" not in proc.stderr


def test_trainer_module_is_not_imported_by_the_daemon() -> None:
    """The daemon stays light: importing its modules never loads torch."""
    code = "import sys, daemon.cli, daemon.supervision.supervisor, daemon.surfaces.server, daemon.demo; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) is False
