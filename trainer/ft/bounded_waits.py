"""Waits on C++ calls that cannot be interrupted, given up on rather than sat out.

A gloo backend's build (it connects to every quorum member) and a TCPStore client's
constructor (it waits for the server's ping with no timeout) block in C++. Each runs on
a thread of its own here; the caller stops waiting once a reason comes (a notice from
the daemon) or a deadline passes, and the thread is left to end by itself, whatever it
built dropped. Used by the process group the torchft adapter builds
(``torchft_adapter.scoped_process_group``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from typing import Any

BUILD_POLL_S = 0.05  # how often a build of the backend asks whether to give up


class ConfigureAbandoned(RuntimeError):
    """A process group's build was given up: a notice concerned its quorum."""


def _on_thread(fn: Callable[[], Any], name: str) -> Future[Any]:
    """`fn()` on a daemon thread of its own, its result or error in the future returned.
    For a C++ call that cannot be interrupted: the caller may stop waiting for it, and
    the thread ends when the call does."""
    done: Future[Any] = Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as e:  # handed to the caller
            done.set_exception(e)

    threading.Thread(target=run, daemon=True, name=name).start()
    return done


def unless_interrupted(build: Callable[[], Any], interrupted: Callable[[], str | None]) -> Any:
    """`build()` on a thread of its own; ConfigureAbandoned once `interrupted()` names a
    reason first (the thread is left to end by its own timeout, its result dropped)."""
    done = _on_thread(build, "torchft-pg-build")
    while True:
        try:
            return done.result(BUILD_POLL_S)
        except FutureTimeout:
            reason = interrupted()
            if reason:
                raise ConfigureAbandoned(
                    f"the process group's build was given up: {reason}"
                ) from None


STORE_PROBE_S = 2.0  # a live store's kernel accepts at once, even while its process is paused
STORE_RECHECK_S = 0.25  # while the store client still connects, its port is probed this often


def _store_answers(address: str, timeout_s: float) -> None:
    """Raise TimeoutError unless `address` (host:port) accepts a TCP connection within
    `timeout_s`. torch's store client retries a refused connection until its own timeout
    (``ft.timeout_s``): a quorum whose store host's rank died just after the quorum formed
    held every other group that long."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise TimeoutError(f"the quorum's store at {address} does not answer ({e})") from None


def with_deadline(create_store_client: Callable[..., Any]) -> Callable[..., Any]:
    """torchft's create_store_client, raising TimeoutError after its `timeout`.

    On a timeout the connecting thread is left behind (a C++ call cannot be
    interrupted); it ends when the store's process dies or resumes, and whatever it
    built is dropped. The manager reports the error and the next quorum goes on.
    """

    def create(store_addr: str, timeout: timedelta) -> Any:
        address = store_addr.partition("/")[0]
        _store_answers(address, min(STORE_PROBE_S, timeout.total_seconds()))
        done = _on_thread(
            lambda: create_store_client(store_addr, timeout=timeout), "torchft-store-connect"
        )
        deadline = time.monotonic() + timeout.total_seconds()
        while True:  # a store whose process dies meanwhile refuses the next probe
            try:
                return done.result(max(0.0, min(STORE_RECHECK_S, deadline - time.monotonic())))
            except FutureTimeout:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"the quorum's store at {address} did not answer within "
                        f"{timeout.total_seconds():g}s (its process may be paused)"
                    ) from None
                _store_answers(address, STORE_PROBE_S)

    return create
