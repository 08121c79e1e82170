"""What a job looks like in etcd: the keys under ``/phalanx/<job>/`` read into a :class:`JobView`.

Values are canonical JSON (:func:`dump`), so transactions can compare them. The
spec helpers name the sections in which two job files differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from daemon.coordination.identity import holder_of
from daemon.coordination.progress import ASK_KEY
from daemon.coordination.records import key_text, load_value

STATES = ("running", "completed", "failed")


@dataclass(frozen=True)
class JobView:
    """A snapshot of ``/phalanx/<job>/``; JSON-able via ``dataclasses.asdict``."""

    nodes: dict[str, dict[str, Any]]
    groups: dict[int, str]
    leader: str | None
    lighthouse: str | None
    checkpoint: dict[str, Any] | None
    state: dict[str, Any] | None
    spec: dict[str, Any] | None
    # The leader value's "epoch" (a lighthouse served on from a lapsed leader lease keeps
    # its own), else the leader key's create revision: one per lighthouse term.
    leader_epoch: int | None = None
    revision: int = 0  # etcd's revision when this was read
    progress_asked: Any = None  # asks/progress: a node wants everyone's progress now
    lost: Any = None  # quorum members the leader's lighthouse stopped hearing from
    failed: dict[int, Any] = field(default_factory=dict)  # gid -> its daemon's failure word
    # Groups that span nodes (job.nodes_per_group > 1): gid -> node rank -> node id of
    # each held seat; gid -> the group's generation; gid -> its first node's store record.
    seats: dict[int, dict[int, str]] = field(default_factory=dict)
    generations: dict[int, int] = field(default_factory=dict)
    stores: dict[int, dict[str, Any]] = field(default_factory=dict)
    # node id -> {"leader", "epoch"} of the leader whose host it found silent (unreachable.py)
    suspects: dict[str, Any] = field(default_factory=dict)

    def whole_groups(self, nodes_per_group: int) -> list[int]:
        """The groups with every seat held (a group of one node: its slot)."""
        if nodes_per_group == 1:
            return sorted(self.groups)
        return sorted(g for g, held in self.seats.items() if len(held) >= nodes_per_group)

    def holders(self) -> set[str]:
        """Every node id that holds a slot or a seat."""
        return set(self.groups.values()) | {n for s in self.seats.values() for n in s.values()}


def leader_value(holder: str, epoch: int) -> str:
    """The leader key's value for `holder` (its JSON) serving on under leader `epoch`."""
    return dump({**json.loads(holder), "epoch": epoch})


def dump(value: object) -> str:
    """Canonical JSON: equal values give equal bytes, so transactions can compare values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def overall_spec_hash(sections: dict[str, str]) -> str:
    """The overall hash of a job file's shared sections."""
    return hashlib.sha256(dump(sections).encode()).hexdigest()


def differing_sections(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def mismatch_message(job: str, sections: list[str], devices: tuple[str, str] | None = None) -> str:
    """Why a node cannot join `job`; `devices` (the job's, this node's) when they differ."""
    if devices is not None and devices[0] != devices[1]:
        return (
            f"job '{job}' trains on {devices[0]} and this node would train on {devices[1]}: "
            "replica groups of one job must share a device type (and so a dtype); set "
            f'node.device = "{devices[0]}" here or use another job.name.'
        )
    what = (
        f"section {sections[0]} differs"
        if len(sections) == 1
        else f"sections {', '.join(sections)} differ"
    )
    return (
        f"job '{job}' is running with a different job file: {what}; "
        "use the same file on every node or another job.name."
    )


def read_entry(prefix: str, kv: Any) -> tuple[str, Any] | None:
    """One key-value of a job as (its name below `prefix`, its JSON value); None for a key
    or value that cannot be read (``daemon.coordination.records`` reports it)."""
    key = key_text(kv.key)
    if key is None:
        return None
    ok, value = load_value(kv.value, kv.key)
    return (key[len(prefix) :], value) if ok else None


def assemble(entries: Iterable[tuple[str, Any, int]], revision: int = 0) -> JobView:
    """A :class:`JobView` from (name, value, create revision) entries of one job."""
    nodes: dict[str, dict[str, Any]] = {}
    groups: dict[int, str] = {}
    seats: dict[int, dict[int, str]] = {}
    generations: dict[int, int] = {}
    stores: dict[int, dict[str, Any]] = {}
    failed: dict[int, Any] = {}
    suspects: dict[str, Any] = {}
    single: dict[str, Any] = {}
    epoch: int | None = None
    for name, value, created in entries:
        if name.startswith("nodes/") and isinstance(value, dict):
            nodes[name[len("nodes/") :]] = value
        elif name.startswith("groups/") and name[len("groups/") :].isdigit():
            groups[int(name[len("groups/") :])] = holder_of(value)[0] or str(value)
        elif name.startswith("seats/") and _digits(name, 2):
            gid, rank = (int(part) for part in name.split("/")[1:])
            seats.setdefault(gid, {})[rank] = holder_of(value)[0] or str(value)
        elif name.startswith("generation/") and _digits(name, 1):
            carried = value.get("generation") if isinstance(value, dict) else None
            if isinstance(carried, int):
                generations[int(name.split("/")[1])] = carried
        elif name.startswith("stores/") and _digits(name, 1) and isinstance(value, dict):
            stores[int(name.split("/")[1])] = value
        elif name.startswith("failed/") and _digits(name, 1):
            failed[int(name.split("/")[1])] = value
        elif name.startswith("suspects/"):
            suspects[name[len("suspects/") :]] = value
        else:
            single[name] = value
            if name == "leader":
                carried = value.get("epoch") if isinstance(value, dict) else None
                epoch = carried if isinstance(carried, int) else created
    for gid, held in seats.items():  # a spanning group is named by its lowest seat's node
        groups.setdefault(gid, held[min(held)])
    return JobView(
        nodes=nodes,
        groups=dict(sorted(groups.items())),
        leader=holder_of(single["leader"])[0] if "leader" in single else None,
        lighthouse=_str_or_none(single.get("lighthouse")),
        checkpoint=_dict_or_none(single.get("checkpoints/latest")),
        state=_dict_or_none(single.get("state")),
        spec=_dict_or_none(single.get("spec")),
        leader_epoch=epoch,
        revision=revision,
        progress_asked=single.get(ASK_KEY),
        lost=single.get("lost"),
        failed=dict(sorted(failed.items())),
        seats={g: dict(sorted(held.items())) for g, held in sorted(seats.items())},
        generations=generations,
        stores=stores,
        suspects=suspects,
    )


def _digits(name: str, parts: int) -> bool:
    """Whether `name` is a prefix and `parts` numbers, '/'-separated."""
    rest = name.split("/")[1:]
    return len(rest) == parts and all(p.isdigit() for p in rest)


def parse_job(prefix: str, kvs: Iterable[Any], revision: int = 0) -> JobView:
    """A :class:`JobView` from the key-values of one range read of ``prefix`` (at `revision`)."""
    entries = []
    for kv in kvs:
        entry = read_entry(prefix, kv)
        if entry is not None:
            entries.append((*entry, int(kv.create_revision)))
    return assemble(entries, revision)


def json_dict(raw: bytes) -> dict[str, Any]:
    """A JSON object stored in etcd; anything else (hand-edited, corrupt, too deep) reads
    as empty."""
    ok, value = load_value(raw)
    return value if ok and isinstance(value, dict) else {}


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _dict_or_none(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None
