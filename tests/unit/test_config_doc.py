"""docs/configuration.md is generated from the config models and must not go stale."""

from __future__ import annotations

from pathlib import Path

from daemon.config import DaemonConfig
from daemon.config.reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/configuration.md is stale: run `make docs` and commit it"
    )


def test_every_key_is_documented_with_a_meaning() -> None:
    text = render()
    for section, field in DaemonConfig.model_fields.items():
        assert f"## [{section}]" in text
        model = field.annotation
        for key, info in model.model_fields.items():  # type: ignore[union-attr]
            assert f"| `{info.alias or key}` |" in text
            assert info.description, f"{section}.{key} has no description"
