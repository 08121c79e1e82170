"""Node identity: holder values, the predecessor kept in the run directory, the machine
identity, and the refusal of one address advertised from two machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from daemon.coordination.etcd_client import AddressHeld
from daemon.coordination.identity import (
    Identity,
    address_clash,
    holder_of,
    machine_id,
    take_identity,
)
from daemon.node_state.progress import ProgressFold


def test_a_holder_value_names_node_and_instance() -> None:
    me = Identity("gpu-1", "abc123")
    assert json.loads(me.holder()) == {"node": "gpu-1", "instance": "abc123"}
    assert holder_of(me.holder()) == ("gpu-1", "abc123")
    assert holder_of(me.holder().encode()) == ("gpu-1", "abc123")


def test_older_and_malformed_values() -> None:
    assert holder_of('"gpu-1"') == ("gpu-1", None)  # written by a daemon before identities
    assert holder_of(b"not json") == (None, None)
    assert holder_of("[1, 2]") == (None, None)
    assert holder_of('{"node": 3, "instance": ["x"]}') == (None, None)


def test_each_process_draws_an_instance_and_knows_its_predecessor(tmp_path: Path) -> None:
    first = take_identity("n", tmp_path / "run")
    second = take_identity("n", tmp_path / "run")
    assert first.predecessor is None and second.predecessor == first.instance
    assert second.instance != first.instance
    assert second.succeeds(first.instance) and second.succeeds(second.instance)
    assert not first.succeeds(second.instance) and not second.succeeds(None)
    assert not take_identity("n", tmp_path / "other").succeeds(first.instance)


def test_the_machine_identity_is_the_boot_and_the_network_namespace() -> None:
    """Every process of this machine and namespace has the same one; another network
    namespace of the same kernel (a host in the multi-host tests) has another."""
    mine = machine_id()
    boot, _, netns = mine.partition("/")
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip() and netns
    code = "from daemon.coordination.identity import machine_id; print(machine_id())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.stdout.strip() == mine


def test_one_address_from_two_machines_clashes_from_one_machine_it_does_not() -> None:
    nodes = {
        "node-a": {"host": "10.0.0.5", "machine": "boot-1/111"},
        "node-b": {"host": "127.0.0.1", "machine": "boot-1/222"},  # another namespace
        "node-c": {"host": "10.0.0.9"},  # an older daemon: no machine identity
    }
    assert address_clash("node-x", "10.0.0.5", "boot-2/333", nodes) == "node-a"
    assert address_clash("node-x", "10.0.0.5", "boot-1/111", nodes) is None  # same machine
    assert address_clash("node-a", "10.0.0.5", "boot-2/333", nodes) is None  # its own record
    assert address_clash("node-x", "10.0.0.6", "boot-2/333", nodes) is None
    assert address_clash("node-x", "10.0.0.9", "boot-2/333", nodes) is None
    assert address_clash("node-x", "127.0.0.1", "boot-1/111", nodes) == "node-b"
    assert address_clash("node-x", "10.0.0.5", "", nodes) is None  # ours unknown


def test_the_refusal_names_both_nodes_and_the_field() -> None:
    message = str(AddressHeld("node-b", "node-a", "10.0.0.5"))
    assert "'node-b'" in message and "'node-a'" in message and "10.0.0.5" in message
    assert "node.advertise_host" in message and message.count(". ") == 0


def test_a_group_that_never_shared_a_quorum_is_unreplicated() -> None:
    ranks = ProgressFold("n")
    assert ranks.snapshot().unreplicated(1) is None  # alone in the job: nothing to share
    assert ranks.snapshot().unreplicated(3) == {
        "groups_holding_slots": 3, "largest_quorum": 0, "committed_steps": 0,
    }  # fmt: skip
    for step in (1, 2):
        ranks.track({"event": "step_items", "step": step, "participants": 1})
    assert ranks.snapshot().unreplicated(3) == {
        "groups_holding_slots": 3, "largest_quorum": 1, "committed_steps": 2,
    }  # fmt: skip
    ranks.track({"event": "train_step", "step": 3, "participants": 2})
    assert ranks.snapshot().unreplicated(3) is None


def test_a_step_1_after_later_steps_says_the_job_started_over() -> None:
    ranks = ProgressFold("n")
    assert ranks.track({"event": "train_step", "step": 1, "participants": 2}) is None
    for step in (2, 3):
        assert ranks.track({"event": "step_items", "step": step, "participants": 2}) is None
    assert ranks.track({"event": "train_step", "step": 4, "participants": 2}) is None
    # A cold restart to a checkpoint resumes past step 1; a heal goes forward.
    assert ranks.track({"event": "heal_done", "step": 9}) is None
    assert ranks.track({"event": "train_step", "step": 3, "participants": 2}) is None
    # Step 1 again: no peer and no checkpoint, the job began anew (said once, not per rank).
    assert ranks.track({"event": "train_step", "step": 1, "participants": 2}) == 3
    assert ranks.track({"event": "train_step", "step": 1, "participants": 2}) is None
    now = ranks.snapshot()
    assert (now.started_over, now.started_over_from) == (1, 3)


def test_a_restarted_daemon_sees_a_start_over_from_the_reached_step_in_etcd() -> None:
    ranks = ProgressFold("n")
    ranks.reached(412)  # every node restarted; etcd kept the job's step
    assert ranks.track({"event": "train_step", "step": 1, "participants": 2}) == 412
    assert ranks.track({"event": "train_step", "step": 1, "participants": 2}) is None
    assert ranks.track({"event": "train_step", "step": 2, "participants": 2}) is None
    assert ranks.snapshot().started_over == 1
    resumed = ProgressFold("n")
    resumed.reached(412)  # a checkpoint or a peer: it goes on past step 1
    assert resumed.track({"event": "train_step", "step": 401, "participants": 2}) is None
    assert resumed.snapshot().started_over == 0
