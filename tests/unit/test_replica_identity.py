"""A group's torchft replica id across its restarts (daemon/ranks/node_group.py, daemon/ranks/workers.py,
trainer/config/env.py), as pure logic; tests/unit/test_torchft_adapter.py and
tests/integration/test_daemon_pair.py run it against the real lighthouse."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from daemon.config import load_daemon_config
from daemon.ranks.node_group import keeps_replica_id
from daemon.ranks.spec import GroupSpec, Seat, rank_env
from trainer.config import ConfigError
from trainer.config.env import RankEnv

JOB = Path(__file__).resolve().parents[2] / "tests" / "integration" / "daemon_job.toml"


def test_only_a_rank_0_killed_by_a_signal_is_replaced_under_its_id() -> None:
    assert keeps_replica_id([-9])  # SIGKILL, the OOM killer
    assert keeps_replica_id([-11, 1])  # a crash; the daemon then ended the group
    assert keeps_replica_id([-15, -9])
    # Rank 0 ended on its own: it may have left a quorum request at the lighthouse.
    assert not keeps_replica_id([1])
    assert not keeps_replica_id([0, -9])
    assert not keeps_replica_id([None])
    assert not keeps_replica_id([])
    assert not keeps_replica_id(None)


def test_the_ranks_get_the_groups_replica_uuid_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = load_daemon_config(JOB, ["node.nproc=2", "parallel.dp_shard=2"])
    config = Path("/tmp/ranks.json")
    spec = GroupSpec.for_node(cfg, 1, "http://127.0.0.1:1", config, "5eed-0001")
    assert [rank_env(spec, r, 1234, 2)["PHALANX_REPLICA_UUID"] for r in (0, 1)] == [
        "5eed-0001",
        "5eed-0001",
    ]
    # A standby's placeholder environment, or a daemon started from a rank's shell.
    monkeypatch.setenv("PHALANX_REPLICA_UUID", "feed-0002")
    placeholder = GroupSpec.for_node(cfg, 0, "", config)
    assert "PHALANX_REPLICA_UUID" not in rank_env(placeholder, 0, 1234, 1)


def test_a_rank_reads_the_replica_uuid_or_names_the_variable() -> None:
    assert RankEnv.from_environ({"PHALANX_REPLICA_UUID": "5eed-0001"}).replica_uuid == "5eed-0001"
    assert RankEnv.from_environ({}).replica_uuid is None
    with pytest.raises(ConfigError, match="PHALANX_REPLICA_UUID='not a uuid!' must be a uuid"):
        RankEnv.from_environ({"PHALANX_REPLICA_UUID": "not a uuid!"})


def test_a_seat_numbers_the_groups_ranks_node_by_node_as_torchrun_does() -> None:
    """A group of two nodes with two ranks each: node rank 1's local ranks are the group's
    ranks 2 and 3 of 4, and both nodes point at the store of node rank 0; one node (the
    default seat) is today's environment."""
    cfg = load_daemon_config(JOB, ["node.nproc=2", "parallel.dp_shard=2"])
    spec = GroupSpec.for_node(cfg, 1, "http://127.0.0.1:1", Path("/tmp/ranks.json"))
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")

    def env(seat: Seat, rank: int) -> tuple[str, ...]:
        e = rank_env(dataclasses.replace(spec, seat=seat), rank, 1234, 1)
        return tuple(e[k] for k in keys)

    one = spec.advertise_host
    assert [env(Seat(), r) for r in (0, 1)] == [
        ("0", "0", "2", "2", "0", one),
        ("1", "1", "2", "2", "0", one),
    ]
    first, second = Seat(0, 2, "10.0.0.1"), Seat(1, 2, "10.0.0.1")
    assert [env(s, r) for s in (first, second) for r in (0, 1)] == [
        ("0", "0", "4", "2", "0", "10.0.0.1"),
        ("1", "1", "4", "2", "0", "10.0.0.1"),
        ("2", "0", "4", "2", "1", "10.0.0.1"),
        ("3", "1", "4", "2", "1", "10.0.0.1"),
    ]
    for node_rank, nodes, master in ((2, 2, "10.0.0.1"), (-1, 2, "x"), (1, 2, None)):
        with pytest.raises(ValueError):
            Seat(node_rank, nodes, master)
