"""The job's reached step in etcd (daemon.coordination.progress): what a value reads as."""

from __future__ import annotations

from daemon.coordination.progress import parse_reached, progress_prefix, reached_key


def test_a_reached_step_reads_back_and_anything_else_reads_as_none() -> None:
    assert parse_reached("j", b'{"step": 412, "node": "node-a"}') == 412
    assert parse_reached("j", None) == 0  # never written (a new job, or cleared)
    for bad in (b"not json", b'{"step": "412"}', b'{"step": true}', b'{"step": -3}', b"[1]"):
        assert parse_reached("j", bad) == 0, bad


def test_it_lies_outside_the_job_prefix_and_the_progress_prefix() -> None:
    key = reached_key("train-1")
    assert not key.startswith("/phalanx/train-1/")  # no daemon's watch hears it
    assert not key.startswith(progress_prefix("train-1"))  # no node's progress read
