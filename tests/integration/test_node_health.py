"""Node health (issue 38): each check fails on purpose, the node stays out with the reason
shown, and it claims a seat and trains once everything is fixed, without a restart.

One daemon against a real etcd. Its checkpoint directory is a small tmpfs, read-only and
then full; it starts narrowed to one CPU while ``health.devices`` wants every CPU this
test may use; and an hour's clock offset is injected through
``PHALANX_CHAOS_CLOCK_OFFSET_FILE``. While any check fails the node holds no seat, and
``/status``, ``/readyz``, ``phalanx_node_healthy`` and ``phalanx status`` name the failing
checks with their reasons. Fixed one at a time, the node claims once the last one passes.
A read-only volume while it runs is shown the same way, but a node whose group trains alone
keeps its seat and trains on (nobody else would carry the job).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.affinity import pinned, set_tree_affinity
from tests.support.harness import Daemon, event_time, start_daemon, wait_for
from tests.support.job_queries import status_table
from tests.support.volumes import fill, tmpfs

pytestmark = pytest.mark.integration

ALL = {"checkpoint_dir", "devices", "clock", "memory"}


def failing(d: Daemon) -> dict[str, str]:
    """The failing checks on /status, by name, with their reasons."""
    doc = d.status() or {}
    checks: dict[str, Any] = (doc.get("health") or {}).get("checks") or {}
    return {name: c["reason"] for name, c in checks.items() if not c["ok"]}


def healthy_metric(d: Daemon) -> dict[str, float]:
    code, text = d.get("/metrics")
    assert code == 200
    found = re.findall(r'^phalanx_node_healthy\{[^}]*check="([a-z_]+)"[^}]*\} (\S+)$', text, re.M)
    return {check: float(value) for check, value in found}


def assert_out(d: Daemon, endpoint: str, reasons: dict[str, str]) -> None:
    """The node holds no seat, and every surface names each failing check and why."""
    # The report is taken at the start of a tick and waiting_for set by its handler.
    doc = wait_for(
        lambda: (s := d.require_status()) and "the node to be healthy" in s["waiting_for"] and s,
        5,
        "the waiting reason to name the health checks",
    )
    assert doc["state"] == "claiming" and doc["replica_group"] is None, doc
    said = [str(e.get("waiting_for")) for e in d.events("waiting")]  # in the log, too
    assert any(w.startswith("the node to be healthy (failing: ") for w in said), said

    def agreed() -> tuple[int, str] | None:
        """/readyz read between two equal readings of /status: both from one health
        report (it is taken again every health.interval_s, and the clock's reason carries
        a measurement that moves with each), and /readyz naming each check as it does."""
        before = failing(d)
        code, body = d.get("/readyz")
        if failing(d) != before or set(before) != set(reasons):
            return None
        return (
            (code, body) if all(f"unhealthy: {n}: {r}" in body for n, r in before.items()) else None
        )

    code, body = wait_for(agreed, 10, "/readyz to name each failing check as /status does")
    assert code == 503 and body.startswith("claiming\n"), body
    metric = healthy_metric(d)
    assert set(metric) == ALL
    assert {c for c, v in metric.items() if v == 0.0} == set(reasons), metric
    table = wait_for(
        lambda: (t := status_table(endpoint)) and all(f": {n}: " in t for n in reasons) and t,
        10,
        "phalanx status to show the failing checks",
    )
    for name in reasons:
        assert f"{d.node_id} is unhealthy: {name}: " in table, table
    assert not d.events("slot_claimed")


def test_each_failed_check_keeps_the_node_out_until_fixed_then_it_trains(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs, to start the daemon on one of them")
    ckpt, offset = tmp_path / "ckpt", tmp_path / "clock_offset"
    offset.write_text("3600\n")
    overrides = [
        f'checkpoint.dir="{ckpt}"',
        "health.interval_s=0.5",
        f"health.devices={len(cpus)}",
        "health.min_free_gb=0.004",  # 4 MB before the first checkpoint
        "train.steps=100000",
    ]
    env = {"PHALANX_CHAOS_CLOCK_OFFSET_FILE": str(offset)}
    with tmpfs(ckpt, "16m") as writable:
        writable(False)
        with pinned(cpus[:1]):
            d = start_daemon(tmp_path, "patient", [etcd_endpoint], overrides=overrides, env=env)
        try:
            # A read-only checkpoint volume, one CPU of the ones wanted, a clock an hour ahead.
            reasons = wait_for(
                lambda: (
                    (f := failing(d)) and set(f) == {"checkpoint_dir", "devices", "clock"} and f
                ),
                30,
                "three failing checks",
            )
            assert "cannot be written (Read-only file system)" in reasons["checkpoint_dir"]
            assert (
                f"1 CPU core (CPU affinity), health.devices wants {len(cpus)}"
                in (reasons["devices"])
            )
            clock = reasons["clock"]
            assert re.search(r"clock is \+(3599|3600)\.\d s off etcd's at 127\.0\.0\.1:", clock)
            assert "health.max_clock_offset_s = 5" in clock, clock
            assert_out(d, etcd_endpoint, reasons)

            # Writable again, but full: the space is what is missing now.
            writable(True)
            filler = fill(ckpt, leave=1_000_000)
            full = wait_for(
                lambda: (
                    "free, the next save needs 4.0 MB" in failing(d).get("checkpoint_dir", "")
                    and failing(d)
                ),
                10,
                "the full volume reported",
            )
            assert_out(d, etcd_endpoint, full)

            # Room again and every CPU back: only the clock keeps it out.
            filler.unlink()
            set_tree_affinity(d.pid, cpus)
            clock_only = wait_for(
                lambda: set(f := failing(d)) == {"clock"} and f, 10, "only the clock to fail"
            )
            assert_out(d, etcd_endpoint, clock_only)

            # The clock fixed: the node claims a seat and its group trains.
            offset.unlink()
            fixed = time.time()
            wait_for(lambda: d.step() >= 3, 120, "the group to train")
            claimed = event_time(d.events("slot_claimed")[0]) - fixed
            recovery("unhealthy node: seat claimed after the fix (interval 0.5 s)", claimed)
            assert d.get("/readyz") == (200, "ready\n")
            assert set(healthy_metric(d).values()) == {1.0}
            assert not d.events("seat_given_back")

            # Read-only while running: shown, but a group that trains alone keeps its seat.
            writable(False)
            wait_for(
                lambda: set(failing(d)) == {"checkpoint_dir"}, 10, "the running node unhealthy"
            )
            code, body = d.get("/readyz")
            assert code == 503 and body.startswith("running\nunhealthy: checkpoint_dir: "), body
            wait_for(
                lambda: d.require_status()["health"]["failed_in_a_row"] > 3,
                10,
                "more failures in a row than health.leave_after (3)",
            )
            step = d.step()
            wait_for(lambda: d.step() > step + 3, 60, "training to go on")
            assert d.require_status()["state"] == "running"
            assert not d.events("seat_given_back") and not d.events("group_restarted")
        finally:
            d.stop()
            writable(True)


def test_a_running_node_makes_way_for_the_healthy_and_heals_back_in_once_fixed(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    """node-b's clock goes an hour off while both groups train: after health.leave_after
    failed checks in a row it stops its group and gives its seat back, since node-a's
    group carries the job; node-a trains on alone; the clock fixed, node-b claims a seat
    again and its group heals from node-a's."""
    offset = tmp_path / "clock_offset"
    job = ["train.steps=100000"]
    health = ["health.interval_s=0.5", "health.leave_after=3"]
    env = {"PHALANX_CHAOS_CLOCK_OFFSET_FILE": str(offset)}
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=job)
    b = start_daemon(tmp_path, "node-b", [etcd_endpoint], overrides=[*job, *health], env=env)
    try:
        wait_for(
            lambda: all((d.status() or {}).get("participants") == 2 for d in (a, b)),
            120,
            "both groups in one quorum",
        )
        offset.write_text("3600\n")
        broken = time.time()
        given = wait_for(lambda: b.events("seat_given_back"), 20, "node-b to give its seat back")
        recovery(
            "unhealthy running node: seat given back (leave_after 3)", event_time(given[0]) - broken
        )
        assert given[0]["why"] == "unhealthy"
        stopping = b.events("group_stopping")
        assert stopping and stopping[-1]["reason"].startswith("clock: this node's clock is +"), (
            stopping
        )
        out = wait_for(
            lambda: (s := b.require_status())["state"] == "claiming" and s,
            10,
            "node-b out",
        )
        assert out["replica_group"] is None and "failing: clock" in out["waiting_for"]
        step = a.step()
        wait_for(lambda: a.step() > step + 5, 60, "node-a to train on alone")
        assert not b.events("group_restarted") and not a.events("group_restarted")

        heals = len(b.events("heal_done"))  # its first start may have healed too
        offset.unlink()
        fixed = time.time()
        wait_for(lambda: len(b.events("slot_claimed")) >= 2, 20, "node-b to claim again")
        wait_for(
            lambda: all((d.status() or {}).get("participants") == 2 for d in (a, b)),
            120,
            "both groups in one quorum again",
        )
        assert len(b.events("heal_done")) > heals, b.proc.tail()
        healed = event_time(b.events("heal_done")[heals]) - fixed
        recovery("unhealthy node made way: healed back in after the fix", healed)
        assert b.get("/readyz") == (200, "ready\n")
    finally:
        a.stop()
        b.stop()
