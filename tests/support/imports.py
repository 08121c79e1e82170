"""The static import graph of a source tree, and the layer rules DESIGN.md writes down.

Every ``import`` and ``from ... import`` counts, wherever it stands: at the top, in a
function (a lazy import) or under ``if TYPE_CHECKING``. ``from pkg import name`` is an
edge to the module ``pkg.name`` when there is one, else to ``pkg`` (its ``__init__``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

Graph = dict[str, set[str]]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, packages: Iterable[str]) -> Graph:
    """Module -> the modules of `packages` it imports (never itself)."""
    files = {module_name(root, p): p for pkg in packages for p in (root / pkg).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for target in targets:
                found = known(target)
                if found is not None and found != mod:
                    graph[mod].add(found)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


@dataclass(frozen=True)
class Layers:
    """Units (a package or a module) in layers, lowest first; peers share a layer."""

    layer: dict[str, int]
    allowed: dict[str, set[str]]  # package -> the other package's modules it may import

    def unit(self, module: str) -> str | None:
        name = module
        while name and name not in self.layer:
            name = name.rpartition(".")[0]
        return name or None

    def violations(self, graph: Mapping[str, set[str]]) -> list[str]:
        found = []
        for mod in sorted(graph):
            home = self.unit(mod)
            if home is None:
                found.append(f"{mod} is in no layer of DESIGN.md")
                continue
            top = mod.split(".")[0]
            for target in sorted(graph[mod]):
                there = self.unit(target)
                if target.split(".")[0] != top:
                    if not any(
                        target == a or target.startswith(a + ".") for a in self.allowed.get(top, ())
                    ):
                        found.append(f"{mod} imports {target}, which {top} may not import")
                elif there is None:
                    found.append(f"{target} is in no layer of DESIGN.md")
                elif there != home and self.layer[there] >= self.layer[home]:
                    found.append(
                        f"{mod} (layer {self.layer[home]}) imports {target} "
                        f"(layer {self.layer[there]}): only lower layers may be imported"
                    )
        return found


def read_layers(design: str) -> Layers:
    """The ```layers block of DESIGN.md: one layer a line, lowest first, per package;
    ``pkg -> a b`` lines name what one top-level package may import from another."""
    match = re.search(r"```layers\n(.*?)```", design, re.S)
    if match is None:
        raise ValueError("DESIGN.md has no ```layers block")
    layer: dict[str, int] = {}
    allowed: dict[str, set[str]] = {}
    number = 0
    for raw in match.group(1).splitlines():
        line = raw.split("#")[0].strip()
        if not line:
            continue
        if "->" in line:
            source, _, targets = line.partition("->")
            allowed[source.strip()] = set(targets.split())
            continue
        number += 1
        for unit in line.split():
            layer[unit] = number
    return Layers(layer, allowed)
