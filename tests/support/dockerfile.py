"""The Dockerfile and .dockerignore read as docker reads them: stages and their
instructions, COPY sources, and which files reach the build context
(tests/integration/test_ops_docker.py)."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]


def arg_default(args: str) -> tuple[str, str]:
    name, _, default = args.partition("=")
    return name.strip(), default.strip().strip('"')


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions per stage; continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends in a continuation line"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            parts = args.split()
            parts = [p for p in parts if not p.startswith("--")]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            global_args.update([arg_default(args)])
        else:
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(global_args, stages)


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def copy_sources(args: str) -> list[str]:
    """Sources of a COPY (exec or shell form), without its flags and destination."""
    words = [w for w in shlex.split(args) if not w.startswith("--")]
    if args.lstrip().startswith("["):
        words = exec_form(args)
    return words[:-1]


# --------------------------------------------------------------------------- .dockerignore


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Go's filepath.Match syntax plus `**` (any directories), as Docker reads it."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out += "[" + ("^" + body[1:] if body.startswith(("!", "^")) else body) + "]"
            i = end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def read_dockerignore() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def ignored(relpath: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or a parent directory wins."""
    parts = relpath.split("/")
    candidates = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = posixpath.normpath(raw.removeprefix("!")).lstrip("/")
        regex = _glob_regex(pattern)
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return excluded


def context_files() -> list[str]:
    """Files under the COPY sources that reach the build context."""
    patterns = read_dockerignore()
    files: list[str] = []
    for source in all_copy_sources():
        path = ROOT / source
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in found:
            rel = f.relative_to(ROOT).as_posix()
            if not ignored(rel, patterns):
                files.append(rel)
    return files


def all_copy_sources() -> list[str]:
    df = parse_dockerfile(DOCKERFILE.read_text())
    return [
        src
        for stage in df.stages
        for args in stage.all("COPY")
        if "--from" not in args
        for src in copy_sources(args)
    ]
