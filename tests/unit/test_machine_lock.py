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


def shared_holder_enters(tmp_path: Path, first_alone: bool, wait_s: float) -> tuple[bool, bool]:
    """Whether a shared holder got in while a first holder (alone or shared) held the
    machine, within `wait_s`, and whether it had got in once the first let go."""
    inside = threading.Event()

    def shared() -> None:
        with machine(tmp_path, False):
            inside.set()

    with machine(tmp_path, first_alone):
        other = threading.Thread(target=shared, daemon=True)
        other.start()
        during = inside.wait(wait_s)
    other.join(10)
    return during, inside.is_set()


def test_tests_that_share_run_together(tmp_path: Path) -> None:
    """A second shared holder gets in while the first still holds the lock."""
    assert shared_holder_enters(tmp_path, False, 10) == (True, True)


def test_a_shared_holder_waits_while_an_alone_test_holds_the_machine(tmp_path: Path) -> None:
    """The same check can fail: behind an exclusive holder, a shared one does wait."""
    assert shared_holder_enters(tmp_path, True, 0.5) == (False, True)
