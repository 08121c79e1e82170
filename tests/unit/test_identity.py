"""Node identity: holder values and the predecessor kept in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

from daemon.coordination.identity import Identity, holder_of, take_identity


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
