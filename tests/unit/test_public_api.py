"""The workload API's public names: what the docs and examples import exists, and the
old module (``trainer.workload``, before 0.2.0) still works for one release, with a
DeprecationWarning that names its replacement."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

import trainer.workloads

ROOT = Path(__file__).resolve().parents[2]
IMPORT = re.compile(r"^from (trainer[\w.]*) import ([\w, ]+)$", re.MULTILINE)


def documented_imports() -> list[tuple[str, str]]:
    """(module, name) for every `from trainer... import ...` line of the docs, the README
    and the examples."""
    files = [*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("examples/**/*.py")]
    found = set()
    for f in files:
        for module, names in IMPORT.findall(f.read_text()):
            found |= {(module, n.strip()) for n in names.split(",") if n.strip()}
    return sorted(found)


def test_the_docs_and_examples_import_the_workload_api_from_trainer_workloads() -> None:
    imports = documented_imports()
    assert ("trainer.workloads", "Workload") in imports
    assert ("trainer.workloads", "WorkloadContext") in imports


@pytest.mark.parametrize(("module", "name"), documented_imports())
def test_every_documented_name_imports(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def _fresh_import(name: str) -> object:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_the_old_module_warns_once_naming_the_new_one() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"trainer\.workload is deprecated.*trainer\.workloads"
    ):
        _fresh_import("trainer.workload")


def test_the_old_module_has_every_name_of_the_new_one_as_the_same_object() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = _fresh_import("trainer.workload")
    assert sorted(old.__all__) == sorted(trainer.workloads.__all__)  # type: ignore[attr-defined]
    for name in trainer.workloads.__all__:
        assert getattr(old, name) is getattr(trainer.workloads, name), name
