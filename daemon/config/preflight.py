"""What `phalanx run` checks on this machine before it starts anything.

``daemon.config`` validates what the job file says; this module checks that this
machine can run it: the run directory is writable and no other daemon holds it,
the checkpoint directory can be written and the checkpoint to resume from is there,
the data file makes at least one window of valid tokens, the addresses to listen on
are this machine's, the HTTP and
lighthouse-proxy ports are free, the etcd credential files are
readable, CUDA is present when the ranks are told to use it, and the chaos
variables the ranks inherit are well-formed. Each problem is a ConfigError whose
message is one sentence naming the field or file and the fix (exit code 2). The
checks leave nothing behind (a directory's write probe removes what it made): only
when all pass is the run directory created and its lock taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from daemon.config.etcd_settings import read_password
from daemon.config.mounts import pseudo_fs
from daemon.config.sections import DaemonConfig
from trainer import chaos
from trainer.config import ConfigError
from trainer.config.checks import check_data_contents

LOCK_FILE = "daemon.lock"
# The address the lighthouse proxy (daemon.leadership.lighthouse.Forwarder) listens on.
PROXY_HOST = "127.0.0.1"
# Present when a GPU driver the ranks' torch can use is loaded: NVIDIA (procfs entry,
# first device node) or AMD ROCm, whose torch builds also answer to "cuda".
CUDA_MARKERS: tuple[str, ...] = ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/kfd")


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/daemon.lock`` holding the owner's pid.

    Held until :meth:`release` or until the process dies (the kernel drops it);
    the descriptor is not inherited by child processes.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Create run_dir if needed and lock it; ConfigError when it cannot be or is held."""
        path = run_dir / LOCK_FILE
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(
                f"node.run_dir {run_dir} cannot be created or written ({e.strerror}); "
                "point node.run_dir at a writable directory."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _pid_in(fd)
            os.close(fd)
            raise ConfigError(_held(run_dir, holder)) from None
        except OSError as e:
            os.close(fd)
            raise ConfigError(
                f"node.run_dir {run_dir} cannot be locked ({e.strerror}); "
                "put node.run_dir on a local file system."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _pid_in(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
    return "unknown"


def _held(run_dir: Path, pid: str) -> str:
    return (
        f"node.run_dir {run_dir} is in use by another phalanx daemon (pid {pid}); "
        "stop that daemon or give this node its own node.run_dir."
    )


def check_run_dir_free(run_dir: Path) -> None:
    """Refuse a run_dir whose lock another process holds, without creating anything."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return  # no lock file (or no run_dir): nobody holds it; writability is checked apart
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(_held(run_dir, _pid_in(fd))) from None
    except OSError:
        pass  # cannot be locked at all: RunLock.acquire says so
    finally:
        os.close(fd)  # also drops the probe's lock at once


def check_writable_dir(field: str, directory: Path, read_only_mount_ok: bool = False) -> None:
    """``directory``, or the nearest directory above it that exists, must be a writable
    directory (it is created later, by whoever writes there); nothing is created here.
    `read_only_mount_ok`: a volume mounted read-only is a state of the volume, not bad
    input (it may be remounted; the checkpoint saves say so meanwhile)."""
    for path in (directory, *directory.parents):
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there yet (a file above it is found further up)
        except OSError as e:
            raise ConfigError(
                f"{field} {directory} cannot be reached ({e.strerror} at {path}); "
                f"point {field} at a writable directory."
            ) from None
        if not stat.S_ISDIR(mode):
            what = "is" if path == directory else f"cannot be created: {path} is"
            raise ConfigError(
                f"{field} {directory} {what} a file, not a directory; "
                f"point {field} at a directory or remove the file."
            )
        kind = pseudo_fs(path)
        if kind is not None:
            raise ConfigError(
                f"{field} {directory} is on the {kind} pseudo file system ({path}), where "
                f"nothing is stored; point {field} at a directory on a disk or a volume."
            )
        if read_only_mount_ok and os.statvfs(path).f_flag & os.ST_RDONLY:
            return
        if not os.access(path, os.W_OK | os.X_OK):
            what = "is not writable" if path == directory else f"cannot be created in {path}"
            raise ConfigError(
                f"{field} {directory} {what} (permission denied); "
                f"point {field} at a directory this user can write."
            )
        _probe_create(field, directory, path)
        return


# A create that fails with these may work later by itself (a full or remounted volume,
# a file server away): the node starts and waits, reporting it, instead of refusing.
MAY_HEAL = frozenset(
    {
        errno.EROFS,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EIO,
        errno.ESTALE,
        errno.ETIMEDOUT,
        errno.EAGAIN,
        errno.EBUSY,
        errno.EINTR,
        errno.ENOMEM,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
    }
)


def _probe_create(field: str, directory: Path, parent: Path) -> None:
    """Create and remove an empty directory in `parent` (the nearest existing directory
    of `directory`): as root the access check says yes to almost anything, so only a
    create tells. A failure that will not go away by itself is bad input; one that may
    (MAY_HEAL) is left to the node's health check, which waits and reports it."""
    probe = parent / f".phalanx-preflight-{os.getpid()}"
    try:
        os.mkdir(probe)
    except FileExistsError:
        return  # a leftover of a daemon with this pid: the directory is writable
    except OSError as e:
        if e.errno in MAY_HEAL:
            return
        raise ConfigError(
            f"{field} {directory} cannot be created ({e.strerror} creating a directory in "
            f"{parent}); point {field} at a directory this user can write."
        ) from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)


def check_run_dir_writable(run_dir: Path) -> None:
    """run_dir, or the nearest directory above it that exists, must be a writable directory."""
    check_writable_dir("node.run_dir", run_dir)


def check_checkpoints(cfg: DaemonConfig) -> None:
    """checkpoint.dir can be written (the writer group's rank 0 creates it) and
    checkpoint.resume_from, when set, is a directory (a run or one of its steps)."""
    ckpt = cfg.checkpoint
    if ckpt.dir:
        check_writable_dir("checkpoint.dir", Path(ckpt.dir), read_only_mount_ok=True)
    if ckpt.resume_from and not Path(ckpt.resume_from).is_dir():
        what = "is not a directory" if Path(ckpt.resume_from).exists() else "does not exist"
        raise ConfigError(
            f"checkpoint.resume_from {ckpt.resume_from} {what}; point it at a run directory "
            "(<dir>/<job>/run-<id>) or one of its step-<N> directories, or unset it."
        )


def check_data(cfg: DaemonConfig) -> None:
    """The built-in workload's data file, as its ranks will read it (one window at least,
    token ids below model.vocab_size)."""
    if cfg.workload.spec is None:
        check_data_contents(cfg.data, cfg.model.vocab_size, cfg.train.seq_len)


def check_bind_hosts(cfg: DaemonConfig) -> None:
    """Every address a listener binds must belong to this machine."""
    for field, host in (
        ("bind_host", cfg.bind_host),
        ("http_host", cfg.http_host),
        ("lighthouse_bind", cfg.lighthouse_host),
    ):
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            try:
                s.bind((host, 0))
            except OSError as e:
                if getattr(cfg.node, field) is not None:
                    what = f"node.{field} {host}"
                else:
                    what = f"node.advertise_host {cfg.advertise_host!r} resolves to {host}, which"
                raise ConfigError(
                    f"{what} cannot be bound here ({e.strerror}); set node.bind_host to an "
                    'address of this machine ("0.0.0.0" for every interface).'
                ) from None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_port_free(field: str, host: str, port: int) -> None:
    """Bind ``host:port`` as the daemon's server will (SO_REUSEADDR), then let it go."""
    if port == 0:
        return
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"node.{field} {port} is already in use on {host}; "
                    "stop what holds it or pick another port (0 = any free port)."
                ) from None
            raise ConfigError(
                f"node.{field} {port} cannot be bound on {host} ({e.strerror}); "
                "pick another port (0 = any free port)."
            ) from None


def check_etcd_files(cfg: DaemonConfig) -> None:
    """The TLS files must be readable and the password file usable (config.py: they exist)."""
    for field in ("ca_file", "cert_file", "key_file"):
        path = getattr(cfg.etcd, field)
        if not path:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ConfigError(
                f"etcd.{field} {path} cannot be read ({e.strerror}); "
                "make it readable by the daemon's user."
            ) from None
    read_password(cfg)


def cuda_present() -> bool:
    """Whether a GPU driver is loaded, found without torch (the daemon never imports it)."""
    return any(os.path.exists(marker) for marker in CUDA_MARKERS)


def node_device(cfg: DaemonConfig) -> str:
    """The device type this node's ranks will train on: cpu or cuda."""
    chosen = cfg.node.device if cfg.node.device != "auto" else cfg.parallel.device
    if chosen != "auto":
        return chosen
    return "cuda" if cuda_present() else "cpu"


def check_device(cfg: DaemonConfig) -> None:
    """A node told to train on CUDA must have a GPU driver."""
    if cfg.node.device == "cuda":
        field = "node.device"
    elif cfg.node.device == "auto" and cfg.parallel.device == "cuda":
        field = "parallel.device"
    else:
        return
    if not cuda_present():
        raise ConfigError(
            f'{field} is "cuda" but this machine has no GPU driver (none of '
            f'{", ".join(CUDA_MARKERS)} exists); set {field} = "cpu" or "auto".'
        )


def check_fp8(cfg: DaemonConfig) -> None:
    """FP8 training needs CUDA: a node that trains on the CPU is refused before anything
    starts (the ranks check the GPU's compute capability, trainer/parallel/fp8.py)."""
    device = node_device(cfg)
    if cfg.parallel.fp8 and device != "cuda":
        raise ConfigError(
            f"parallel.fp8 = true needs a GPU with FP8 support (compute capability 8.9 or "
            f"newer), but this node trains on the {device}; set parallel.fp8 = false."
        )


def check_cuda_settings(cfg: DaemonConfig) -> None:
    """Settings that run only on CUDA, refused on a node that trains on the CPU:
    torch's context parallel (ring attention over fused kernels) and NCCL across groups."""
    device = node_device(cfg)
    if device == "cuda":
        return
    if cfg.parallel.cp > 1 and cfg.parallel.cp_attention == "torch":
        raise ConfigError(
            f"parallel.cp_attention = 'torch' runs only on CUDA, but this node trains on the "
            f"{device}; set parallel.cp_attention = 'all_gather' (or 'auto')."
        )
    if cfg.ft.backend == "nccl":
        raise ConfigError(
            f"ft.backend = 'nccl' needs CUDA, but this node trains on the {device}; set "
            "ft.backend = 'auto' or 'gloo'."
        )


def check_chaos(environ: Mapping[str, str], node_env: Mapping[str, str]) -> None:
    """PHALANX_CHAOS, _DELAY, _SLEEP and _RANKS as the ranks will inherit them (node.env
    wins)."""
    checks: tuple[tuple[str, Callable[[str], object]], ...] = (
        (chaos.CHAOS, chaos.parse),
        (chaos.CHAOS_DELAY, chaos.parse_delay),
        (chaos.CHAOS_SLEEP, lambda text: chaos.parse_delay(text, chaos.CHAOS_SLEEP)),
        (chaos.CHAOS_RANKS, chaos.parse_ranks),
    )
    for name, parse in checks:
        where = "node.env" if name in node_env else "the daemon's environment"
        value = node_env.get(name, environ.get(name))
        if value is None:
            continue
        try:
            parse(value)
        except ValueError as e:
            raise ConfigError(f"{str(e).rstrip('.')} (set in {where}); fix or unset it.") from None


def preflight(cfg: DaemonConfig) -> RunLock:
    """Check that this machine can run ``cfg``, then lock its run_dir; ConfigError otherwise.

    The caller keeps the returned lock for the daemon's life.
    """
    run_dir = cfg.run_dir
    check_run_dir_free(run_dir)  # first: a second daemon would also find its ports taken
    check_run_dir_writable(run_dir)
    check_checkpoints(cfg)
    check_data(cfg)
    check_etcd_files(cfg)
    check_bind_hosts(cfg)
    check_port_free("http_port", cfg.http_host, cfg.node.http_port)
    check_port_free("lighthouse_proxy_port", PROXY_HOST, cfg.node.lighthouse_proxy_port)
    check_device(cfg)
    check_fp8(cfg)
    check_cuda_settings(cfg)
    check_chaos(os.environ, cfg.node.env)
    return RunLock.acquire(run_dir)
