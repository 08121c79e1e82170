"""Each node's progress (its group's step, quorum size and leader epoch), kept where no
daemon's watch hears it.

A node's step moves every training step; its quorum size changes whenever any group
joins or leaves, its leader epoch whenever the leader changes. In its record
(``nodes/<id>``, under the watched job prefix) every such update was an event every
other daemon received, N daemons times N writers. It lives instead under ``/phalanx/_progress/<job>/<node>``
('_' cannot begin a job name, so no job's prefix holds it), bound to the node's
lease, written when the step changed and the last write is ``PROGRESS_EVERY_S`` old
(``daemon.supervision.node_record``), and read only when asked for:

* by ``phalanx status``, for its step column;
* by a node that lost its lease while fenced and must judge its paused ranks
  (``daemon.fencing.rules.after_fence`` compares its step with the others').
  Progress up to ``PROGRESS_EVERY_S`` old could hide that the others went on, so that
  node first puts ``asks/progress`` under the job prefix: every daemon's watch hears
  it and the daemon writes its progress at once; an answer is a progress key modified
  after the ask's revision. A running node that has not answered within
  ``ASK_WAIT_S`` makes the asker restart its ranks (``daemon.fencing.progress_ask``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from daemon.coordination.records import key_text, load_value

PROGRESS_EVERY_S = 10.0
ASK_KEY = "asks/progress"  # below the job prefix: every daemon watches it
ASK_WAIT_S = 3.0  # how long an asking node waits for every running node's answer
# The last two ride on writes made for the others (daemon.supervision.node_record): the
# node's seconds by activity since its daemon started, and over the last hour.
FIELDS = ("step", "participants", "epoch", "epoch_step", "time", "time_1h")


@dataclass(frozen=True)
class Progress:
    step: int | None
    revision: int  # the key's mod revision: newer than an ask's revision answers it
    fields: dict[str, Any]  # as written: step, participants, epoch, epoch_step


def progress_prefix(job: str) -> str:
    return f"/phalanx/_progress/{job}/"


def progress_key(job: str, node_id: str) -> str:
    return progress_prefix(job) + node_id


def reached_key(job: str) -> str:
    """The highest step the job reached in this run, written in the same request as a
    node's progress when its step passes what the key held
    (``daemon.supervision.node_record``). Bound to no lease, so it outlives every node: a
    job that can only start over from step 0 is told by it (docs/operations.md,
    "Starting over"). Outside every watched prefix."""
    return f"/phalanx/_reached/{job}"


def parse_reached(job: str, value: bytes | None) -> int:
    """The step in `job`'s :func:`reached_key` value; 0 when there is none or it is
    unreadable."""
    if value is None:
        return 0
    ok, doc = load_value(value, reached_key(job).encode())
    step = doc.get("step") if ok and isinstance(doc, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 0


def parse_progress(job: str, kvs: Iterable[Any]) -> dict[str, Progress]:
    """Progress by node id from one range read of :func:`progress_prefix`; unreadable
    keys and values are skipped (``daemon.coordination.records`` reports them)."""
    prefix, found = progress_prefix(job), {}
    for kv in kvs:
        key = key_text(kv.key)
        ok, value = load_value(kv.value, kv.key)
        if key is None or not ok or not isinstance(value, dict):
            continue
        step = value.get("step")
        valid = isinstance(step, int) and not isinstance(step, bool)
        found[key[len(prefix) :]] = Progress(
            step if valid else None, int(kv.mod_revision), {k: value.get(k) for k in FIELDS}
        )
    return found


def answered(
    progress: dict[str, Progress], nodes: dict[str, dict[str, Any]], me: str, ask: int
) -> bool:
    """Whether every other running node has written its progress since the ask."""
    return all(
        name in progress and progress[name].revision > ask
        for name, record in nodes.items()
        if name != me and record.get("state") == "running"
    )


def with_steps(
    nodes: dict[str, dict[str, Any]], progress: dict[str, Progress]
) -> dict[str, dict[str, Any]]:
    """The nodes' records with their progress (step, quorum size, leader epoch) where
    there is one."""
    return {
        name: {**record, **progress[name].fields} if name in progress else dict(record)
        for name, record in nodes.items()
    }
