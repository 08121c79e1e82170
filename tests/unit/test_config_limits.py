"""The job file's shape limits (trainer/config/limits.py): depth measured before parsing
TOML must count real nesting and nothing else."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, parse_override
from trainer.config.limits import MAX_DEPTH, shorten, text_depth, value_depth


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("a = 1", 1),
        ("x = [1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]", 2),  # a float is two parts, not a chain
        ("a.b.c = 1", 3),
        ('"a"."b" . c = 1', 3),
        ("x = [[[1]]]", 3),
        ("x = {a = {b = 1}}", 2),
        ('x = "[[[[[[.a.b.c.d.e.f"  # [[[[ a.b.c.d.e.f.g.h', 1),  # strings, comments
        ("x = '''[[[[\n[[[['''", 1),
        ('x = """a\\"""[[[["""', 1),  # an escaped quote does not end the string
        ("[a.b]\nc.d = 1", 2),
    ],
)
def test_text_depth_counts_nesting_only(text: str, depth: int) -> None:
    assert text_depth(text) == depth


def test_value_depth_without_recursion() -> None:
    deep: list[object] = []
    for _ in range(100_000):  # far beyond the interpreter's recursion limit
        deep = [deep]
    assert value_depth(deep) > MAX_DEPTH
    assert value_depth({"a": {"b": [1, 2]}}) == 3
    assert value_depth(5) == 0


def test_a_deep_set_value_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"--set train\.x nests tables or arrays more than"):
        parse_override("train.x=" + "[" * 5000 + "]" * 5000)


def test_shorten_keeps_short_values_and_cuts_long_ones() -> None:
    assert shorten("abc") == "'abc'"
    assert shorten("x" * 1000) == "'" + "x" * 59 + "... (1000 characters)"
