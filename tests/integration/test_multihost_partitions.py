"""Network partitions across hosts (each a network namespace): one history survives.

The rule (DESIGN.md, "Partitions"): at most one set of groups commits steps that
survive. A host cut off long enough for its lease to be in doubt is fenced (its
lighthouse stopped, its ranks paused); the majority elects a leader and goes on;
after the partition heals every group converges to the majority's history.

A group's committed steps are its ``train_step`` events (one per commit, with the
quorum's participants); a heal is a ``heal_done`` event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import (
    Daemon,
    Proc,
    event_time,
    hurry,
    largest_step_gap,
    slow,
    start_daemon,
    wait_for,
)
from tests.support.job_queries import digest
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on, wait_all_commit_together
from tests.support.netns import Host, Network

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]

# Enough steps to outlast both partitions: with the 1 s default heartbeat timeout the
# majority barely pauses at a cut, and 350 steps at PACE_S (about 0.1 s each here) were
# once all done while an etcd-only cut was still held. From the first cut the job is
# paced at HOLD_PACE_S (about 0.3 s a step): about 120 steps were spent in all here.
# The test fails if training ends first.
STEPS = 300
OVERRIDES = [
    "job.max_replicas=3",
    "ft.timeout_s=8",  # a silent peer (a cut, not a kill) fails a collective only by timeout
    "ft.quorum_timeout_s=30",
]


def three_hosts(
    tmp_path: Path, network: Network, steps: int, started: list[tuple[Host, Daemon]]
) -> Proc:
    """etcd on a host of its own and a daemon on each of hosts a, b, c (appended to
    `started` as they start, for the caller to stop); returns etcd once all three
    groups have committed a step together."""
    etcd_host = network.add_host("etcd")
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    for name in ("a", "b", "c"):
        h = network.add_host(name)
        overrides = [*OVERRIDES, f"train.steps={steps}"]
        d = start_daemon(tmp_path, f"node-{name}", [endpoint], overrides=overrides, host=h)
        started.append((h, d))
    wait_all_commit_together([d for _, d in started])
    return etcd


def steps_after(d: Daemon, t: float) -> list[int]:
    return [int(e["step"]) for e in d.events("train_step") if event_time(e) > t]


def events_after(d: Daemon, name: str, t: float) -> list[dict[str, object]]:
    return [e for e in d.events(name) if event_time(e) > t]


def heals_after(d: Daemon, t: float) -> list[dict[str, object]]:
    return events_after(d, "heal_done", t)


def leader_of(daemons: list[tuple[Host, Daemon]]) -> tuple[Host, Daemon]:
    return next((h, d) for h, d in daemons if d.require_status()["leader"])


def partition(
    sever: tuple[Callable[[], None], Callable[[], None]],
    cut: tuple[Host, Daemon],
    rest: list[tuple[Host, Daemon]],
    hold_s: float,
    recovery: Callable[[str, float], None],
    label: str,
) -> None:
    """Cut `cut` off with `sever` (cut, heal) for `hold_s`, check both sides meanwhile,
    heal, check convergence."""
    _, d = cut
    cut_at = time.time()
    sever[0]()
    try:
        fenced = wait_for(
            lambda: events_after(d, "fenced", cut_at), 30, f"{label}: the cut-off host to fence"
        )
        fenced_at = event_time(fenced[0])
        recovery(f"{label}: cut-off host fenced after the cut", fenced_at - cut_at)
        paused = wait_for(lambda: events_after(d, "group_paused", cut_at), 10, "its ranks to pause")
        wait_for(
            lambda: all(len(steps_after(rd, fenced_at)) > 10 for _, rd in rest),
            90,
            f"{label}: the majority to keep committing",
        )
        gap = max(largest_step_gap(rd.events(), cut_at) for _, rd in rest)
        recovery(f"{label}: the majority's longest pause between commits", gap)
        time.sleep(max(0.0, hold_s - (time.time() - cut_at)))
        assert not steps_after(d, event_time(paused[-1]) + 1.0), "the fenced side committed"
    finally:
        sever[1]()
    back_at = time.time()
    wait_for(lambda: heals_after(d, back_at), 120, f"{label}: the cut-off group to heal")
    healed = heals_after(d, back_at)[0]
    # Resumed (nobody went on without it) or restarted by the fence, never as a hang.
    resumed = events_after(d, "group_resumed", back_at)
    restarted = events_after(d, "group_restarted", back_at)
    assert resumed or restarted, "the cut-off group was neither resumed nor restarted"
    assert all(e.get("reason") == "fenced" for e in restarted), restarted
    recovery(
        f"{label}: cut-off group healed from the majority after the partition",
        event_time(healed) - back_at,
    )
    # The majority never took the cut-off side's state. While that side was paused it
    # could serve nobody (majority groups that missed a step meanwhile heal from each
    # other); once active again, a heal to a step no majority group had committed would
    # be its history winning.
    active_at = event_time((resumed or restarted)[0])
    majority = [(event_time(e), int(e["step"])) for _, rd in rest for e in rd.events("train_step")]
    wedged = 0
    for _, rd in rest:
        for h in heals_after(rd, active_at):
            known = max((st for t, st in majority if t <= event_time(h) + 1.0), default=0)
            assert int(str(h["step"])) <= known + 1, f"{rd.node_id} healed to the cut-off side"
        # Seen once in five runs before the store connection got a deadline (DESIGN.md,
        # "Partitions"): a cut-off rank paused with SIGSTOP while its peers still reach
        # it (an etcd-only cut) held a majority rank past ft.timeout_s until that node's
        # hang detector restarted it. Reported, not failed; any other restart fails.
        restarts = events_after(rd, "group_restarted", cut_at)
        assert all(e.get("reason") == "hang" for e in restarts), (rd.node_id, restarts)
        wedged += len(restarts)
    recovery(f"{label}: majority groups restarted by their hang detector", wedged)


Sever = Callable[[Network, Host], tuple[Callable[[], None], Callable[[], None]]]


def leader_then_follower(
    tmp_path: Path,
    network: Network,
    recovery: Callable[[str, float], None],
    sever: Sever,
    how: str,
) -> None:
    """Three hosts train; the leader's host is cut off (`sever`: the cut and its heal),
    then, once all converged, a host that does not lead; all end with equal parameters."""
    daemons: list[tuple[Host, Daemon]] = []
    etcd: Proc | None = None
    try:
        etcd = three_hosts(tmp_path, network, STEPS, daemons)
        leader = leader_of(daemons)
        rest = [hd for hd in daemons if hd[1] is not leader[1]]
        slow(*(d for _, d in daemons))
        partition(sever(network, leader[0]), leader, rest, 10.0, recovery, f"leader host {how}")
        assert leader[1].events("lighthouse_stopped"), "the cut-off leader kept its lighthouse"
        assert any(d.events("lighthouse_started") for _, d in rest), "no new leader"
        follower = next(hd for hd in rest if not hd[1].require_status()["leader"])
        others = [hd for hd in daemons if hd[1] is not follower[1]]
        partition(
            sever(network, follower[0]), follower, others, 10.0, recovery, f"follower host {how}"
        )
        assert not any(d.events("train_done") for _, d in daemons), "raise STEPS: training ended"
        hurry(*(d for _, d in daemons))
        for _, d in daemons:
            assert d.wait(300) == 0, d.proc.tail()
    finally:
        for _, d in daemons:
            d.stop()
        if etcd is not None:
            etcd.stop()
    digests = {d.node_id: digest(d) for _, d in daemons}
    assert len(set(digests.values())) == 1, digests


def test_a_partitioned_leader_and_then_a_partitioned_follower_lose_no_majority_step(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """Isolate the leader's host (its link down): the other two elect a leader and keep
    committing; the leader's host fences itself and, after the partition heals, heals
    from them. Then the same for a host that does not lead."""

    def isolate(net: Network, host: Host) -> tuple[Callable[[], None], Callable[[], None]]:
        return (lambda: net.isolate(host), lambda: net.rejoin(host))

    leader_then_follower(tmp_path, network, recovery, isolate, "partitioned")


def test_a_host_cut_from_etcd_only_pauses_and_rejoins_without_split_brain(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """Cut the leader's host from etcd only (its peers still reach it) for longer than the
    lease TTL: it stops its lighthouse and pauses its ranks before its lease can expire,
    another host leads, the other two train on; once etcd is back it heals from them.
    Then the same for a host that does not lead."""

    def from_etcd(net: Network, host: Host) -> tuple[Callable[[], None], Callable[[], None]]:
        etcd_host = net.hosts["etcd"]
        return (lambda: net.cut(host, etcd_host), lambda: net.heal(host, etcd_host))

    leader_then_follower(tmp_path, network, recovery, from_etcd, "cut from etcd")
