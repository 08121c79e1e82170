"""bench/peer_measures.py's kill profile (where goodput goes after a kill), the pooled
failure-free rate, and when the Phalanx system counts as warmed up (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peer_measures import Commit, Kill, after_kills, goodput, pooled_rate
from bench.peer_systems import Phalanx


def steady(start: float, end: float, every: float, work: float = 1.0) -> list[Commit]:
    n = round((end - start) / every)
    return [Commit(start + (i + 1) * every, i + 1, 0.0, work) for i in range(n)]


def test_a_group_that_stops_for_two_seconds_costs_half_of_the_first_bin() -> None:
    survivor = steady(0, 40, 0.5)
    # The killed group commits nothing for the 2 s after the kill at t=10, then goes on.
    killed = [c for c in steady(0, 40, 0.5) if not 10 < c.t <= 12]
    lines = {0: survivor, 1: killed}
    rates = {0: 2.0, 1: 2.0}
    profile = after_kills(lines, rates, [Kill(10.0, 1, (1,))], span=10, bin_s=2)
    assert profile == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert goodput(lines, rates, 10, 20) == 0.9


def test_one_world_counts_its_net_progress_and_a_kill_past_the_end_is_left_out() -> None:
    # Restart the world: back from step 20 to 16 at t=11, then on at the old rate.
    before = steady(0, 10, 0.5)
    after = [Commit(11 + 0.5 * i, 16 + i) for i in range(40)]
    lines = {0: [*before, *after]}
    profile = after_kills(lines, {0: 2.0}, [Kill(10.0, 0, (1,)), Kill(100.0, 0, (1,))], 4, 2)
    # Step 20 at the kill, 18 at t=12: -2 steps against 4 expected; then 18 -> 22.
    assert profile == [-0.5, 1.0]


def test_the_failure_free_rate_pools_the_windows_before_and_after_the_chaos() -> None:
    # 2 steps/s for 10 s before the chaos, 4 steps/s for 5 s after it: 40 steps in 15 s.
    before = [Commit(0.5 * i, i, 0.0) for i in range(1, 21)]
    after = [Commit(100 + 0.25 * i, 20 + i, 0.0) for i in range(1, 21)]
    commits = before + after
    assert pooled_rate(commits, [(0, 10), (100, 105)]) == pytest.approx(40 / 15)
    assert pooled_rate(commits, [(0, 10)]) == pytest.approx(2.0)
    # An empty window (no --after) weighs nothing; one world counts net progress.
    assert pooled_rate(commits, [(0, 10), (105, 105)], net=True) == pytest.approx(2.0)


def test_phalanx_is_quiet_once_every_standby_and_zygote_is_ready_used_or_gone() -> None:
    system = Phalanx(Path("/nonexistent"), None)
    assert system.quiet()

    def event(kind: str, group: int = 0, **fields: object) -> None:
        system.event(group, {"event": kind, "time": "2026-11-24T01:00:00Z", **fields})

    event("standby_spawned", pid=11)
    event("standby_spawned", pid=12)
    event("standby_spawned", pid=13)
    assert not system.quiet()
    event("standby_ready", pid=11)
    event("group_restarted", pids=[12])  # taken while still warming: it is a rank now
    assert not system.quiet()
    event("standby_exited", pid=13)
    # Every standby is ready, used or gone, but the node starts its zygote only now.
    assert not system.quiet()
    event("standby_zygote_spawned", pid=14)  # the node's zygote warms up too
    assert not system.quiet()
    event("standby_zygote_ready", pid=14)
    assert system.quiet()
    event("standby_spawned", pid=15)  # a refill: the zygote was started already
    event("standby_ready", pid=15)
    assert system.quiet()
    # A forked standby's own line can come before its daemon's standby_spawned.
    event("standby_ready", pid=16)
    event("standby_spawned", pid=16)
    assert system.quiet()
    event("standby_spawned", group=1, pid=21)  # another node whose pool gave up
    event("standby_ready", group=1, pid=21)
    assert not system.quiet()
    event("standby_disabled", group=1)
    assert system.quiet()
