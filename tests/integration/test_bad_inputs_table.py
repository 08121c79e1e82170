"""Issue 34's bad inputs, each against the real `phalanx run`: exit 2, one line naming the
field or file, no traceback, no process started or left running, nothing created on
disk (run_dir, checkpoint.dir) and, where a real etcd is named, no key under /phalanx/.

The checks that need the data or checkpoint files run in the daemon's preflight, so
these rows use a real etcd: before, the ranks found them after the node had registered.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import DAEMON_JOB
from tests.support.refusals import (
    Case,
    Setup,
    a_file,
    assert_refused_before_start,
    honouring_modes,
    override,
    path_setting,
    read_only_dir,
    sets,
)

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-in-url"


def job_file(name: str, extra: str) -> Callable[[Path], Path]:
    """A copy of the test job with `extra` appended."""

    def make(tmp: Path) -> Path:
        path = tmp / name
        path.write_text(DAEMON_JOB.read_text() + "\n" + extra)
        return path

    return make


def config(make: Callable[[Path], Path | str], names: str) -> Setup:
    """`--config make(tmp)` (the last --config wins); `names` may say {path}."""

    def setup(tmp: Path, _: contextlib.ExitStack) -> Case:
        path = make(tmp)
        return Case(names.format(path=path), ["--config", str(path)])

    return setup


def fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "job.toml")  # opened, it would block the daemon for ever
    return tmp / "job.toml"


def huge_name(tmp: Path) -> Path:
    path = tmp / "huge.toml"
    with path.open("w") as f:
        f.write(DAEMON_JOB.read_text().replace('name = "itest"', 'name = "'))
        f.write("j" * 50_000_000)
        f.write('"\n')
    return path


def missing_resume_from(tmp: Path, _: contextlib.ExitStack) -> Case:
    gone = tmp / "old-run" / "step-10"
    return Case(
        f"checkpoint.resume_from {gone} does not exist",
        sets(f'checkpoint.dir="{tmp / "ckpt"}"', f'checkpoint.resume_from="{gone}"'),
    )


def short_text(tmp: Path, _: contextlib.ExitStack) -> Case:
    text = tmp / "short.txt"
    text.write_text("too short")  # 9 bytes; train.seq_len 64 needs 66
    return Case(
        f"data.path {text} holds 9 tokens, fewer than train.seq_len + 2 (66)",
        sets('data.source="text"', f'data.path="{text}"', "model.vocab_size=256"),
    )


def token_above_vocab(tmp: Path, _: contextlib.ExitStack) -> Case:
    tokens = tmp / "tokens.bin"
    ids = [i % 64 for i in range(200)] + [1000]
    tokens.write_bytes(b"".join(i.to_bytes(2, "little") for i in ids))
    return Case(
        f"data.path {tokens} holds token id 1000, but model.vocab_size is 64",
        sets('data.source="tokens"', f'data.path="{tokens}"'),
    )


def immutable_dir(tmp: Path, stack: contextlib.ExitStack) -> Case:
    """checkpoint.dir inside a directory with the immutable flag: its create fails for
    root too, and for good (a permanent error, not a full volume that may heal)."""
    locked = tmp / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable flag")
    stack.callback(subprocess.run, ["chattr", "-i", str(locked)], check=True)
    path = locked / "ckpt"
    names = f"checkpoint.dir {path} cannot be created in {locked} (permission"
    return Case(names, sets(f'checkpoint.dir="{path}"'))


def node_id(value: str) -> Setup:
    return lambda _, __: Case("--node-id 'nnnnn", ["--node-id", value])


def case(name: str, setup: Setup, with_etcd: bool = False) -> Any:
    return pytest.param(setup, with_etcd, id=name)


DEEP_TOML = "[workload.options]\nx = " + "[" * 100_000 + "]" * 100_000 + "\n"

CASES = [
    case("lr-inf", override("train.lr should be a finite number", "train.lr=inf")),
    case("beta1-nan", override("train.beta1 should be a finite number", "train.beta1=nan")),
    case("ft-timeout-inf", override("ft.timeout_s should be a finite number", "ft.timeout_s=inf")),
    case("ft-timeout-1e20", override("ft.timeout_s should be less than", "ft.timeout_s=1e20")),
    case(
        "seed-2-64", override("train.seed should be less than", "train.seed=18446744073709551616")
    ),
    case(
        "join-timeout-1e20",
        override("lighthouse.join_timeout_ms", "lighthouse.join_timeout_ms=1e20"),
    ),
    case(
        "join-timeout-10-20",
        override(
            "lighthouse.join_timeout_ms should be less than",
            "lighthouse.join_timeout_ms=100000000000000000000",
        ),
    ),
    case(
        "checkpoint-dir-is-a-file",
        path_setting("checkpoint.dir", a_file, "checkpoint.dir {path} is a file, not a directory"),
        True,
    ),
    case(
        "checkpoint-dir-read-only",
        honouring_modes(
            path_setting("checkpoint.dir", read_only_dir, "checkpoint.dir {path} cannot be created")
        ),
        True,
    ),
    case("checkpoint-dir-in-an-immutable-dir", immutable_dir, True),
    case(
        "checkpoint-dir-on-proc",
        path_setting(
            "checkpoint.dir",
            lambda _: Path("/proc/phalanx-ckpt"),
            "checkpoint.dir /proc/phalanx-ckpt is on the proc pseudo file system",
        ),
        True,
    ),
    case("job-file-fifo", config(fifo, "job file {path} is not a regular file")),
    case("job-file-dev-zero", config(lambda _: "/dev/zero", "job file /dev/zero is not a regular")),
    case("job-name-50-mb", config(huge_name, "job file {path} is 50000")),
    case(
        "job-name-100k",
        override(
            "job.name string should have at most 63 characters", f'job.name="{"j" * 100_000}"'
        ),
    ),
    case("job-file-100k-deep", config(job_file("deep.toml", DEEP_TOML), "job file {path} nests")),
    case(
        "set-value-5k-deep",
        override(
            "the value of --set workload.options.x nests",
            "workload.options.x=" + "[" * 5000 + "]" * 5000,
        ),
    ),
    case(
        "endpoint-scheme",
        override("etcd.endpoints entry 'unix://", 'etcd.endpoints=["unix://127.0.0.1:2379"]'),
    ),
    case(
        "endpoint-credentials",
        override(
            "etcd.endpoints entry '127.0.0.1:2379' carries credentials",
            f'etcd.endpoints=["http://ops:{SECRET}@127.0.0.1:2379"]',
        ),
    ),
    case("node-id-10k", node_id("n" * 10_000)),
    case("resume-from-missing", missing_resume_from, True),
    case("text-shorter-than-seq-len", short_text, True),
    case("token-id-above-vocab", token_above_vocab, True),
]


@pytest.mark.parametrize(("setup", "with_etcd"), CASES)
def test_bad_input_is_refused_with_one_line_before_anything_starts(
    setup: Setup,
    with_etcd: bool,
    tmp_path: Path,
    stack: contextlib.ExitStack,
    request: pytest.FixtureRequest,
) -> None:
    endpoint = str(request.getfixturevalue("etcd_endpoint")) if with_etcd else None
    line = assert_refused_before_start(setup(tmp_path, stack), tmp_path, endpoint)
    assert len(line) < 400, line  # values are shortened, never echoed whole
    assert SECRET not in line
    assert not (tmp_path / "ckpt").exists()
