"""Issue 52: a daemon thread blocked on a gRPC stream (the job watch, the keepalive
answers) wakes once a second, not ten times, while no message comes. Checked on the
installed gRPC's own wait loop, so a gRPC that renamed its setting fails here."""

from __future__ import annotations

import threading
import time

import grpc._common  # type: ignore[import-untyped]

import daemon.coordination.etcd_client  # noqa: F401  # sets the slice on import


def test_a_stream_reader_waits_in_one_second_slices_and_wakes_on_a_message() -> None:
    condition = threading.Condition()
    arrived: list[bool] = []
    slices: list[float | None] = []

    def wait_fn(timeout: float | None = None) -> bool:
        slices.append(timeout)
        return condition.wait(timeout)

    def message() -> None:
        time.sleep(2.5)
        with condition:
            arrived.append(True)
            condition.notify_all()

    threading.Thread(target=message, daemon=True).start()
    with condition:
        grpc._common.wait(wait_fn, lambda: bool(arrived))
    assert arrived
    assert 2 <= len(slices) <= 3, slices  # ten times a second would be 25
    assert all(s == 1.0 for s in slices), slices
