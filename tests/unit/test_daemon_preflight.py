"""daemon.config.preflight: the machine checks of `phalanx run`, in-process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.config import DaemonConfig, load_daemon_config
from daemon.config import preflight as pf
from trainer.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "daemon_job.toml"


def config(run_dir: Path, *overrides: str) -> DaemonConfig:
    base = [f'node.run_dir="{run_dir}"', "node.http_port=0", "node.lighthouse_port=0"]
    return load_daemon_config(JOB, [*base, *overrides])


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something on this machine listens on."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s.getsockname()[1]


def test_a_good_config_passes_and_locks_its_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "a" / "b"
    lock = pf.preflight(config(run_dir))
    try:
        assert lock.held and lock.path == run_dir / pf.LOCK_FILE
        assert lock.path.read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()
    assert not lock.held
    pf.preflight(config(run_dir)).release()  # released: a restart takes it again


def test_a_held_run_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = pf.RunLock.acquire(tmp_path)
    try:
        message = (
            rf"node.run_dir {tmp_path} is in use by another phalanx daemon \(pid {os.getpid()}\)"
        )
        with pytest.raises(ConfigError, match=message):
            pf.check_run_dir_free(tmp_path)
        with pytest.raises(ConfigError, match=message):
            pf.RunLock.acquire(tmp_path)
        with pytest.raises(ConfigError, match=message):  # before the ports it shares
            pf.preflight(config(tmp_path, "node.http_port=1"))
    finally:
        first.release()
    pf.check_run_dir_free(tmp_path)


def test_run_dir_in_the_way_or_unwritable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"node.run_dir .*/file is a file, not a directory"):
        pf.check_run_dir_writable(blocker)
    with pytest.raises(ConfigError, match=rf"cannot be created: {blocker} is a file"):
        pf.check_run_dir_writable(blocker / "run" / "deeper")
    pf.check_run_dir_writable(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()  # checked, not created
    sysfs = r"node\.run_dir /sys/.* is on the sysfs pseudo file system \(/sys\)"
    with pytest.raises(ConfigError, match=sysfs):
        pf.preflight(config(Path("/sys/phalanx-preflight-test/run")))  # root may not either


def test_run_dir_under_a_read_only_directory(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    check = (
        "import sys; from pathlib import Path; from daemon.config import preflight as pf\n"
        "try:\n"
        "    pf.check_run_dir_writable(Path(sys.argv[1]))\n"
        "except Exception as e:\n"
        "    print(e)\n"
    )
    # Root writes into read-only directories; without DAC override it meets modes as users do.
    drop = ["setpriv", "--bounding-set=-dac_override", "--inh-caps=-dac_override", "--"]
    argv = [*(drop if os.geteuid() == 0 else []), sys.executable, "-c", check, str(ro / "run")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert f"cannot be created in {ro} (permission denied)" in out
    assert list(ro.iterdir()) == []


def test_ports_in_use_are_refused(tmp_path: Path, listening: int) -> None:
    with pytest.raises(ConfigError, match=rf"node.http_port {listening} is already in use"):
        pf.preflight(config(tmp_path / "run", f"node.http_port={listening}"))
    with pytest.raises(ConfigError, match=rf"node.lighthouse_proxy_port {listening} is already"):
        pf.preflight(config(tmp_path / "run", f"node.lighthouse_proxy_port={listening}"))
    assert not (tmp_path / "run").exists()
    pf.check_port_free("http_port", "127.0.0.1", 0)


def test_unreadable_etcd_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_bytes(b"\xff")
    cfg = config(tmp_path / "run", "etcd.user=u", f'etcd.password_file="{pw}"')
    with pytest.raises(ConfigError, match=rf"etcd.password_file {pw} is not UTF-8"):
        pf.preflight(cfg)
    if os.geteuid() != 0:
        pw.write_text("secret")
        pw.chmod(0)
        with pytest.raises(ConfigError, match=rf"etcd.password_file {pw} cannot be read"):
            pf.preflight(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["node.device=cuda"], "node.device"),
        (['parallel.device="cuda"'], "parallel.device"),
    ],
)
def test_cuda_without_a_gpu_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], field: str
) -> None:
    cfg = config(tmp_path / "run", *overrides)
    monkeypatch.setattr(pf, "cuda_present", lambda: False)
    with pytest.raises(ConfigError, match=rf'^{field} is "cuda" but this machine has no GPU'):
        pf.preflight(cfg)
    pf.check_device(config(tmp_path, *overrides, "node.device=cpu"))
    monkeypatch.setattr(pf, "cuda_present", lambda: True)
    pf.check_device(cfg)


def test_the_cuda_probe_looks_for_driver_files(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def exists(path: str) -> bool:
        seen.append(path)
        return path == "/dev/nvidia0"

    monkeypatch.setattr(os.path, "exists", exists)
    assert pf.cuda_present()
    assert "/proc/driver/nvidia/version" in seen
    monkeypatch.setattr(os.path, "exists", lambda _: False)
    assert not pf.cuda_present()


@pytest.mark.parametrize(
    ("environ", "node_env", "phrase"),
    [
        ({"PHALANX_CHAOS": "nowhere@1"}, {}, r"PHALANX_CHAOS entry 'nowhere@1' .*daemon's env"),
        ({}, {"PHALANX_CHAOS": "forward@x"}, r"PHALANX_CHAOS entry 'forward@x' .*node\.env"),
        ({"PHALANX_CHAOS_DELAY": "soon"}, {}, r"PHALANX_CHAOS_DELAY 'soon' must be a number"),
        ({"PHALANX_CHAOS": "forward@1"}, {"PHALANX_CHAOS": "bad"}, r"'bad' .*node\.env"),
    ],
)
def test_malformed_chaos_variables(
    environ: dict[str, str], node_env: dict[str, str], phrase: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{phrase}.*; fix or unset it\.$"):
        pf.check_chaos(environ, node_env)


def test_wellformed_chaos_variables_pass() -> None:
    pf.check_chaos({"PHALANX_CHAOS": "start@0:crash", "PHALANX_CHAOS_DELAY": "0.05"}, {})
    pf.check_chaos({"PHALANX_CHAOS": "bad"}, {"PHALANX_CHAOS": ""})  # node.env overrides it
    pf.check_chaos({}, {})


@pytest.mark.parametrize(
    ("field", "path", "kind"),
    [
        ("checkpoint.dir", "/proc/phalanx-ckpt", "proc"),
        ("checkpoint.dir", "/sys/phalanx-ckpt/run", "sysfs"),
        ("node.run_dir", "/proc/self/phalanx", "proc"),
        ("node.run_dir", "/sys/kernel/phalanx", "sysfs"),
    ],
)
def test_a_directory_on_a_pseudo_file_system_is_refused(
    tmp_path: Path, field: str, path: str, kind: str
) -> None:
    """Root passes the access checks there; the mount's type is what refuses it."""
    run_dir = Path(path) if field == "node.run_dir" else tmp_path / "run"
    extra = [f'checkpoint.dir="{path}"'] if field == "checkpoint.dir" else []
    message = rf"{field} {path} is on the {kind} pseudo file system .*, where nothing is stored"
    with pytest.raises(ConfigError, match=message):
        pf.preflight(config(run_dir, *extra))
    assert not (tmp_path / "run").exists()  # refused before anything was made


