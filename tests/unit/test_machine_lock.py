"""The xdist workers' machine lock (tests/support/machine_lock.py): an `alone` test waits
for the running test, and the tests after it wait for it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.support.machine_lock import machine


def test_an_alone_test_comes_in_after_the_running_test_and_before_later_ones(
    tmp_path: Path,
) -> None:
    order: list[str] = []
    release = {name: threading.Event() for name in ("first", "alone", "later")}

    def hold(name: str, alone: bool) -> None:
        with machine(tmp_path, alone):
            order.append(name)
            release[name].wait(30)

    threads = {
        name: threading.Thread(target=hold, args=(name, name == "alone")) for name in release
    }
    threads["first"].start()
    while not order:
        time.sleep(0.01)
    threads["alone"].start()
    time.sleep(1.0)  # the alone test is waiting at the lock now
    threads["later"].start()
    time.sleep(1.0)
    assert order == ["first"], "nothing may join a test while an alone test waits"
    release["first"].set()
    threads["first"].join(10)
    while len(order) < 2:
        time.sleep(0.01)
    time.sleep(0.5)
    assert order == ["first", "alone"], order
    release["alone"].set()
    threads["alone"].join(10)
    release["later"].set()
    threads["later"].join(10)
    assert order == ["first", "alone", "later"], order


def test_tests_that_share_run_together(tmp_path: Path) -> None:
    with machine(tmp_path, False), machine(tmp_path, False):
        pass  # a second shared holder does not wait for the first
