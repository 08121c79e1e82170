"""What :mod:`trainer.ft.torchft_adapter` reaches into, and the check that it all still exists.

Each private name the adapter uses is listed once in :data:`REACH_INS`, with its
kind and the adapter function that uses it. :func:`check_torchft` resolves every
one against the installed torchft (and torch) at startup, so an upgrade fails
loudly, naming what changed, rather than as an ``AttributeError`` in the middle
of a quorum.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import pkgutil
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["instance attribute", "method", "classmethod", "function", "class", "module"]


@dataclass(frozen=True)
class ReachIn:
    """One private name Phalanx uses: where it lives, what kind it must be, who uses it."""

    owner: str  # "module:Class" or "module"
    name: str
    kind: Kind
    used_by: str
    params: tuple[str, ...] = ()  # leading parameters the override or call expects


REACH_INS: tuple[ReachIn, ...] = (
    ReachIn("torchft.manager:_ManagedWork", "_work", "instance attribute", "pending_work"),
    ReachIn(
        "torchft.process_group:ProcessGroupWrapper",
        "_pg",
        "instance attribute",
        "bury_process_group",
    ),
    ReachIn(
        "torchft.process_group:ProcessGroupGloo",
        "_create_pg",
        "method",
        "scoped_process_group (interruptible)",
        ("store", "rank", "world_size"),
    ),
    ReachIn("torchft.manager:Manager", "_client", "instance attribute", "record_quorums"),
    ReachIn("torchft._torchft:ManagerClient", "_quorum", "method", "QuorumRecorder"),
    ReachIn(
        "torchft.manager:Manager", "_quorum_id", "instance attribute", "quorum_id, QuorumRecorder"
    ),
    ReachIn("torchft.manager:Manager", "_healing", "instance attribute", "is_healing"),
    ReachIn("torchft.manager:Manager", "_quorum_future", "instance attribute", "quorum_future"),
    ReachIn(
        "torchft.process_group:ProcessGroupGloo",
        "configure",
        "method",
        "scoped_process_group",
        ("store_addr",),
    ),
    ReachIn(
        "torchft.process_group:ProcessGroupNCCL",
        "configure",
        "method",
        "scoped_process_group",
        ("store_addr",),
    ),
    ReachIn(
        "torchft.checkpointing.http_transport:HTTPTransport",
        "_load_from_address",
        "classmethod",
        "SafeHTTPTransport",
        ("address", "timeout"),
    ),
    ReachIn(
        "torchft.checkpointing.http_transport:HTTPTransport",
        "_server",
        "instance attribute",
        "SafeHTTPTransport",
    ),
    ReachIn("torch.distributed._serialization", "_streaming_load", "function", "SafeHTTPTransport"),
    ReachIn(
        "torchft.checkpointing.http_transport:HTTPTransport",
        "_state_dict",
        "instance attribute",
        "SnapshotTransport",
    ),
    ReachIn(
        "torchft.process_group",
        "create_store_client",
        "function",
        "scoped_process_group",
        ("store_addr", "timeout"),
    ),
    ReachIn("torchft.manager", "ManagerServer", "class", "manager_server_bound_to"),
    ReachIn("torchft.manager", "uuid", "module", "replica_uuid"),
    ReachIn("torchft.manager:Manager", "_commit_failures", "instance attribute", "count_as_new"),
    ReachIn(
        "torchft.checkpointing.http_transport", "_IPv6HTTPServer", "class", "SafeHTTPTransport"
    ),
)


class TorchFTIncompatible(RuntimeError):
    """The installed torchft (or torch) lacks a private name the adapter relies on."""


def versions() -> str:
    return f"torchft {importlib.metadata.version('torchft')} (torch {importlib.metadata.version('torch')})"


def _assigned_in_init(cls: type, name: str) -> bool:
    """Whether ``cls.__init__`` (or a base's) assigns ``self.<name>``."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if not inspect.isfunction(init):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr == name
            ):
                return True
    return False


def _problem(reach: ReachIn) -> str | None:
    """What is wrong with one reach-in on the installed versions, or None."""
    try:
        owner = pkgutil.resolve_name(reach.owner)
    except (ImportError, AttributeError) as e:
        return f"cannot resolve {reach.owner} ({e})"
    if reach.kind == "instance attribute":
        try:
            return None if _assigned_in_init(owner, reach.name) else "not assigned in __init__"
        except (OSError, TypeError) as e:
            return f"cannot read {reach.owner}.__init__ source ({e})"
    found = inspect.getattr_static(owner, reach.name, None)
    if found is None:
        return "missing"
    if reach.kind == "class":
        return None if isinstance(found, type) else f"not a class but {type(found).__name__}"
    if reach.kind == "module":
        return (
            None
            if isinstance(found, types.ModuleType)
            else f"not a module but {type(found).__name__}"
        )
    if reach.kind == "classmethod" and not isinstance(found, classmethod):
        return f"not a classmethod but {type(found).__name__}"
    if reach.kind in ("method", "function") and (
        isinstance(found, classmethod | staticmethod | property) or not inspect.isroutine(found)
    ):
        return f"not a {reach.kind} but {type(found).__name__}"
    if reach.params:
        leading = list(inspect.signature(getattr(owner, reach.name)).parameters)
        if reach.kind == "method":
            leading = leading[1:]  # self
        if leading[: len(reach.params)] != list(reach.params):
            return f"parameters are {leading}, expected to start with {list(reach.params)}"
    return None


def check_torchft(reach_ins: Iterable[ReachIn] = REACH_INS) -> None:
    """Raise one :class:`TorchFTIncompatible` naming every reach-in the installed torchft breaks."""
    problems = [
        f"{r.owner.replace(':', '.')}.{r.name} ({r.kind}, used by {r.used_by}): {problem}"
        for r in reach_ins
        if (problem := _problem(r)) is not None
    ]
    if problems:
        raise TorchFTIncompatible(
            f"{versions()} is not what trainer/ft/torchft_adapter.py was written for; "
            + "; ".join(problems)
        )
