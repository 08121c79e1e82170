"""Whole trainer runs: parallel layouts under torchrun, learning, determinism, bad input."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.harness import BIN, ROOT, Event, free_port, read_events, start
from tests.support.rank_groups import launch_group

pytestmark = pytest.mark.integration

EXAMPLES = ROOT / "examples"


def torchrun(
    config: Path, log_dir: Path, name: str, nproc: int, overrides: list[str]
) -> list[Event]:
    argv = [
        str(BIN / "torchrun"),
        f"--nproc-per-node={nproc}",
        f"--master-port={free_port()}",
        "-m",
        "trainer",
        "--config",
        str(config),
    ]
    for o in overrides:
        argv += ["--set", o]
    proc = start(argv, log_dir, name, {"OMP_NUM_THREADS": "1"})
    assert proc.wait(300) == 0, proc.tail()
    return proc.events()


def single(
    log_dir: Path, name: str, overrides: list[str], config: Path = EXAMPLES / "single.toml"
) -> list[Event]:
    group = launch_group(config, log_dir, overrides=overrides, name=name)
    assert group.wait(300) == [0], group.rank0.tail()
    return group.events()


def losses(events: list[Event]) -> list[float]:
    return [float(e["loss"]) for e in events if e["event"] == "train_step"]


def assert_close(got: list[float], want: list[float], steps: int = 10) -> None:
    assert len(got) >= steps and len(want) >= steps
    for step, (a, b) in enumerate(zip(got[:steps], want[:steps], strict=True), start=1):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: {a} vs single-process {b}"


def test_shipped_4_rank_examples_match_a_single_process(tmp_path: Path) -> None:
    """Acceptance: the fsdp+tp and pp x fsdp examples complete under torchrun, and
    their first 10 losses equal a single-process run's within 1e-4 (fp32)."""
    fsdp_tp = torchrun(EXAMPLES / "fsdp_tp.toml", tmp_path, "fsdp_tp", 4, [])
    pipeline = torchrun(EXAMPLES / "pipeline.toml", tmp_path, "pipeline", 4, [])
    for events in (fsdp_tp, pipeline):
        done = [e for e in events if e["event"] == "train_done"]
        assert len(done) == 1 and done[0]["step"] == 50
    base = ["train.steps=50"]
    assert_close(losses(fsdp_tp), losses(single(tmp_path, "single2", base)))
    assert_close(losses(pipeline), losses(single(tmp_path, "single4", [*base, "model.n_layers=4"])))


@pytest.mark.parametrize(
    "layout",
    [
        ["parallel.tp=2"],
        ["parallel.pp=2", "parallel.pp_schedule=GPipe", "parallel.pp_microbatches=4"],
        [
            "parallel.pp=2",
            "parallel.pp_schedule=Interleaved1F1B",
            "parallel.pp_microbatches=2",
            "model.n_layers=4",
        ],
        ["parallel.dp_shard=2", "parallel.activation_checkpointing=full", "train.grad_accum=2"],
    ],
    ids=["tp2", "pp2-gpipe", "pp2-interleaved", "fsdp2-ac-accum"],
)
def test_two_rank_layouts_match_a_single_process(tmp_path: Path, layout: list[str]) -> None:
    """Each layout starts from bitwise the same parameters as one process (the model is
    built on the meta device and each rank initialises only its shards), and its first
    10 losses agree within 1e-4."""
    common = [
        "train.steps=10",
        "train.log_init_digest=true",
        *(o for o in layout if o.startswith("model.")),
    ]
    group = launch_group(EXAMPLES / "single.toml", tmp_path, nproc=2, overrides=[*common, *layout])
    assert group.wait(300) == [0, 0], group.rank0.tail()
    alone = single(tmp_path, "single", common)
    assert init_digest(group.events()) == init_digest(alone)
    assert_close(losses(group.events()), losses(alone))


def init_digest(events: list[Event]) -> str:
    digest = next(e["init_sha256"] for e in events if e["event"] == "rank_started")
    assert isinstance(digest, str) and len(digest) == 64
    return digest


