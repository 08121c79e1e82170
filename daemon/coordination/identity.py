"""Who holds a key: a node id and the daemon process (instance) that claimed it.

Node ids are names an operator chooses (the hostname by default), so two
daemons can be started with the same one by mistake. Each daemon process
therefore draws a random *instance* when it starts; its node record, its slot
and the leader key carry both. A daemon refuses to join while its node id is
held by another instance whose lease stays alive (see ``daemon.supervision.upkeep``), except
its *predecessor*: the instance that last ran with the same run directory,
which a restarted daemon replaces at once instead of waiting out its lease.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from daemon.coordination.records import load_value

INSTANCE_FILE = "instance"


@dataclass(frozen=True)
class Identity:
    node_id: str
    instance: str  # this process
    predecessor: str | None = None  # the previous process with this run directory

    def holder(self) -> str:
        """The value this daemon writes into slot and leader keys (JSON)."""
        return json.dumps(
            {"instance": self.instance, "node": self.node_id}, sort_keys=True, separators=(",", ":")
        )

    def succeeds(self, instance: object) -> bool:
        """Whether keys held by `instance` are this daemon's to take over."""
        return instance is not None and instance in (self.instance, self.predecessor)


def new_instance() -> str:
    return secrets.token_hex(6)


def take_identity(node_id: str, run_dir: Path) -> Identity:
    """A fresh instance for this process; the run directory's previous one is the predecessor."""
    path = run_dir / INSTANCE_FILE
    try:
        previous = path.read_text().strip() or None
    except OSError:
        previous = None
    me = Identity(node_id, new_instance(), previous)
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(me.instance + "\n")
    return me


def holder_of(raw: bytes | str | object) -> tuple[str | None, str | None]:
    """(node id, instance) of a slot or leader value; older plain-string values have no instance."""
    value: object = raw
    if isinstance(raw, bytes | str):
        ok, value = load_value(raw)
        if not ok:
            return None, None
    if isinstance(value, dict):
        node, instance = value.get("node"), value.get("instance")
        return (
            node if isinstance(node, str) else None,
            instance if isinstance(instance, str) else None,
        )
    return (value, None) if isinstance(value, str) else (None, None)
