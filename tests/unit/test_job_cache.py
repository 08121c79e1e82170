"""The cached job view and the watch's queue, on etcd's own event messages (no server)."""

from __future__ import annotations

import json
from typing import Any

from pyetcd import events, exceptions
from pyetcd.etcdrpc import kv_pb2

from daemon.coordination.job_cache import JobCache
from daemon.coordination.job_watch import JobWatch

PREFIX = "/phalanx/demo/"


def kv(name: str, value: object, mod: int, create: int | None = None) -> Any:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return kv_pb2.KeyValue(
        key=(PREFIX + name).encode(), value=raw, mod_revision=mod, create_revision=create or mod
    )


def put(name: str, value: object, mod: int, create: int | None = None) -> Any:
    return events.new_event(kv_pb2.Event(type=kv_pb2.Event.PUT, kv=kv(name, value, mod, create)))


def delete(name: str, mod: int) -> Any:
    raw = kv_pb2.KeyValue(key=(PREFIX + name).encode(), mod_revision=mod)
    return events.new_event(kv_pb2.Event(type=kv_pb2.Event.DELETE, kv=raw))


def loaded() -> JobCache:
    cache = JobCache(PREFIX)
    cache.load([kv("nodes/a", {"state": "running"}, 3), kv("leader", {"node": "a"}, 4)], 5)
    return cache


def test_events_update_the_keys_they_name_and_the_view_follows() -> None:
    cache = loaded()
    assert cache.view().leader == "a" and cache.view().leader_epoch == 4
    assert cache.apply([put("nodes/b", {"state": "running", "group": 1}, 6)])
    assert cache.apply([delete("leader", 7), put("leader", {"node": "b"}, 8)])
    view = cache.view()
    assert set(view.nodes) == {"a", "b"} and view.leader == "b" and view.leader_epoch == 8
    assert view.revision == 8 and cache.applied == 3


def test_events_already_in_the_read_are_skipped_but_not_those_sharing_a_later_revision() -> None:
    cache = loaded()
    assert not cache.apply([put("nodes/a", {"state": "stale"}, 5)]), "older than the read"
    assert cache.view().nodes["a"]["state"] == "running"
    # A revoked lease deletes all its keys in one revision: every event of it counts.
    assert cache.apply([delete("nodes/a", 9), delete("leader", 9)])
    assert cache.view().nodes == {} and cache.view().leader is None


def test_an_unreadable_value_leaves_the_key_out_as_a_read_would() -> None:
    cache = loaded()
    cache.apply([put("nodes/a", b"\xff not json", 6)])
    assert "a" not in cache.view().nodes


def test_an_unchanged_cache_keeps_its_view_and_a_load_replaces_everything() -> None:
    cache = loaded()
    first = cache.view()
    assert not cache.apply([]) and cache.view() is first
    cache.load([kv("state", {"state": "completed", "step": 9}, 10)], 10)
    assert cache.view().nodes == {} and cache.view().state == {"state": "completed", "step": 9}


def test_the_watch_queues_events_wakes_for_others_and_gives_up_on_a_compaction() -> None:
    woken: list[bool] = []
    watch = JobWatch(PREFIX + "nodes/a", lambda: woken.append(True))
    watch._watch_id, generation = 1, watch._generation  # as arm() leaves it
    watch.reading()
    watch._on_response(generation, events_of([put("nodes/a", {"state": "x"}, 6)]))
    assert woken == [] and not watch.due(0.0), "its own record is queued quietly"
    watch._on_response(generation, events_of([put("nodes/b", {"state": "x"}, 7)]))
    assert woken == [True] and len(watch.take()) == 2 and watch.take() == []
    watch._on_response(generation, exceptions.RevisionCompactedError(7))
    assert watch.due(0.0) and not watch.armed and woken == [True, True]


class events_of:  # stands for pyetcd's WatchResponse
    def __init__(self, batch: list[Any]) -> None:
        self.events = batch
