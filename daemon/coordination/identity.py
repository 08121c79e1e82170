"""Who holds a key: a node id and the daemon process (instance) that claimed it.

Node ids are names an operator chooses (the hostname by default), so two
daemons can be started with the same one by mistake. Each daemon process
therefore draws a random *instance* when it starts; its node record, its slot
and the leader key carry both. A daemon refuses to join while its node id is
held by another instance whose lease stays alive (see ``daemon.supervision.upkeep``), except
its *predecessor*: the instance that last ran with the same run directory,
which a restarted daemon replaces at once instead of waiting out its lease.

Hosts are told apart by a *machine* identity in each node record: the kernel's boot id
and this process's network namespace. Daemons on one machine share its loopback and may
all advertise 127.0.0.1 (the demo, the tests); network namespaces of one kernel have
loopbacks of their own, so they count as machines. Two nodes on different machines
that advertise one address are refused at join (:func:`address_clash`).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.coordination.records import load_value

INSTANCE_FILE = "instance"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
NET_NAMESPACE = "/proc/self/ns/net"


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


def machine_id() -> str:
    """This machine, as node records tell machines apart: ``<boot id>/<netns inode>``
    ("" when neither can be read: then no record is compared with this one)."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    try:
        netns = str(os.stat(NET_NAMESPACE).st_ino)
    except OSError:
        netns = ""
    return f"{boot}/{netns}" if boot or netns else ""


def address_clash(
    node_id: str, host: str, machine: str, nodes: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """The id of another node whose record advertises `host` from another machine, or
    None. Records without a machine identity (older daemons) are not compared."""
    if not machine:
        return None
    for other, record in sorted(nodes.items()):
        theirs = record.get("machine")
        if (
            other != node_id
            and record.get("host") == host
            and isinstance(theirs, str)
            and theirs
            and theirs != machine
        ):
            return other
    return None
