"""Each field of the node's view has one writer (the code, read statically), and only the
supervisor and the rank output threads write it: the other parts hand in reports.

An assignment counts when it sets ``<something>.view.<field>`` or ``view.<field>``
anywhere in daemon/, or ``self.<field>`` inside NodeView itself (its ``track``, which
the rank output threads call), whole or by item (``view.restarts[k] = ...``).
"""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

from daemon.node_state.view import NodeView

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(NodeView)} - {"lock"}
OWNERS = {
    "daemon/supervision/supervisor.py": {
        "state", "registered", "restarts", "failure", "last_tick", "ticks", "waiting_for",
        "generation", "health", "reached",
    },
    "daemon/node_state/view.py": {  # track (the rank output threads) and completed_for
        "step", "loss", "participants", "largest_quorum", "committed_steps", "heals",
        "started_over", "started_over_from", "last_heal_s", "rank_error", "stragglers", "train_done", "latest_checkpoint", "invalid_checkpoints", "completed_seen_at",
    },
}  # fmt: skip


def _field_written(target: ast.expr, in_view: bool) -> str | None:
    while isinstance(target, ast.Subscript):
        target = target.value
    if not isinstance(target, ast.Attribute) or target.attr not in FIELDS:
        return None
    owner = target.value
    if isinstance(owner, ast.Name) and (owner.id == "view" or (in_view and owner.id == "self")):
        return target.attr
    if isinstance(owner, ast.Attribute) and owner.attr == "view":
        return target.attr
    return None


def writers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((ROOT / "daemon").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        in_view = rel == "daemon/node_state/view.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:
                    name = _field_written(leaf, in_view)
                    if name is not None:
                        found[name].add(rel)
    return found


def test_every_field_of_the_view_has_one_writer_the_documented_one() -> None:
    found = writers()
    assert {f: w for f, w in found.items() if len(w) > 1} == {}
    assert {f: next(iter(w)) for f, w in found.items()} == {
        f: module for module, fields in OWNERS.items() for f in fields
    }


def test_a_second_writer_is_found(tmp_path: Path) -> None:
    tree = ast.parse("def f(sup):\n    sup.view.step = 1\n    view.restarts['x'] += 1\n")
    assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AugAssign)]
    names = [
        _field_written(n.targets[0] if isinstance(n, ast.Assign) else n.target, False)
        for n in assigned
    ]
    assert names == ["step", "restarts"]
