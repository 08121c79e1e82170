"""Two `phalanx run` daemons on one real etcd: failures of ranks, daemons, the leader and etcd itself."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from daemon.coordination.progress import PROGRESS_EVERY_S
from tests.support.etcd_control import ControlledEtcd
from tests.support.harness import (
    BIN,
    DAEMON_JOB,
    HOLD_PACE_S,
    PACE_S,
    Daemon,
    Event,
    alive,
    event_time,
    hurry,
    job_groups,
    largest_step_gap,
    slow,
    start_daemon,
    wait_for,
)
from tests.support.job_queries import digest, status_json

pytestmark = pytest.mark.integration


def pair(
    tmp_path: Path,
    endpoint: str,
    steps: int,
    env: dict[str, str] | None = None,
    pace_s: float = PACE_S,
) -> tuple[Daemon, Daemon]:
    overrides = [f"train.steps={steps}"]
    a = start_daemon(tmp_path, "node-a", [endpoint], overrides=overrides, env=env, pace_s=pace_s)
    b = start_daemon(tmp_path, "node-b", [endpoint], overrides=overrides, env=env, pace_s=pace_s)
    wait_for(lambda: a.step() > 3 and b.step() > 3, 120, "both groups to train")
    return a, b


def after(events: list[Event], first: Event) -> list[Event]:
    """Events that come after `first` in the same log."""
    return events[events.index(first) + 1 :]


def assert_structured_log(path: Path, slot: int) -> None:
    """Every line the daemon wrote is one JSON event with its context; the lifecycle
    events of a run with a restart are there with their fields."""
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]  # fails on any line that is not JSON
    for e in events:
        assert {"event", "time", "level", "job", "node"} <= set(e), e
    by_name: dict[str, list[Event]] = {}
    for e in events:
        by_name.setdefault(e["event"], []).append(e)
    started = by_name["group_started"][0]
    assert started["slot"] == slot and started["attempt"] == 1 and started["pids"]
    restarted = by_name["group_restarted"][0]
    assert restarted["reason"] == "rank_exit" and restarted["attempt"] == 2 and restarted["pids"]
    assert restarted["replica_group"] == slot
    healed = by_name["heal_done"][-1]
    assert healed["step"] > 0 and healed["seconds"] >= 0 and healed["rank"] == 0
    assert healed["replica_group"] == slot
    done = by_name["train_done"][0]
    assert done["replica_group"] == slot and done["rank"] == 0 and done["step"] == 160
    assert len(done["params_sha256"]) == 64 and isinstance(done["loss"], float)


def solo_steps_since(d: Daemon, step: int) -> list[int]:
    return [
        int(e["step"])
        for e in d.events("train_step")
        if e["participants"] == 1 and e["step"] > step
    ]


def test_killed_rank_is_restarted_and_healed_while_the_peer_is_untouched(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    a, b = pair(tmp_path, etcd_endpoint, steps=160)
    try:
        a_pids = a.rank_pids()
        # `phalanx status` while the run is going. A node's progress carries a new step at
        # most every PROGRESS_EVERY_S (daemon/coordination/progress.py) after its first.
        wait_for(
            lambda: int(status_json(etcd_endpoint)["step"]) > 0,
            3 * PROGRESS_EVERY_S,
            "phalanx status to show the step",
        )
        doc = status_json(etcd_endpoint)
        nodes = {n["id"]: n for n in doc["nodes"]}
        assert set(nodes) == {"node-a", "node-b"}
        assert {nodes["node-a"]["group"], nodes["node-b"]["group"]} == {0, 1}
        assert doc["leader"] in nodes and doc["lighthouse"] and int(doc["step"]) > 0
        table = subprocess.run(
            [str(BIN / "phalanx"), "status", "--config", str(DAEMON_JOB), "--set", f'etcd.endpoints=["{etcd_endpoint}"]'],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert "node-a" in table and "node-b" in table and "leader" in table

        # Paced while node-b's rank restarts (cold here: the tests' job has no standbys):
        # at PACE_S node-a once finished the job's last 40 steps before it was back.
        slow(a, b)
        victim = b.rank_pids()[0]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        restarted = wait_for(lambda: b.events("group_restarted"), 60, "node-b's group to restart")
        assert restarted[0]["reason"] == "rank_exit" and victim not in restarted[0]["pids"]
        wait_for(
            lambda: (
                after(b.events(), restarted[0])
                and any(e["event"] == "heal_done" for e in after(b.events(), restarted[0]))
            ),
            90,
            "node-b to heal from node-a",
        )
        hurry(a, b)
        assert a.wait(180) == 0, a.proc.tail()
        assert b.wait(60) == 0, b.proc.tail()
    finally:
        a.stop()
        b.stop()
    healed = next(e for e in after(b.events(), restarted[0]) if e["event"] == "heal_done")
    recovery("rank SIGKILL: group restarted", event_time(restarted[0]) - killed_at)
    recovery("rank SIGKILL: group healed from its peer", event_time(healed) - killed_at)
    recovery("rank SIGKILL: peer group's longest pause", largest_step_gap(a.events(), killed_at))
    assert digest(a) == digest(b)
    assert_structured_log(b.proc.stderr, slot=int(restarted[0]["slot"]))
    assert not a.events("group_restarted")  # node-a's ranks were never restarted
    assert a.events("group_started")[0]["pids"] == a_pids


def test_killed_daemon_takes_its_ranks_along_and_a_new_one_rejoins(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    """SIGKILL the leader's daemon: its ranks and lighthouse die with it, the survivor takes
    over leadership, and a replacement daemon for the dead node joins the new lighthouse's
    quorums and heals (a lighthouse numbers its quorums anew, so this also checks that a
    rendezvous never reuses a dead peer's store keys)."""
    a, b = pair(tmp_path, etcd_endpoint, steps=160, pace_s=HOLD_PACE_S)  # under 80 spent waiting
    victim, survivor = (a, b) if a.require_status()["leader"] else (b, a)
    replacement: Daemon | None = None
    try:
        ranks = victim.rank_pids()
        slot = int(victim.require_status()["replica_group"])
        os.kill(victim.pid, signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        wait_for(lambda: not any(alive(p) for p in ranks), 10, "the ranks to die with their daemon")
        orphans_gone_s = time.monotonic() - killed
        step = survivor.step()
        wait_for(lambda: solo_steps_since(survivor, step), 60, "the survivor to commit steps alone")
        # The slot frees when the dead daemon's lease expires (TTL 4 s).
        wait_for(
            lambda: slot not in job_groups(etcd_endpoint), 30, "the dead node's slot to free", 0.05
        )
        recovery("daemon SIGKILL: its slot freed (etcd lease TTL 4 s)", time.monotonic() - killed)
        wait_for(lambda: survivor.require_status()["leader"], 30, "the survivor to lead")
        rejoined_at = time.time()
        replacement = start_daemon(
            tmp_path,
            victim.node_id,
            [etcd_endpoint],
            overrides=["train.steps=160"],
            name="replacement",
            pace_s=HOLD_PACE_S,
        )
        wait_for(lambda: replacement.events("heal_done"), 120, "the replacement to heal")
        hurry(replacement, survivor)
        assert replacement.wait(240) == 0, replacement.proc.tail()
        assert survivor.wait(60) == 0, survivor.proc.tail()
        assert orphans_gone_s < 5
    finally:
        for d in (a, b, replacement):
            if d is not None:
                d.stop()
    assert replacement.events("heal_done")
    # Nothing hung: neither group was ever restarted.
    assert not survivor.events("group_failed") and not replacement.events("group_failed")
    assert digest(survivor) == digest(replacement)
    recovery("daemon SIGKILL: its ranks gone (no orphans)", orphans_gone_s)
    recovery(
        "daemon SIGKILL: peer group's longest pause", largest_step_gap(survivor.events(), killed_at)
    )
    recovery(
        "daemon SIGKILL: replacement started -> healed",
        event_time(replacement.events("heal_done")[0]) - rejoined_at,
    )


def test_leader_failover_keeps_the_survivors_ranks(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    a, b = pair(tmp_path, etcd_endpoint, steps=160)  # it waits for 20 steps: paced as usual
    try:
        leader, other = (a, b) if a.require_status()["leader"] else (b, a)
        assert other.require_status()["leader"] is False
        survivor_pids = other.rank_pids()
        old_lighthouse = int(leader.events("lighthouse_started")[-1]["pid"])
        killed_at = time.time()
        os.kill(leader.pid, signal.SIGKILL)
        wait_for(lambda: not alive(old_lighthouse), 5, "the old leader's lighthouse to die with it")
        took_over = wait_for(
            lambda: other.events("lighthouse_started"), 30, "the survivor to start a lighthouse"
        )
        assert other.require_status()["leader"] is True
        at = other.step()
        wait_for(lambda: other.step() >= at + 20, 90, "training to continue after the failover")
        hurry(other)
        assert other.wait(180) == 0, other.proc.tail()
        assert took_over
    finally:
        a.stop()
        b.stop()
    assert not other.events("group_restarted") and not other.events("group_failed")
    assert other.events("group_started")[0]["pids"] == survivor_pids
    assert other.events("train_done")[0]["step"] == 160
    recovery("leader SIGKILL: new leader's lighthouse up", event_time(took_over[0]) - killed_at)
    recovery(
        "leader SIGKILL: survivor's longest pause", largest_step_gap(other.events(), killed_at)
    )


def test_etcd_outage_does_not_restart_ranks(
    tmp_path: Path, etcd: ControlledEtcd, recovery: Callable[[str, float], None]
) -> None:
    # The fence pauses the ranks for most of the long outage (at about step 20 here, at
    # HOLD_PACE_S), so 120 steps leave a tail after it long enough to see the pair train
    # and agree.
    a, b = pair(tmp_path, etcd.endpoint, steps=120, pace_s=HOLD_PACE_S)
    try:
        pids = {d.node_id: d.rank_pids() for d in (a, b)}
        # An outage well inside the lease (1 s of a 4 s TTL, refreshed every tick while
        # etcd answers; the fence comes 1 s before the TTL) does not even pause training.
        etcd.pause()
        time.sleep(1.0)
        etcd.resume()
        wait_for(lambda: a.step() > 10 and b.step() > 10, 60, "training")
        assert not a.events("fenced") and not b.events("fenced")
        # A longer one (10 s) may pause the ranks (SIGSTOP, fenced), never restart them.
        leader = a if a.require_status()["leader"] else b
        etcd.stop()
        stopped, stopped_at = time.monotonic(), time.time()
        steps = a.step()
        time.sleep(5)
        assert a.step() > steps  # training goes on while etcd is away
        time.sleep(max(0.0, 10 - (time.monotonic() - stopped)))
        etcd.restart()
        back_at = time.time()
        for d in (a, b):
            wait_for(functools.partial(d.events, "unfenced"), 60, f"{d.node_id} to unfence")
        wait_for(
            lambda: len(status_json(etcd.endpoint)["nodes"]) == 2, 30, "both nodes in etcd again"
        )
        # The lighthouse address is published again (a node joining now must find it).
        wait_for(
            lambda: status_json(etcd.endpoint)["lighthouse"], 10, "the lighthouse to be republished"
        )
        hurry(a, b)
        assert a.wait(240) == 0, a.proc.tail()
        assert b.wait(60) == 0, b.proc.tail()
    finally:
        a.stop()
        b.stop()
    for d in (a, b):
        assert d.events("etcd_unavailable")
        # The restarted etcd restored the leases: each node keeps its own (and so its
        # slot and keys), and the leader keeps leading on its own lighthouse port.
        assert [e["lease"] for e in d.events("unfenced")] == ["kept"], d.node_id
        assert not d.events("etcd_session_renewed") and not d.events("lighthouse_failed")
        assert not d.events("group_restarted") and not d.events("group_failed")
        assert d.events("group_started")[0]["pids"] == pids[d.node_id]
        assert d.events("group_paused") and d.events("group_resumed"), d.node_id
    assert digest(a) == digest(b)
    # The leader's lighthouse, stopped at the fence, came back on its port; the other
    # node never led while the leader ran (each log's events carry the logging node). Once
    # the leader has resigned at the job's end, the other may lead for its last moments
    # (seen in CI: elected 23 ms before the leader's daemon_exit, after it resigned).
    left = event_time(leader.events("leader_resigned")[-1])
    ports = [e["port"] for e in leader.events("lighthouse_started")]
    assert len(ports) == 2 and ports[0] == ports[1], ports
    elected = [e for d in (a, b) for e in d.events("leader_elected") if event_time(e) < left]
    assert all(e["node"] == leader.node_id for e in elected), elected
    unfenced = max(event_time(d.events("unfenced")[0]) for d in (a, b))
    recovery("etcd outage 10 s: both daemons unfenced after etcd returned", unfenced - back_at)
    recovery(
        "etcd outage 10 s: longest training pause",
        max(largest_step_gap(d.events(), stopped_at) for d in (a, b)),
    )


def test_a_node_back_late_from_an_etcd_outage_is_not_restarted(
    tmp_path: Path, etcd: ControlledEtcd
) -> None:
    """After a long etcd outage the follower's daemon is held (SIGSTOP) until half a
    second after the leader's lighthouse is back: a restarted lighthouse, whose quorums
    are numbered from 1 again; the leader's group may go on alone. The late group
    resumes into that: both keep their leases (back within the TTL that the restarted
    etcd gave them) and no group is restarted.

    Not asserted: that no collective waits out ``ft.timeout_s``. A rank whose quorum
    answer was lost when the fence stopped the lighthouse (1 run in 4 here) still waits
    in that step's collective until the timeout that started before the pause; a rank
    on a stale process group after a renumbered quorum, which waited a whole timeout
    after the resume and so raced the hang detector, is shown gone by
    tests/integration/test_quorum_renumbering.py."""
    a, b = pair(tmp_path, etcd.endpoint, steps=120, pace_s=HOLD_PACE_S)
    try:
        wait_for(lambda: a.step() > 10 and b.step() > 10, 60, "training")
        leader, late = (a, b) if a.require_status()["leader"] else (b, a)
        etcd.stop()
        time.sleep(10)
        os.kill(late.proc.popen.pid, signal.SIGSTOP)
        try:
            etcd.restart()
            wait_for(
                lambda: len(leader.events("lighthouse_started")) == 2,
                60,
                "the leader's lighthouse to be back",
            )
            time.sleep(0.5)  # the leader's group may form a quorum alone meanwhile
        finally:
            os.kill(late.proc.popen.pid, signal.SIGCONT)
        for d in (a, b):
            wait_for(functools.partial(d.events, "group_resumed"), 60, f"{d.node_id} to resume")
        hurry(a, b)
        assert a.wait(240) == 0, a.proc.tail()
        assert b.wait(60) == 0, b.proc.tail()
    finally:
        a.stop()
        b.stop()
    for d in (a, b):
        assert d.events("fenced") and d.events("group_resumed"), d.node_id
        assert not d.events("group_restarted") and not d.events("group_failed"), d.node_id
        assert [e["lease"] for e in d.events("unfenced")] == ["kept"], d.node_id
    assert digest(a) == digest(b)


def test_sigterm_drains_the_leader_and_the_other_continues(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    """SIGTERM the leader's daemon: its ranks leave after a step, it exits 0 and takes its
    lighthouse with it (process gone, port free), and the other node leads and goes on."""
    a, b = pair(tmp_path, etcd_endpoint, steps=130, pace_s=HOLD_PACE_S)
    try:
        if not b.require_status()["leader"]:
            a, b = b, a  # b: the leader, drained
        started = b.events("lighthouse_started")[-1]
        lighthouse, port = int(started["pid"]), int(started["port"])
        b_slot = str(b.require_status()["replica_group"])
        b.proc.popen.send_signal(signal.SIGTERM)
        sent, sent_at = time.monotonic(), time.time()
        assert b.wait(15 + 5) == 0, b.proc.tail()
        drained_in = time.monotonic() - sent
        assert drained_in < 15  # node.drain_grace_s
        assert b.events("train_stopped"), "the ranks should leave after a step, not be killed"
        assert not alive(lighthouse), "the drained leader's lighthouse outlived it"
        with socket.socket() as s:  # its port is free again (a listener would refuse this)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))
        # The slot is released at once (the lease would keep it for its 4 s TTL).
        assert b_slot not in status_json(etcd_endpoint)["groups"]
        wait_for(lambda: a.events("lighthouse_started"), 30, "the other node to lead")
        step = a.step()
        wait_for(lambda: solo_steps_since(a, step), 60, "the other node to continue alone")
        hurry(a)
        assert a.wait(180) == 0, a.proc.tail()
    finally:
        a.stop()
        b.stop()
    recovery("SIGTERM drain: daemon exited 0", drained_in)
    recovery("SIGTERM drain: peer group's longest pause", largest_step_gap(a.events(), sent_at))
