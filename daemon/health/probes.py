"""What the health checks judge, read from this machine (never through torch).

Each probe returns the figures of ``daemon.health.checks`` and never raises for what the
machine may do (a read-only or full volume, a missing ``nvidia-smi``, no cgroup files):
that is a figure too. The checkpoint directory's probe writes one small file and removes
it; nothing else here writes anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from daemon.health.checks import DeviceFigures, DirFigures
from trainer.contracts.checkpoint_names import MARKER, MARKERS_GLOB, STEPS_GLOB
from trainer.contracts.volume import free_bytes

NEWEST_TRIED = 3  # markers looked at, newest first, before giving up on a size
SMI_TIMEOUT_S = 10.0
# Lines of `nvidia-smi -L` that mean a GPU is in trouble (it lists the others as "GPU n: ...").
SMI_TROUBLE = ("unable to determine", "unknown error", "fallen off the bus", "has failed")
GPU_NODE = re.compile(r"nvidia\d+")


# ------------------------------------------------------------------ checkpoint directory


def probe_checkpoint_dir(directory: Path, tag: str) -> DirFigures:
    """Create `directory` if needed, write and remove a probe file named after `tag`, and
    read the volume's free space, the newest complete checkpoint's size under it and what
    a save under way has written so far."""
    error = None
    probe = directory / f".phalanx-health-{tag}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"phalanx health probe\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        error = e.strerror or str(e)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    newest = newest_checkpoint_bytes(directory)
    return DirFigures(directory, error, free_bytes(directory), newest, unmarked_bytes(directory))


def newest_checkpoint_bytes(job_dir: Path) -> int | None:
    """The size of the newest complete checkpoint of the job (any run), from its marker's
    list of files; None when there is none (or no marker can be read)."""
    markers = []
    for path in job_dir.glob(MARKERS_GLOB):
        with contextlib.suppress(OSError):
            markers.append((path.stat().st_mtime, path))
    for _, path in sorted(markers, reverse=True)[:NEWEST_TRIED]:
        try:
            files = json.loads(path.read_text()).get("files")
            return sum(int(f["size"]) for f in files.values())
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue  # being written or replaced, or not a marker we know: the next one
    return None


def unmarked_bytes(job_dir: Path) -> int:
    """Bytes in the step directories newer than the newest marker that have none yet: a
    save under way (the writer's own, on its volume) has taken that much of the room the
    next save needs, so it is not counted against the node. A partial save the ranks
    failed to remove counts too, which errs towards healthy."""
    steps, newest_marked = [], 0.0
    for step in job_dir.glob(STEPS_GLOB):
        with contextlib.suppress(OSError):
            marker = step / MARKER
            if marker.exists():
                newest_marked = max(newest_marked, marker.stat().st_mtime)
            else:
                steps.append((step.stat().st_mtime, step))
    total = 0
    for mtime, step in steps:
        if mtime >= newest_marked:
            total += _tree_bytes(step)
    return total


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


# ---------------------------------------------------------------------------- devices


def count_gpus(visible: str | None) -> DeviceFigures:
    """The GPUs the ranks can see: `nvidia-smi -L`'s list (a failed call or a GPU it
    cannot reach is an error), else the /dev/nvidia<N> nodes, capped by the entries of
    CUDA_VISIBLE_DEVICES (`visible`) when that is set."""
    smi = shutil.which("nvidia-smi")
    count: int | None
    error = None
    if smi is not None:
        source = "nvidia-smi -L"
        try:
            done = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return DeviceFigures("cuda", None, source, f"nvidia-smi -L did not answer: {e}")
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
        count = sum(1 for line in lines if line.startswith("GPU "))
        trouble = [line for line in lines if any(t in line.lower() for t in SMI_TROUBLE)]
        if trouble:
            error = trouble[0][:200]
        elif done.returncode != 0 and count == 0:
            first = next((line for line in lines if line), "")
            error = f"nvidia-smi -L exited {done.returncode}: {first[:160]}".rstrip(": ")
    else:
        source = "/dev/nvidia<N>"
        try:
            count = sum(1 for name in os.listdir("/dev") if GPU_NODE.fullmatch(name))
        except OSError:
            count = None
        if not count:
            count, source = None, "no nvidia-smi and no /dev/nvidia<N>"
    if visible is not None and count is not None:
        entries = [e for e in visible.split(",") if e.strip()]
        count, source = min(count, len(entries)), f"{source}, within CUDA_VISIBLE_DEVICES"
    return DeviceFigures("cuda", count, source, error)


def count_cpus() -> DeviceFigures:
    """The CPU cores the daemon's main thread may run on (a cpuset or taskset narrows it);
    the ranks are started from that thread and inherit them."""
    try:
        return DeviceFigures("cpu", len(os.sched_getaffinity(os.getpid())), "CPU affinity")
    except OSError:
        return DeviceFigures("cpu", os.cpu_count(), "os.cpu_count")


# ----------------------------------------------------------------------------- memory


def available_memory(
    meminfo: Path = Path("/proc/meminfo"), cgroups: Path = Path("/sys/fs/cgroup")
) -> tuple[int | None, str]:
    """Bytes available to new processes and what they were read from: the kernel's
    MemAvailable, or what the daemon's cgroup (v2) limit leaves when that is less."""
    available, source = None, "no MemAvailable in /proc/meminfo"
    with contextlib.suppress(OSError, ValueError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available, source = int(line.split()[1]) * 1024, "MemAvailable"
                break
    left = cgroup_left(cgroups)
    if left is not None and (available is None or left < available):
        return left, "the cgroup's memory.max less memory.current"
    return available, source


def cgroup_left(root: Path, self_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """memory.max less memory.current of this process's cgroup v2 (None: no limit, or none
    can be read)."""
    try:
        lines = self_cgroup.read_text().splitlines()
        path = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        group = root / path.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((group / "memory.current").read_text().strip()))
    except (OSError, ValueError, StopIteration, IndexError):
        return None


# ------------------------------------------------------------------------------ chaos


def injected_offset(path: str | None) -> tuple[float, str | None]:
    """The clock offset a test injects: the number of seconds in the file that
    PHALANX_CHAOS_CLOCK_OFFSET_FILE names (no variable, no file or an empty one: 0), read
    at every check so it can be taken back; the error when it holds something else."""
    if not path:
        return 0.0, None
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return 0.0, None
    except OSError as e:
        return 0.0, f"PHALANX_CHAOS_CLOCK_OFFSET_FILE {path} cannot be read ({e.strerror})"
    if not text:
        return 0.0, None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or abs(value) > 1e9:
        return 0.0, f"PHALANX_CHAOS_CLOCK_OFFSET_FILE {path} holds {text[:40]!r}, not seconds"
    return value, None
