"""The asynchronous save's staging (the background copy of the state): what the H200 run
of 2026-11-28 found. torch 2.11's async_save closes the stager it is given once the upload
is done; the next save's staging then failed (KeyError: <class 'type'>), and the training
thread's wait for the copy raised it, which ended the rank."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import structlog

from tests.support.checkpointers import linear_checkpointer
from trainer.checkpoint.files import MARKER
from trainer.checkpoint.pending import PendingSave


def checkpoint_events(events: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(e["event"]) for e in events if str(e["event"]).startswith("checkpoint_")]


def test_each_save_stages_through_its_own_stager(tmp_path: Path) -> None:
    saver, _ = linear_checkpointer(tmp_path)
    with structlog.testing.capture_logs() as events:
        saver.save(1)
        saver.finish(block=True)
        first = saver.stager
        assert first is not None
        first.close()  # what torch 2.11's async_save does once the upload is done
        saver.save(2)
        saver.finish(block=True)
        assert saver.stager is not first
        saver.close()
    assert checkpoint_events(events) == ["checkpoint_saved", "checkpoint_saved"]
    assert (tmp_path / "step-1" / MARKER).is_file() and (tmp_path / "step-2" / MARKER).is_file()


def test_a_failed_staging_is_a_failed_save_and_the_rank_trains_on(tmp_path: Path) -> None:
    saver, _ = linear_checkpointer(tmp_path)
    broken: Future[None] = Future()
    broken.set_exception(KeyError(type))
    upload: Future[None] = Future()
    upload.set_exception(KeyError(type))  # DCP's upload fails with its staging
    saver.staging, saver.upload = broken, upload
    saver.pending = PendingSave(3, tmp_path / "step-3", time.monotonic(), blocked=0.0)
    with structlog.testing.capture_logs() as events:
        saver.wait_staged()  # the training thread, before the optimizer step: no raise
        saver.finish(block=True)
        saver.save(4)  # the next interval tries again, and succeeds
        saver.close()
    assert checkpoint_events(events) == ["checkpoint_failed", "checkpoint_saved"]
    failed = next(e for e in events if e["event"] == "checkpoint_failed")
    assert failed["step"] == 3 and "KeyError" in str(failed["error"])
    assert not (tmp_path / "step-3").exists() and (tmp_path / "step-4" / MARKER).is_file()
