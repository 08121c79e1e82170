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
    """A second shared holder gets in while the first still holds the lock."""
    inside = threading.Event()

    def second() -> None:
        with machine(tmp_path, False):
            inside.set()

    with machine(tmp_path, False):
        other = threading.Thread(target=second, daemon=True)
        other.start()
        assert inside.wait(10), "a second shared holder waited for the first"
    other.join(10)


def test_a_shared_holder_waits_while_an_alone_test_holds_the_machine(tmp_path: Path) -> None:
    """The same check can fail: behind an exclusive holder, a shared one does wait."""
    inside = threading.Event()

    def shared() -> None:
        with machine(tmp_path, False):
            inside.set()

    with machine(tmp_path, True):
        other = threading.Thread(target=shared, daemon=True)
        other.start()
        assert not inside.wait(0.5)
    assert inside.wait(10)
    other.join(10)