def test_loss_falls_to_the_corpus_entropy(tmp_path: Path) -> None:
    events = single(tmp_path, "learn", [])  # examples/single.toml as shipped
    entropy = next(e["entropy"] for e in events if e["event"] == "rank_started")
    curve = losses(events)
    assert curve[0] == pytest.approx(math.log(64), rel=0.05)
    final = float(np.mean(curve[-10:]))
    assert final <= 1.10 * entropy, f"final loss {final:.3f} vs entropy {entropy:.3f}"


def test_same_seed_same_digest(tmp_path: Path) -> None:
    digests = [
        next(
            e["params_sha256"]
            for e in single(tmp_path, f"run{i}", ["train.steps=20"])
            if e["event"] == "train_done"
        )
        for i in range(2)
    ]
    other = single(tmp_path, "seed1", ["train.steps=20", "train.seed=1"])
    assert digests[0] == digests[1]
    assert next(e["params_sha256"] for e in other if e["event"] == "train_done") != digests[0]


BAD_INPUTS: list[tuple[str, list[str], dict[str, str], str]] = [
    # (name, --set overrides, extra env, text the message must contain)
    ("unknown key", ["train.stepz=3"], {}, "train.stepz"),
    ("unknown section", ["trainx.steps=3"], {}, "[trainx]"),
    ("wrong type", ["train.steps=ten"], {}, "train.steps"),
    ("out of range", ["train.lr=-1"], {}, "train.lr"),
    ("bad choice", ['parallel.pp_schedule="Zigzag"'], {}, "parallel.pp_schedule"),
    ("bad boolean", ["checkpoint.async=maybe"], {}, "checkpoint.async"),
    ("layout vs world size", [], {"WORLD_SIZE": "2"}, "parallel.dp_shard*cp*tp*pp"),
    (
        "batch vs microbatches",
        ["parallel.pp=2", "parallel.pp_microbatches=3", "train.batch_size=8"],
        {"WORLD_SIZE": "2"},
        "train.batch_size",
    ),
    (
        "missing data file",
        ["data.source=tokens", "data.path=/nonexistent/tokens.bin"],
        {},
        "data.path",
    ),
    ("heads vs width", ["model.n_heads=5"], {}, "model.n_heads"),
    ("heads vs tp", ["parallel.tp=3"], {"WORLD_SIZE": "3"}, "parallel.tp"),
    (
        "text needs byte vocab",
        ["data.source=text", f"data.path={__file__}"],
        {},
        "model.vocab_size",
    ),
    ("malformed --set", ["train"], {}, "--set"),
    ("bad env", [], {"RANK": "5", "WORLD_SIZE": "2"}, "RANK"),
]


@pytest.mark.parametrize(
    ("name", "overrides", "env", "field"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_exits_2_naming_the_field(
    name: str, overrides: list[str], env: dict[str, str], field: str
) -> None:
    argv = [sys.executable, "-m", "trainer", "--config", str(EXAMPLES / "single.toml")]
    for o in overrides:
        argv += ["--set", o]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert field in lines[0], lines[0]


def test_bad_job_files_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\nsteps = 3\n")
    for path, text in [(broken, "not valid"), (tmp_path / "absent.toml", "does not exist")]:
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and text in proc.stderr and "Traceback" not in proc.stderr


def test_token_ids_beyond_the_vocab_exit_2(tmp_path: Path) -> None:
    """A problem only visible once the data is opened (after torch starts) still exits 2."""
    tokens = tmp_path / "tokens.bin"
    np.full(1000, 500, dtype=np.uint16).tofile(tokens)
    group = launch_group(
        EXAMPLES / "single.toml", tmp_path, overrides=["data.source=tokens", f"data.path={tokens}"]
    )
    assert group.wait(120) == [2]
    failures = read_events(group.rank0.stderr)
    assert any(e["event"] == "bad_input" and "model.vocab_size" in e["error"] for e in failures)
