"""Structured logging: JSON lines off a terminal, console lines on one, relayed events intact."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest
import structlog

from trainer import logs


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    logs._PROCESS.clear()
    root.handlers[:], root.level = handlers, level
    logging.captureWarnings(False)
    threading.excepthook = threading.__excepthook__


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    logs.configure(stream=out)
    logs.bind(job="j", node="n", replica_group=1, rank=0)
    logs.get().info("train_step", step=3, loss=2.5)
    event = json.loads(out.getvalue())
    assert next(iter(event)) == "event"
    assert event | {"time": None} == {
        "event": "train_step", "step": 3, "loss": 2.5, "job": "j", "node": "n",
        "replica_group": 1, "rank": 0, "level": "info", "time": None,
    }  # fmt: skip


def test_console_lines_on_a_terminal() -> None:
    out = Terminal()
    logs.configure(stream=out)
    logs.get().info("group_started", slot=0)
    line = out.getvalue()
    assert "group_started" in line and "slot=0" in line
    assert not line.startswith("{")


def test_relayed_rank_events_keep_their_fields_time_and_level() -> None:
    out = io.StringIO()
    logs.configure(stream=out)
    logs.bind(job="j", node="daemon-node")
    rank_event = {
        "event": "heal_done",
        "step": 7,
        "seconds": 1.5,
        "time": "2026-01-01T00:00:00Z",
        "level": "warning",
        "rank": 1,
    }
    logs.relay(rank_event)
    relayed = json.loads(out.getvalue())
    assert relayed["step"] == 7 and relayed["seconds"] == 1.5  # fields, not a JSON string
    assert relayed["time"] == "2026-01-01T00:00:00Z" and relayed["level"] == "warning"
    assert relayed["node"] == "daemon-node" and relayed["job"] == "j"


def test_library_logs_come_out_structured() -> None:
    out = io.StringIO()
    logs.configure(stream=out)
    logging.getLogger("torchft.manager").warning("lighthouse quorum failed")
    logging.getLogger("torchft.manager").warning("Unable to reset NCCL flight recorder")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [lines[0]] and lines[0]["event"] == "library_log"
    assert (
        lines[0]["message"] == "lighthouse quorum failed"
        and lines[0]["logger"] == "torchft.manager"
    )


def test_a_thread_started_without_the_context_still_names_the_job_and_node() -> None:
    """An asyncio loop's thread (the daemon's lighthouse gate) logged a library record
    without job and node: they are the process's, whatever thread logs."""
    out = io.StringIO()
    logs.configure(stream=out)
    logs.bind(job="train-1", node="node-a", replica_group=3)
    bare = threading.Thread(  # not started through contextvars.copy_context().run
        target=lambda: logging.getLogger("asyncio").error("Exception in callback")
    )
    bare.start()
    bare.join()
    (line,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (line["event"], line["job"], line["node"]) == ("library_log", "train-1", "node-a")
    assert "replica_group" not in line  # a group is bound per context, never process-wide
