"""Which file system a path is on, read from ``/proc/self/mountinfo``.

The preflight refuses a checkpoint or run directory on a pseudo file system (``/proc``,
``/sys``, ``/dev``...): nothing written there is ever stored, and as root the usual
access checks say yes to it, so only the mount's type tells.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

# Kernel file systems that hold no files of ours: creating one fails, or vanishes.
PSEUDO = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "rpc_pipefs",
        "securityfs",
        "sysfs",
        "tracefs",
    }
)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def fs_type(path: str, mountinfo: str) -> str | None:
    """The type of the file system `path` (absolute, symlinks resolved) is on: that of
    the longest mount point above it, the last mounted where two share one. None when
    `mountinfo` names none (it always has "/" on Linux)."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5 or not rest.split():
            continue
        point = _unescape(parts[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), rest.split()[0])
    return None if best is None else best[1]


def pseudo_fs(path: Path) -> str | None:
    """The pseudo file system's type if `path` (which exists) is on one, else None; None
    too where the mount table cannot be read (not Linux): the write probe still runs."""
    try:
        table = MOUNTINFO.read_text()
    except OSError:
        return None
    kind = fs_type(os.path.realpath(path), table)
    return kind if kind in PSEUDO else None
