"""Limits on a job file's shape, checked before and after parsing it.

A job file is small and shallow: its sections hold settings, a few of them tables
(``node.env``, ``workload.options``). Python's ``tomllib`` recurses once per level of
nested arrays and inline tables (a RecursionError deep down) and keeps every prefix of
a dotted key (``a.a.a...`` 100,000 deep takes tens of gigabytes), so the text is
measured before it is parsed; what it holds is measured again after parsing (a JSON
file, ``--set`` keys) before anything recurses over it. Each breach is a
:class:`ConfigError` naming the file or flag.
"""

from __future__ import annotations

from typing import Any

from trainer.config.sections import ConfigError

MAX_JOB_FILE_BYTES = 1 << 20  # 1 MiB: a job file is a page of settings
MAX_DEPTH = 32  # tables and arrays inside one another, sections included

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+:")


def _skip_string(text: str, i: int) -> int:
    """Index just past the TOML string that starts at ``text[i]`` (a quote)."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        while quote == '"' and end > 0 and _escaped(text, end):
            end = text.find(quote * 3, end + 1)
        return len(text) if end < 0 else end + 3
    j = i + 1
    while j < len(text) and text[j] not in (quote, "\n"):
        j += 2 if quote == '"' and text[j] == "\\" else 1
    return j + 1


def _escaped(text: str, at: int) -> bool:
    backslashes = 0
    while at - backslashes - 1 >= 0 and text[at - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def text_depth(text: str) -> int:
    """How deep TOML text nests, counted without parsing it: the deepest run of
    brackets and braces, or the longest dotted key (``a.b.c`` is 3), whichever is more.
    Strings and comments are skipped; a float (``1.5``) counts as a key of two parts."""
    deepest = depth = chain = 0
    after_dot = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i = _skip_string(text, i)
            chain = chain + 1 if after_dot else 1
            after_dot = False
        elif c in _BARE:
            while i < n and text[i] in _BARE:
                i += 1
            chain = chain + 1 if after_dot else 1
            after_dot = False
        elif c == ".":
            after_dot = True
            i += 1
        elif c in " \t":
            i += 1
        else:
            if c == "#":
                i = text.find("\n", i)
                i = n if i < 0 else i
            elif c in "[{":
                depth += 1
            elif c in "]}":
                depth = max(0, depth - 1)
            chain, after_dot = 0, False
            i += 1
        deepest = max(deepest, depth, chain)
    return deepest


def value_depth(value: Any) -> int:
    """How deep tables and arrays nest in a parsed value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def too_deep(what: str) -> ConfigError:
    return ConfigError(
        f"{what} nests tables or arrays more than {MAX_DEPTH} levels deep; "
        "a job file's settings are at most a few levels deep, so flatten it."
    )


def check_text_depth(text: str, what: str) -> None:
    """Refuse TOML text that nests deeper than :data:`MAX_DEPTH`, before it is parsed."""
    if text_depth(text) > MAX_DEPTH:
        raise too_deep(what)


def check_value_depth(value: Any, what: str) -> None:
    """Refuse a parsed value that nests deeper than :data:`MAX_DEPTH`."""
    if value_depth(value) > MAX_DEPTH:
        raise too_deep(what)


def shorten(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters with its full length noted."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes) else len(text)
    return f"{text[:limit]}... ({size} characters)"
