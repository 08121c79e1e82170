"""The systemd packaging in ops/systemd: the unit verifies, keeps its contract with the
daemon (notify, watchdog, drain, exit codes) and agrees with the example job file."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from daemon.config import load_daemon_config
from trainer.config import load_trainer_config, parse_override

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops" / "systemd"
UNIT = OPS / "phalanx.service"
JOB = OPS / "job.toml"
ENV = OPS / "phalanx.env"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

# Overall exposure from `systemd-analyze security`, times 10 (its --threshold scale).
# The unit scores 3.6; without CapabilityBoundingSet= alone it scores 5.6.
MAX_EXPOSURE = 45

Unit = dict[str, dict[str, list[str]]]

_SPAN_UNITS = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
}


def parse_unit(text: str) -> Unit:
    """A unit file as {section: {key: [values in order]}} (repeated keys accumulate)."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a Key=value line: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= set {len(values)} times, expected once"
    return values[0]


def timespan_s(text: str) -> float:
    """A systemd time span (``60``, ``45s``, ``5min``, ``1min 30s``) in seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == text.replace(" ", ""), text
    return sum(float(n) * _SPAN_UNITS[u] for n, u in parts)


def is_under(path: str, parent: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(parent))


def console_script() -> str:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"phalanx": "daemon.cli:main"}
    return "phalanx"


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


@pytest.fixture(scope="module")
def job() -> dict[str, dict[str, object]]:
    return tomllib.loads(JOB.read_text())


# --------------------------------------------------------------------------- systemd-analyze


def verifiable_copy(tmp_path: Path, edit: Callable[[str], str] = lambda s: s) -> Path:
    """The unit with the two host-specific lines made to resolve on this machine.

    `systemd-analyze verify` fails when ExecStart='s binary is not an executable
    file, and /opt/phalanx/.venv/bin/phalanx exists only on an installed node:
    point it at this checkout's console script (or /bin/true where there is
    none). User=/Group= name the `phalanx` account, which only an installed node
    has; systemd 252 does not resolve them during verify, but other versions may,
    so they become the current uid and gid, numerically (no account lookup at
    all). Everything else is verified as shipped.
    """
    script = Path(sys.executable).with_name("phalanx")
    binary = str(script) if os.access(script, os.X_OK) else "/bin/true"
    text = UNIT.read_text()
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={binary}", text, count=1, flags=re.M)
    text = re.sub(r"^User=.*$", f"User={os.getuid()}", text, count=1, flags=re.M)
    text = re.sub(r"^Group=.*$", f"Group={os.getgid()}", text, count=1, flags=re.M)
    copy = tmp_path / UNIT.name
    copy.write_text(edit(text))
    return copy


def verify(path: Path) -> tuple[int, list[str]]:
    """Exit status of `systemd-analyze verify` and its complaints about ``path``."""
    assert SYSTEMD_ANALYZE is not None
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Lines about other units (the host's own, in a container) are not ours to judge.
    ours = [line for line in done.stderr.splitlines() if path.name in line]
    return done.returncode, ours


@pytest.fixture(scope="module")
def analyze_works(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip unless systemd-analyze can verify a trivially valid unit on this machine."""
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    probe = tmp_path_factory.mktemp("probe") / "phalanx-probe.service"
    probe.write_text("[Service]\nType=oneshot\nExecStart=/bin/true\n")
    code, _ = verify(probe)
    if code != 0:
        done = subprocess.run(
            [SYSTEMD_ANALYZE, "verify", str(probe)], capture_output=True, text=True, timeout=60
        )
        pytest.skip(f"systemd-analyze cannot verify units here: {done.stderr.strip()[:300]}")


@pytest.mark.integration
def test_unit_passes_systemd_analyze_verify(analyze_works: None, tmp_path: Path) -> None:
    code, complaints = verify(verifiable_copy(tmp_path))
    assert complaints == []
    assert code == 0


@pytest.mark.integration
@pytest.mark.parametrize(
    "mistake",
    [
        ("WatchdogSec=60s", "WatchdogSecs=60s"),  # unknown key: only a warning, rc 0
        ("KillMode=mixed", "KillMode=mixt"),  # bad value
        ("StateDirectory=phalanx", "StateDirectory=/var/lib/phalanx"),  # must be relative
    ],
)
def test_verify_catches_mistakes(
    analyze_works: None, tmp_path: Path, mistake: tuple[str, str]
) -> None:
    """The check above can fail: the same edits with one mistake are reported."""
    good, bad = mistake
    copy = verifiable_copy(tmp_path, lambda text: text.replace(good, bad, 1))
    assert bad in copy.read_text()
    _, complaints = verify(copy)
    assert complaints, f"systemd-analyze accepted {bad!r}"


