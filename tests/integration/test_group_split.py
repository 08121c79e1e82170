"""A split inside a replica group that spans nodes (issues 37, 49, 51): group 1's two
nodes cut from each other for a minute while both reach etcd and group 0. The split is a
wait, never a counted restart, and neither seat is revoked (each node answers the other's
ask for a sign of life). Each node holds its ranks paused while its partner's host is
silent (daemon/supervision/aside.py): group 0 is told at once and its quorums go on
without a group that could not finish a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import (
    event_time,
    hurry,
    largest_step_gap,
    slow,
    start_daemon,
    wait_for,
)
from tests.support.job_queries import digest
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on
from tests.support.netns import Network
from tests.support.spanning_groups import SPAN, said_between, seats, together_since

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]

# How long group 1's nodes are cut from each other: longer than five restarts of a rank
# that fails its group's store in ft.timeout_s (8 s) would take.
CUT_S = 60


def test_a_partition_between_a_groups_nodes_stops_that_group_on_both_sides(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """Group 1's two nodes cannot reach each other for 60 s (both still reach etcd and
    group 0): group 1 commits nothing on either side while cut, group 0 trains on, and
    once the cut heals group 1 comes back; every node ends with the same digest. The
    split is a wait on both of group 1's nodes, not their ranks' failure: at the default
    restart budget (node.max_restarts = 5 in 600 s) neither gives up."""
    etcd_host = network.add_host("etcd")
    hosts = [network.add_host(n) for n in ("a", "b", "c", "d")]
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    # Paced at 1 s a step from just before the cut until group 1 is back: about 70 of
    # its steps are spent there, wherever it runs.
    job = [*SPAN, "train.steps=200", "ft.timeout_s=8"]
    daemons = [
        start_daemon(tmp_path, f"node-{h.name}", [endpoint], overrides=job, host=h) for h in hosts
    ]
    by_node = {d.node_id: h for d, h in zip(daemons, hosts, strict=True)}
    try:
        wait_for(lambda: len(seats(daemons)) == 4, 120, "four nodes to take the four seats")
        held = seats(daemons)
        # The cut falls in steady steps, where a step's quorum takes milliseconds. Cut
        # while group 1's ranks were still in their second step's quorum (its RPC to the
        # group's manager across the cut), group 1 kept heartbeating without joining, and
        # torchft's lighthouse, wanting a majority of the live groups, held group 0 until
        # the cut healed (27 s; docs/failure-modes.md, "A group split during its quorum").
        slow(*daemons, pace_s=1.0)
        wait_for(
            lambda: (
                len(together_since([held[(0, 0)]], 0.0)) >= 4
                and len(together_since([held[(1, 0)]], 0.0)) >= 4
            ),
            240,
            "both groups to commit four steps together",
        )
        one = (held[(1, 0)], held[(1, 1)])
        network.cut(by_node[one[0].node_id], by_node[one[1].node_id])
        cut_at = time.time()
        time.sleep(CUT_S)
        alive = {d.node_id: d.proc.popen.poll() is None for d in one}
        network.heal(by_node[one[0].node_id], by_node[one[1].node_id])
        healed_at = time.time()
        back = wait_for(
            lambda: together_since([one[0]], healed_at),
            240,
            "group 1 to commit with group 0 again after the cut",
        )
        recovery(
            "a two-node group split 60 s: cut healed to the group committing again",
            min(event_time(e) for e in back) - healed_at,
        )
        hurry(*daemons)
        for d in daemons:
            assert d.wait(600) == 0, d.proc.tail()
    finally:
        for d in daemons:
            d.stop()
        etcd.stop()
    # Nothing group 1 logged as committed falls in the cut (a step's all-reduce that
    # finished before the cut may be logged just after it: 1 s of slack), on either side.
    for d in one:
        late = [
            e["step"] for e in d.events("train_step") if cut_at + 1.0 < event_time(e) < healed_at
        ]
        assert not late, f"{d.node_id} committed steps {late} while its group was split"
    during = [e for e in held[(0, 0)].events("train_step") if cut_at < event_time(e) < healed_at]
    assert during, (
        "group 0 stopped training while group 1 was split; what its nodes said meanwhile:\n"
        + said_between([held[(0, 0)], held[(0, 1)]], cut_at - 1.0, healed_at)
    )
    gap = largest_step_gap(held[(0, 0)].events("train_step"), after=cut_at)
    recovery("a two-node group split 60 s: the other group's longest pause", gap)
    # Group 0 was told at once: its ranks abandoned the step they shared with group 1 on
    # group 1's announcement (not after ft.timeout_s in a collective that could not end).
    abandoned = [
        e
        for d in (held[(0, 0)], held[(0, 1)])
        for e in d.events("quorum_members_lost")
        if cut_at < event_time(e) < healed_at and "failed in quorum" in e["reason"]
    ]
    assert abandoned, said_between([held[(0, 0)], held[(0, 1)]], cut_at - 1.0, healed_at)
    # Neither of group 1's nodes gave up, and none counted the split against its budget:
    # it held its ranks paused while its partner's host was silent; a restart meanwhile
    # waited for the group's peers ("peers") or followed the other node's ("group"),
    # never a crash of its own ("rank_exit") or a hang.
    assert all(alive.values()), alive
    for d in one:
        counted = [
            e
            for e in d.events("state_changed")
            if e.get("to") == "restarting" and cut_at < event_time(e) < healed_at
        ]
        assert not counted, (d.node_id, counted)
        aside = [
            e
            for e in d.events("group_paused")
            if cut_at < event_time(e) < healed_at and "answers nothing" in e["reason"]
        ]
        assert aside, f"{d.node_id} never held its ranks while split"
        # Held, its ranks neither failed nor were restarted while cut: the group stayed out
        # of the other group's quorums, so no quorum waited for it while it could not step.
        failed = [
            e
            for e in d.events()
            if cut_at < event_time(e) < healed_at
            and e["event"] in ("group_failed", "group_restarted", "rank_failed")
        ]
        assert not failed, (d.node_id, failed)
        # Both sides reached etcd throughout: asked for a sign of life, each gave one, and
        # neither seat was revoked (seat_probe.py).
        assert not d.events("seat_revoked") and not d.events("seat_lost"), d.node_id
    digests = {d.node_id: digest(d) for d in daemons}
    assert len(set(digests.values())) == 1, digests
