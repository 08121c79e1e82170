"""The contracts between the daemon and its ranks: the environment
(trainer/config/env.py), the lease and notice files and the events the daemon reads
(trainer/contracts/). What the daemon writes a rank reads back as the same value, and
each variable's, file's and event's name is spelled in one module, so the two sides
cannot drift apart."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.ranks.spec import GroupSpec, Seat, rank_env
from trainer import chaos
from trainer.config import env as rank_vars
from trainer.config.env import RankEnv
from trainer.contracts import (
    checkpoint_names,
    heartbeat,
    lease_file,
    notice_file,
    rank_events,
    spare_messages,
)
from trainer.contracts.notice_file import Told

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "trainer")
TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)


def contract_names() -> dict[str, str]:
    """Each variable of the contract (and the chaos knobs the daemon checks) -> the module
    that spells its name."""
    names = {
        value: "trainer/config/env.py"
        for key, value in vars(rank_vars).items()
        if key.isupper() and isinstance(value, str)
    }
    names[lease_file.NAME] = "trainer/contracts/lease_file.py"
    names[notice_file.NAME] = "trainer/contracts/notice_file.py"
    names[heartbeat.DIRECTORY] = "trainer/contracts/heartbeat.py"
    for name in (
        checkpoint_names.MARKER,
        checkpoint_names.SCALARS,
        checkpoint_names.RUN_PREFIX,
        checkpoint_names.STEP_PREFIX,
    ):
        names[name] = "trainer/contracts/checkpoint_names.py"
    names.update(
        {
            value: "trainer/chaos.py"
            for key, value in vars(chaos).items()
            if key.startswith("CHAOS") and isinstance(value, str)
        }
    )
    names.update(
        {
            value: "trainer/contracts/rank_events.py"
            for key, value in vars(rank_events).items()
            if key.isupper() and isinstance(value, str)
        }
    )
    return names


# The same words with another meaning: a node group's exit kind (ExitKind.BAD_INPUT).
ELSEWHERE = {("bad_input", "daemon/ranks/workers.py")}


def string_literals(path: Path) -> set[str]:
    """The plain string literals of a source file but its ``__all__`` (f-strings and
    docstrings' longer text never equal a bare name)."""
    tree = ast.parse(path.read_text())
    exported = {
        id(node)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
        for node in ast.walk(stmt.value)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in exported
    }


def test_each_variable_name_is_spelled_in_one_module() -> None:
    names = contract_names()
    assert {"RANK", "PHALANX_NOTICE", "TORCHFT_LIGHTHOUSE", "PHALANX_CHAOS_DELAY"} <= set(names)
    assert {"lease.json", "notice.json", "COMPLETE.json", "train_step", "heal_done"} <= set(names)
    spelled: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for literal in string_literals(path) & set(names):
                if (literal, where) not in ELSEWHERE:
                    spelled.setdefault(literal, []).append(where)
    assert {n: where for n, where in spelled.items() if where != [names[n]]} == {}


def test_a_literal_elsewhere_is_found(tmp_path: Path) -> None:
    source = tmp_path / "reader.py"
    source.write_text('"""PHALANX_NOTICE in prose."""\nx = os.environ.get("PHALANX_NOTICE")\n')
    assert "PHALANX_NOTICE" in string_literals(source)
    source.write_text('"""PHALANX_NOTICE in prose."""\nx = f"{PHALANX_NOTICE}"\n')
    assert "PHALANX_NOTICE" not in string_literals(source)
    source.write_text('__all__ = ["step_items"]\nlog.info("step_items")\n')
    assert "step_items" in string_literals(source)
    source.write_text('__all__ = ["step_items"]\n')
    assert "step_items" not in string_literals(source)


@st.composite
def rank_envs(draw: st.DrawFn) -> RankEnv:
    world = draw(st.integers(1, 64))
    groups = draw(st.integers(1, 16))
    local_world = draw(st.integers(1, world))
    path = st.builds(lambda t: Path("/run") / t.replace("/", "_"), TEXT)
    return RankEnv(
        rank=draw(st.integers(0, world - 1)),
        local_rank=draw(st.integers(0, local_world - 1)),
        world_size=world,
        local_world_size=local_world,
        master_addr=draw(TEXT),
        master_port=draw(st.integers(1, 65535)),
        replica_group=draw(st.integers(0, groups - 1)),
        num_replica_groups=groups,
        lighthouse=draw(st.none() | TEXT),
        min_replicas=draw(st.integers(1, 8)),
        heartbeat=draw(st.none() | path),
        lease_file=draw(st.none() | path),
        job=draw(st.none() | TEXT),
        node=draw(st.none() | TEXT),
        notice=draw(st.none() | path),
        replica_uuid=draw(st.none() | st.from_regex(r"[0-9a-f-]{8,64}", fullmatch=True)),
        join_timeout_ms=draw(st.none() | st.integers(0, 10**6)),
        group_rank=draw(st.integers(0, 8)),
        config=draw(st.none() | path),
        advertise_host=draw(st.none() | TEXT),
        bind_host=draw(st.none() | TEXT),
        attempt=draw(st.none() | st.integers(0, 1000)),
    )


@given(rank_envs())
def test_what_a_launcher_writes_a_rank_reads_back(env: RankEnv) -> None:
    assert RankEnv.from_environ(env.to_environ()) == env


def test_the_daemons_environment_reads_back_as_the_ranks_place(tmp_path: Path) -> None:
    spec = GroupSpec(
        nproc=2,
        slot=1,
        num_slots=3,
        lighthouse="http://10.0.0.1:29510",
        config_path=tmp_path / "job.json",
        run_dir=tmp_path,
        min_replicas=2,
        job="llm",
        node="node-b",
        advertise_host="10.0.0.2",
        bind_host="10.0.0.2",
        extra_env={},
        metrics_dir=None,
        python_path=[],
        replica_uuid="5eed-0001",
        seat=Seat(1, 2, "10.0.0.1"),
        join_timeout_ms=10000,
    )
    got = RankEnv.from_environ(rank_env(spec, 1, 29400, 3))
    assert got == replace(
        got,
        rank=3,  # node 1's second rank, torchrun's numbering
        local_rank=1,
        world_size=4,
        local_world_size=2,
        group_rank=1,
        master_addr="10.0.0.1",  # the group's first node hosts the store
        master_port=29400,
        replica_group=1,
        num_replica_groups=3,
        lighthouse="http://10.0.0.1:29510",
        min_replicas=2,
        job="llm",
        node="node-b",
        replica_uuid="5eed-0001",
        join_timeout_ms=10000,
        config=tmp_path / "job.json",
        advertise_host="10.0.0.2",
        bind_host="10.0.0.2",
        attempt=3,
        torchelastic=False,
    )
    assert got.heartbeat is not None and got.heartbeat.parent.is_relative_to(tmp_path)
    assert got.lease_file is not None and got.notice is not None


def test_the_lease_file_reads_back_what_the_daemon_wrote(tmp_path: Path) -> None:
    path = tmp_path / lease_file.NAME
    assert lease_file.read(path) is None  # not written yet
    lease_file.write(path, "6a6c0001", 12.5)
    assert lease_file.read(path) == ("6a6c0001", 12_500_000_000)
    path.write_text("{")  # never half a file in practice; unreadable reads as unwritten
    assert lease_file.read(path) is None


def test_the_notice_file_reads_back_what_the_daemon_wrote(tmp_path: Path) -> None:
    path = tmp_path / notice_file.NAME
    told = [
        Told(1, "10.0.0.1:29510", "a new leader published it"),
        Told(2, "10.0.0.1:29510", "g1 failed in quorum 7", 7, ("g1:uuid",)),
    ]
    notice_file.write(path, told)
    assert notice_file.read(path) == tuple(told)
    assert told[0].fields() == {"seq": 1, "lighthouse": "10.0.0.1:29510", "reason": told[0].reason}
    path.write_text('{"notices": [{"seq": 1}]}')
    with pytest.raises(ValueError, match="not a notice file"):
        notice_file.read(path)


def test_a_spares_start_and_the_zygotes_answer_read_back() -> None:
    env = {"RANK": "1", "PHALANX_NOTICE": "/run/notice.json"}
    assert spare_messages.started_env(spare_messages.start(env)) == env
    assert spare_messages.started_env(spare_messages.start(env).decode() + "\n") == env
    assert spare_messages.forked_pid(spare_messages.forked(4242)) == 4242
    assert spare_messages.forked_pid(b"") == 0  # the zygote closed its socket
    with pytest.raises(ValueError, match="not a mapping"):
        spare_messages.started_env(b'{"env": ["RANK=1"]}')


def test_an_event_written_between_a_rust_lines_two_writes_is_read() -> None:
    """Seen in CI: torchft's Rust logger wrote its time stamp, a rank's heal_done landed,
    then the rest of the Rust line followed on the next line."""
    heal = '{"event": "heal_done", "step": 1, "seconds": 0.305, "rank": 0}'
    assert rank_events.event_of(heal) == json.loads(heal)
    assert rank_events.event_of("2026-12-07T13:28:29.051" + heal) == json.loads(heal)
    rust = "2026-12-07T13:28:28.876 [INFO] [torchft::manager] - Quorum { quorum_id: 2 }"
    assert rank_events.event_of(rust) is None
    assert rank_events.event_of(" [INFO] [torchft::manager] - should_commit=true") is None
    assert rank_events.event_of('{"step": 3}') is None  # JSON, but no event
    assert rank_events.event_of('{"event": "train_step", "step"') is None  # cut short