@pytest.mark.integration
def test_unit_hardening_exposure(analyze_works: None, tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    copy = verifiable_copy(tmp_path, lambda t: re.sub(r"^User=.*$", "User=phalanx", t, flags=re.M))
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", f"--threshold={MAX_EXPOSURE}", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    summary = [line for line in done.stdout.splitlines() if "Overall exposure" in line]
    assert done.returncode == 0, f"exposure above {MAX_EXPOSURE / 10}: {summary}"


# --------------------------------------------------------------------------- unit contract


def test_unit_contract_with_the_daemon(unit: Unit, job: dict[str, dict[str, object]]) -> None:
    service = unit["Service"]
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"
    assert timespan_s(one(unit, "Service", "WatchdogSec")) > 0
    assert one(unit, "Service", "Restart") == "on-failure"
    assert "2" in one(unit, "Service", "RestartPreventExitStatus").split()
    assert one(unit, "Service", "KillMode") == "mixed"
    assert service.get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]
    assert one(unit, "Service", "EnvironmentFile") == "-/etc/phalanx/phalanx.env"
    # A rank killed by the OOM killer is the daemon's to restart, not a reason to stop.
    assert one(unit, "Service", "OOMPolicy") == "continue"

    # Stopping drains within node.drain_grace_s; systemd must wait longer than that.
    grace = job["node"]["drain_grace_s"]
    assert isinstance(grace, int | float)
    assert timespan_s(one(unit, "Service", "TimeoutStopSec")) > grace


def test_exec_start_runs_the_console_script(unit: Unit) -> None:
    argv = shlex.split(one(unit, "Service", "ExecStart"))
    assert PurePosixPath(argv[0]).name == console_script()
    assert PurePosixPath(argv[0]).is_absolute()
    assert argv[1:4] == ["run", "--config", "/etc/phalanx/job.toml"]
    assert argv[4:] == ["$PHALANX_ARGS"]  # unbraced: split into zero or more arguments


def test_runs_as_dedicated_user_with_state_directory(
    unit: Unit, job: dict[str, dict[str, object]]
) -> None:
    assert one(unit, "Service", "User") == "phalanx"
    state = "/var/lib/" + one(unit, "Service", "StateDirectory")
    run_dir = job["node"]["run_dir"]
    assert isinstance(run_dir, str)
    assert is_under(run_dir, state), f"node.run_dir {run_dir} is outside StateDirectory {state}"
    # ProtectSystem=strict makes everything else read-only: the checkpoint
    # directory must be listed as writable ("-": tolerated while not mounted).
    assert one(unit, "Service", "ProtectSystem") == "strict"
    checkpoint = job["checkpoint"]["dir"]
    assert isinstance(checkpoint, str)
    writable = [p.lstrip("-") for p in unit["Service"].get("ReadWritePaths", [])]
    assert any(is_under(checkpoint, p) for p in writable), (checkpoint, writable)
    mounts = " ".join(unit["Unit"].get("RequiresMountsFor", [])).split()
    assert any(is_under(checkpoint, p) for p in mounts)


def test_hardening_keeps_gpus_reachable(unit: Unit) -> None:
    service = unit["Service"]
    assert service.get("PrivateDevices", ["no"]) == ["no"]
    assert "MemoryDenyWriteExecute" not in service  # torch.compile / Triton JIT
    if "DeviceAllow" in service or service.get("DevicePolicy", ["auto"]) != ["auto"]:
        allowed = {entry.split()[0]: entry.split()[1] for entry in service["DeviceAllow"]}
        assert allowed.get("char-nvidia*") == "rw", allowed
    limit = one(unit, "Service", "LimitMEMLOCK")
    assert limit == "infinity"  # RDMA registers pinned memory


# --------------------------------------------------------------------------- job file, env


def test_example_job_file_validates(job: dict[str, dict[str, object]], tmp_path: Path) -> None:
    nproc = job["node"]["nproc"]
    assert isinstance(nproc, int)
    cfg = load_trainer_config(JOB, world_size=nproc)
    assert cfg.parallel.device == "cuda"

    # The daemon's loader also checks its own sections and that the etcd TLS
    # files exist; those exist only on an installed node, so local stand-ins.
    tls = []
    for key in ("ca_file", "cert_file", "key_file"):
        assert job["etcd"].get(key), f"etcd.{key} is not set in the TLS example"
        (tmp_path / key).write_text("")
        tls.append(f"etcd.{key}={tmp_path / key}")
    daemon = load_daemon_config(JOB, tls, node_id="gpu-node-1")
    assert daemon.job.max_replicas == 4 and daemon.job.min_replicas <= 4
    assert len(daemon.etcd.endpoints) == 3
    assert daemon.node.device == "cuda" and daemon.node.nproc == 8


def test_env_file_is_key_value_and_feeds_exec_start() -> None:
    values: dict[str, str] = {}
    for line in ENV.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"bad line {line!r}"
        values[key] = value
    # Every node gets its own id by default (the hostname): a shared hard-coded id
    # would have a second node refused as a duplicate.
    assert values["PHALANX_ARGS"].split() == []
    example = [line for line in ENV.read_text().splitlines() if line.startswith("#PHALANX_ARGS=")]
    assert len(example) == 1
    args = example[0].partition("=")[2].split()
    assert args[:2] == ["--node-id", "gpu-node-1"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert [parse_override(s)[0] for s in sets] == [["node", "advertise_host"]]
