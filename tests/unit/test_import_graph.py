"""The packages' import graph: no cycles, and every import goes down DESIGN.md's layers.

Static: every import statement counts, lazy and ``TYPE_CHECKING`` ones included, so a
cycle cannot hide behind an import inside a function.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import cycles, import_graph, read_layers

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "trainer")


def test_daemon_and_trainer_have_no_import_cycle() -> None:
    assert cycles(import_graph(ROOT, PACKAGES)) == []


def test_every_import_goes_down_the_layers_design_md_writes_down() -> None:
    layers = read_layers((ROOT / "DESIGN.md").read_text())
    assert layers.violations(import_graph(ROOT, PACKAGES)) == []


def test_a_lazy_or_type_checking_import_that_closes_a_loop_is_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nB = 1\n"
    )
    (pkg / "c.py").write_text("def f() -> None:\n    from pkg import d\n")
    (pkg / "d.py").write_text("from . import c\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]


def test_an_import_up_the_layers_or_across_peers_or_packages_is_reported() -> None:
    layers = read_layers("```layers\np.low\np.mid p.other  # peers\np.high\np -> q.ok\n```\n")
    graph = {
        "p.low.x": {"p.mid.y", "q.ok.z", "q.no"},
        "p.mid.y": {"p.low.x", "p.other.w"},
        "p.other.w": set(),
        "p.high": {"p.mid.y", "p.low.x"},
        "p.stray": set(),
    }
    assert layers.violations(graph) == [
        "p.low.x (layer 1) imports p.mid.y (layer 2): only lower layers may be imported",
        "p.low.x imports q.no, which p may not import",
        "p.mid.y (layer 2) imports p.other.w (layer 2): only lower layers may be imported",
        "p.stray is in no layer of DESIGN.md",
    ]


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/support/; a test module imports only those."""
    graph = import_graph(ROOT, ["tests"])
    tests = {m for m in graph if m.rpartition(".")[2].startswith("test_")}
    assert {m: sorted(graph[m] & tests) for m in sorted(tests) if graph[m] & tests} == {}