def test_a_create_that_fails_for_good_is_refused_one_that_may_heal_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write probe's error decides: EPERM (an immutable directory, a policy) is bad
    input; ENOSPC or EROFS (a full or remounted volume) is waited out by the node."""
    target = tmp_path / "ckpt"
    real_mkdir = os.mkdir

    def failing(code: int) -> object:
        def mkdir(path: object, *args: object, **kwargs: object) -> None:
            if str(path).startswith(str(tmp_path / ".phalanx-preflight-")):
                raise OSError(code, os.strerror(code))
            real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

        return mkdir

    monkeypatch.setattr(os, "mkdir", failing(1))  # EPERM
    with pytest.raises(ConfigError, match=r"checkpoint.dir .*/ckpt cannot be created \("):
        pf.check_writable_dir("checkpoint.dir", target, read_only_mount_ok=True)
    for code in (28, 30, 122):  # ENOSPC, EROFS, EDQUOT
        monkeypatch.setattr(os, "mkdir", failing(code))
        pf.check_writable_dir("checkpoint.dir", target, read_only_mount_ok=True)
    monkeypatch.undo()
    pf.check_writable_dir("checkpoint.dir", target)
    assert list(tmp_path.iterdir()) == []  # the probe left nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="chattr +i needs root (CI runs as root)")
def test_an_immutable_directory_is_refused_even_to_root(tmp_path: Path) -> None:
    """A create that fails for good whoever asks (the kernel's access check knows the flag)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable flag")
    try:
        message = rf"checkpoint.dir {locked}/ckpt cannot be created in {locked} \(permission"
        with pytest.raises(ConfigError, match=message):
            pf.preflight(config(tmp_path / "run", f'checkpoint.dir="{locked}/ckpt"'))
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
