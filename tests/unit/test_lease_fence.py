"""The checkpoint fence (trainer.checkpoint.lease_fence): a marker only once the lease outlived the step."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from trainer.checkpoint.lease_fence import Confirmation, LeaseFence


def confirm(path: Path, lease: str, at_ns: int | None = None) -> None:
    path.write_text(json.dumps({"lease": lease, "confirmed_ns": at_ns or time.monotonic_ns()}))


def test_a_save_waits_for_a_confirmation_after_its_step(tmp_path: Path) -> None:
    fence = LeaseFence(tmp_path / "lease.json", wait_s=5)
    confirm(fence.path, "a1")
    stamp = fence.stamp()
    assert stamp.lease == "a1" and fence.verdict(stamp) == Confirmation.WAIT  # confirmed before it
    confirm(fence.path, "a1")
    assert fence.verdict(stamp) == Confirmation.OK


def test_a_new_lease_means_the_step_may_be_on_the_losing_side(tmp_path: Path) -> None:
    fence = LeaseFence(tmp_path / "lease.json", wait_s=5)
    confirm(fence.path, "a1")
    stamp = fence.stamp()
    confirm(fence.path, "b2")
    assert fence.verdict(stamp) == Confirmation.LOST
    assert fence.wait(stamp) == Confirmation.LOST


def test_a_blocking_wait_ends_with_the_confirmation_or_gives_up(tmp_path: Path) -> None:
    fence = LeaseFence(tmp_path / "lease.json", wait_s=0.3)
    confirm(fence.path, "a1")
    stamp = fence.stamp()
    assert fence.wait(stamp) == Confirmation.WAIT  # nobody confirmed: not marked
    later = threading.Timer(0.2, lambda: confirm(fence.path, "a1"))
    later.start()
    assert LeaseFence(fence.path, wait_s=5).wait(stamp) == Confirmation.OK
    later.join()


def test_an_unreadable_or_missing_file_never_confirms(tmp_path: Path) -> None:
    fence = LeaseFence(tmp_path / "lease.json", wait_s=0.1)
    stamp = fence.stamp()
    assert stamp.lease is None and fence.verdict(stamp) == Confirmation.WAIT
    fence.path.write_text("{not json")
    assert fence.verdict(stamp) == Confirmation.WAIT
