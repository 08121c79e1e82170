"""When a node writes its record and its progress (daemon/supervision/node_record.py).

The record is an event for every other daemon, so it is written only when it changed;
the step is written apart, rarely, and at once when someone asks. The coordinator here
is a recorder of what would be sent: this is the pure decision, the integration tests
run it against etcd.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from daemon.accounting import Activity, Ledger
from daemon.config import load_daemon_config
from daemon.coordination.progress import PROGRESS_EVERY_S
from daemon.node_state import NodeView, State
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import UpkeepReport
from daemon.supervision.node_record import RECORD_GAP_S, NodeRecord
from daemon.supervision.reports import node_status

JOB = Path(__file__).parents[1] / "integration" / "daemon_job.toml"


class Sent:
    """Stands in for the Coordinator: remembers each record and progress write."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.progress: list[dict[str, Any]] = []
        self.reached: list[int] = []  # the steps also written as the job's reached step

    def register(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def put_progress(self, progress: dict[str, Any], reached: bool = False) -> None:
        self.progress.append(progress)
        if reached:
            self.reached.append(progress["step"])


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    fake = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr("daemon.supervision.node_record.time", fake)
    return now


UPKEPT: list[UpkeepReport] = []  # the upkeep's last report, as the status is built with it


class Ranks:
    """The ranks' progress as the status is built with it (the rank threads' fold)."""

    now = RankProgress()

    def set(self, **changed: Any) -> None:
        self.now = replace(self.now, **changed)


RANKS = Ranks()


def made(tmp_path: Path, *overrides: str) -> tuple[NodeRecord, Sent, NodeView]:
    cfg = load_daemon_config(JOB, [f'node.run_dir="{tmp_path}"', *overrides], node_id="node-a")
    sent, view = Sent(), NodeView()
    UPKEPT[:] = [UpkeepReport()]
    RANKS.now = RankProgress()
    status = lambda: node_status(view, cfg, UPKEPT[0], None, RANKS.now)  # noqa: E731
    return NodeRecord(cfg, sent, status), sent, view  # type: ignore[arg-type]


def test_the_record_is_written_when_it_changes_and_never_on_a_timer(
    tmp_path: Path, clock: list[float]
) -> None:
    record, sent, view = made(tmp_path)
    record.update()
    for step in range(1, 50):  # training: the step moves, nothing in the record does
        RANKS.set(step=step)
        clock[0] += 1.0
        record.update()
    assert len(sent.records) == 1 and "step" not in sent.records[0]
    view.state = State.FENCED
    record.update()
    record.update()
    assert [r["state"] for r in sent.records] == ["joining", "fenced"]
    clock[0] += RECORD_GAP_S
    RANKS.set(participants=3)  # a group joined the quorum: progress, not the record
    record.update()
    assert len(sent.records) == 2 and "participants" not in sent.records[-1]
    UPKEPT[0] = UpkeepReport(slot=4)  # a claim
    record.update()
    assert sent.records[-1]["group"] == 4 and len(sent.records) == 3


def test_changes_within_the_gap_go_out_together_with_the_latest_values(
    tmp_path: Path, clock: list[float]
) -> None:
    record, sent, view = made(tmp_path)
    record.update(force=True)  # registering
    for state in (State.CLAIMING, State.WAITING, State.RUNNING):  # a quick join
        view.state = state
        clock[0] += 0.25  # a round
        record.update()
    assert [r["state"] for r in sent.records] == ["joining"]
    clock[0] += RECORD_GAP_S
    record.update()
    assert [r["state"] for r in sent.records] == ["joining", "running"]


def test_the_step_is_written_first_at_its_first_move_then_every_period(
    tmp_path: Path, clock: list[float]
) -> None:
    record, sent, _ = made(tmp_path)
    record.update_progress(None, None, 0)
    RANKS.set(step=1)
    record.update_progress(None, None, 0)  # training began: at once
    for _ in range(int(PROGRESS_EVERY_S) - 1):
        clock[0] += 1.0
        RANKS.set(step=RANKS.now.step + 1)
        record.update_progress(None, None, 0)
    assert [p["step"] for p in sent.progress] == [0, 1]
    clock[0] += 1.0
    record.update_progress(None, None, 0)
    assert [p["step"] for p in sent.progress] == [0, 1, RANKS.now.step]
    assert sent.reached == [RANKS.now.step]  # the job's reached step: past step 1 only
    RANKS.set(participants=2)
    record.update_progress(None, 7, RANKS.now.step)  # a new epoch, a new quorum: due in time
    assert len(sent.progress) == 3
    clock[0] += PROGRESS_EVERY_S
    record.update_progress(None, 7, RANKS.now.step)
    last = dict(sent.progress[-1])
    assert {"time", "time_1h"} <= set(last)  # riders: test_the_nodes_time_rides_on_...
    del last["time"], last["time_1h"]
    assert last == {
        "step": RANKS.now.step,
        "participants": 2,
        "epoch": 7,
        "epoch_step": RANKS.now.step,
    }


def test_the_nodes_time_rides_on_progress_writes_with_the_last_hours_share(
    tmp_path: Path, clock: list[float]
) -> None:
    """daemon.accounting's seconds by activity go out with writes made for the step, and
    never cause one: the scale bench's etcd requests stay as they were."""
    record, sent, _ = made(tmp_path)
    RANKS.set(ledger=Ledger.begin(clock[0]))  # the node waits from now
    record.update_progress(None, None, 0)
    clock[0] += 5.0
    record.update_progress(None, None, 0)  # only the time moved: no write
    assert len(sent.progress) == 1
    RANKS.set(ledger=RANKS.now.ledger.switch(clock[0], Activity.SPARE))
    for _ in range(400):  # 4,000 s of writes 10 s apart
        clock[0] += PROGRESS_EVERY_S
        RANKS.set(step=RANKS.now.step + 1)
        record.update_progress(None, None, 0)
    last = sent.progress[-1]
    assert (last["time"]["waiting"], last["time"]["spare"]) == (5.0, 4000.0)
    assert last["time_1h"] == {"spare": 3600.0}  # what is not zero


def test_each_ask_is_answered_at_once_and_only_once(tmp_path: Path, clock: list[float]) -> None:
    record, sent, _ = made(tmp_path)
    record.update_progress(None, None, 0)
    RANKS.set(step=5)
    record.update_progress(None, None, 0)
    first = {"node": "node-b", "instance": "i", "at": 1}
    record.update_progress(first, None, 0)
    record.update_progress(first, None, 0)
    again = {"node": "node-b", "instance": "i", "at": 2}  # the same node asks again
    record.update_progress(again, None, 0)
    assert [p["step"] for p in sent.progress] == [0, 5, 5, 5]
    record.forget()  # a new session writes at once
    record.update_progress(again, None, 0)
    assert len(sent.progress) == 5


def test_the_reached_step_only_rises(tmp_path: Path, clock: list[float]) -> None:
    """A group that started over trains steps it had passed: the job's reached step in
    etcd stays at the highest (what job.on_no_state = stop compares a step 1 with)."""
    record, sent, _ = made(tmp_path)
    RANKS.set(reached=412)  # read from etcd when the ranks started
    for step in (1, 2, 3, 500):
        RANKS.set(step=step)
        clock[0] += PROGRESS_EVERY_S
        record.update_progress(None, None, 0)
    assert [p["step"] for p in sent.progress] == [1, 2, 3, 500]
    assert sent.reached == [500]


def test_a_semi_synchronous_job_says_so_in_the_record_and_an_every_step_one_not(
    tmp_path: Path,
) -> None:
    record, _, _ = made(tmp_path)
    assert "exchange" not in record.build()  # the default: no bytes added to the record
    diloco, _, _ = made(tmp_path, 'ft.semi_sync_method="diloco"', "ft.sync_steps=10")
    assert diloco.build()["exchange"] == {"semi_sync_method": "diloco", "sync_steps": 10}
    streaming, _, _ = made(
        tmp_path, 'ft.semi_sync_method="diloco"', "ft.sync_steps=10", "ft.num_fragments=2"
    )
    assert streaming.build()["exchange"]["num_fragments"] == 2
