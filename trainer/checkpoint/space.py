"""Why a save failed, in words, and whether the volume has room for the next one.

DCP reports a failed write as ``CheckpointException``, which derives from
``BaseException`` (one per failing rank, each wrapped with its traceback), and a
full disk often surfaces not as ``ENOSPC`` but as a torch serialization error
("unexpected pos ...") from a truncated write. So a failure is judged by what it
carries *and* by the volume: when the volume has less room than a checkpoint
needs, the cause is said as that ("no space left on <dir>: 3.1 MB free, a
checkpoint needs ~15 MB"), whatever the exception.
"""

from __future__ import annotations

import errno
from pathlib import Path

from trainer.contracts.volume import free_bytes

# What a save must never swallow: the process is being told to stop.
INTERRUPTS = (KeyboardInterrupt, SystemExit, GeneratorExit)
FULL = (errno.ENOSPC, errno.EDQUOT)
MB = 1e6
# Room asked for beyond the last checkpoint's size (the state may have grown a little,
# and a volume filled to the last byte slows everything else on it).
HEADROOM = 1.1


def causes(error: BaseException) -> list[BaseException]:
    """The error, the per-rank errors inside a CheckpointException, and their chains."""
    seen: list[BaseException] = []
    todo = [error]
    while todo:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for wrapped in failures.values():
                if isinstance(wrapped, tuple) and wrapped and isinstance(wrapped[0], BaseException):
                    todo.append(wrapped[0])
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return seen


def no_room(directory: Path, needed: int | None) -> str | None:
    """The sentence for a volume without room for a checkpoint of `needed` bytes, or None."""
    free = free_bytes(directory)
    if free is None or needed is None or free >= needed * HEADROOM:
        return None
    return (
        f"no space left on {directory}: {free / MB:.1f} MB free, "
        f"a checkpoint needs ~{needed / MB:.1f} MB"
    )


def describe(error: BaseException, directory: Path, needed: int | None) -> str:
    """One line: the full volume if that is what happened, else the first real error."""
    found = causes(error)
    full = any(isinstance(e, OSError) and e.errno in FULL for e in found)
    room = no_room(directory, needed)
    if room is not None:
        return room
    if full:
        free = free_bytes(directory)
        left = "" if free is None else f": {free / MB:.1f} MB free"
        return f"no space left on {directory}{left}"
    inner = [e for e in found if type(e).__name__ != "CheckpointException"]
    first = inner[0] if inner else error
    text = str(first).strip().splitlines()
    return f"{type(first).__name__}: {text[0] if text else ''}".rstrip(": ")
