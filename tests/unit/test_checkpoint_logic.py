"""Checkpoint directory rules: completeness, validation, retention, safe metadata loading."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from tests.support.checkpointers import linear_checkpointer
from trainer.checkpoint.files import (
    MARKER,
    Candidate,
    candidates,
    describe_files,
    problem,
    resume_source,
    retain,
    run_identity,
    run_root,
    write_json_atomic,
)
from trainer.checkpoint.safe_load import SafeReader, _AllowListUnpickler


def make(root: Path, step: int, complete: bool, model_hash: str = "h") -> Path:
    path = root / f"step-{step}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * step)
    if complete:
        marker = {"step": step, "model_hash": model_hash, "files": describe_files(path)}
        write_json_atomic(path / MARKER, marker)
    return path


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_candidates_are_newest_first_and_ignore_other_entries(tmp_path: Path) -> None:
    for step in (5, 40, 10):
        make(tmp_path, step, complete=True)
    (tmp_path / "step-x").mkdir()
    (tmp_path / "notes.txt").write_text("")
    assert [c.step for c in candidates(tmp_path)] == [40, 10, 5]


def test_problem_names_what_is_wrong(tmp_path: Path) -> None:
    ok = candidates_of(make(tmp_path, 10, complete=True))
    assert problem(ok, "h") is None
    assert "different model" in str(problem(ok, "other"))
    partial = candidates_of(make(tmp_path, 20, complete=False))
    assert "no completion marker" in str(problem(partial, "h"))
    truncated = make(tmp_path, 30, complete=True)
    (truncated / "__0_0.distcp").write_bytes(b"x" * 7)
    assert "has 7 bytes, the marker says 30" in str(problem(candidates_of(truncated), "h"))
    (truncated / "__0_0.distcp").unlink()
    assert "missing" in str(problem(candidates_of(truncated), "h"))
    flipped = make(tmp_path, 40, complete=True)
    flip_a_byte(flipped / "__0_0.distcp")  # same size, other content
    assert "does not match its sha256" in str(problem(candidates_of(flipped), "h"))
    sizes_only = make(tmp_path, 50, complete=False)  # a marker of before checksums
    write_json_atomic(
        sizes_only / MARKER, {"step": 50, "model_hash": "h", "files": {"__0_0.distcp": 50}}
    )
    assert "no sha256" in str(problem(candidates_of(sizes_only), "h"))


def candidates_of(path: Path) -> Candidate:
    return Candidate(int(path.name.split("-")[1]), path)


def test_retention_keeps_exactly_keep_valid_and_no_stale_partials(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        make(tmp_path, step, complete=True)
    make(tmp_path, 25, complete=False)  # a save that died, older than the newest valid
    make(tmp_path, 50, complete=False)  # newer than the newest valid: may still be in flight
    result = retain(tmp_path, keep=2, model_hash="h")
    assert sorted(p.name for p in result.removed) == ["step-10", "step-20", "step-25"]
    assert list(result.suspicious) == [tmp_path / "step-50"]
    left = {c.step: c.marked for c in candidates(tmp_path)}
    assert left == {50: False, 40: True, 30: True}


def test_retention_counts_only_valid_checkpoints(tmp_path: Path) -> None:
    """A marked but corrupt checkpoint is not counted: with keep = 1 the valid one just
    written survives a corrupt newer one, which is reported and left alone; a corrupt older
    one goes; another model's checkpoints are neither counted nor deleted."""
    make(tmp_path, 10, complete=True)
    flip_a_byte(make(tmp_path, 20, complete=True) / "__0_0.distcp")  # older, corrupt
    make(tmp_path, 30, complete=True)  # the newest valid
    corrupt = make(tmp_path, 40, complete=True)
    (corrupt / "__0_0.distcp").write_bytes(b"x")  # newer, truncated
    make(tmp_path, 99, complete=True, model_hash="another run")
    trusted: set[Path] = set()
    result = retain(tmp_path, keep=1, model_hash="h", trusted=trusted)
    assert sorted(p.name for p in result.removed) == ["step-10", "step-20"]
    assert set(result.suspicious) == {corrupt} and "says 40" in result.suspicious[corrupt]
    assert sorted(c.step for c in candidates(tmp_path)) == [30, 40, 99]
    assert trusted == {tmp_path / "step-30"}  # validated once, not read again next time
    with_keep_2 = retain(tmp_path, keep=2, model_hash="h", trusted=trusted)
    assert with_keep_2.removed == [] and (tmp_path / "step-30").exists()


def test_retention_without_a_valid_checkpoint_deletes_nothing(tmp_path: Path) -> None:
    make(tmp_path, 10, complete=False)
    flip_a_byte(make(tmp_path, 20, complete=True) / "__0_0.distcp")
    result = retain(tmp_path, keep=1, model_hash="h")
    assert result.removed == [] and len(result.suspicious) == 2
    assert (tmp_path / "step-10").exists() and (tmp_path / "step-20").exists()


def test_marker_write_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / MARKER
    write_json_atomic(target, {"step": 1})
    assert json.loads(target.read_text()) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == [MARKER]  # no temp file left


def test_real_dcp_metadata_loads_with_the_allow_list(tmp_path: Path) -> None:
    state = {"model": {"w": torch.randn(4, 3)}, "optimizer": {"w": {"step": torch.tensor(3.0)}}}
    dcp_save(state, storage_writer=FileSystemWriter(str(tmp_path)), no_dist=True)
    metadata = SafeReader(str(tmp_path)).read_metadata()
    assert "model.w" in metadata.state_dict_metadata


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_allow_list_refuses_callables_and_foreign_classes() -> None:
    for payload in (_Evil(), {"f": FileSystemWriter}, [torch.nn.Linear]):
        with pytest.raises(pickle.UnpicklingError, match="not allowed"):
            _AllowListUnpickler(io.BytesIO(pickle.dumps(payload))).load()


def test_the_run_identity_covers_model_data_seed_and_batch_only() -> None:
    from trainer.config import TrainerConfig

    base = TrainerConfig().model_dump(mode="json")

    def changed(section: str, key: str, value: object) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(json.dumps(base))
        out[section][key] = value
        return out

    same = run_identity(base)
    assert same.startswith("run-") and len(same) == 16
    for section, key, value in [
        ("model", "dim", 32),
        ("data", "source", "text"),
        ("train", "seed", 7),
        ("train", "batch_size", 4),  # the global batch when global_batch_size is 0
        ("train", "global_batch_size", 32),
        ("train", "seq_len", 16),
    ]:
        assert run_identity(changed(section, key, value)) != same, (section, key)
    for section, key, value in [
        ("parallel", "dp_shard", 2),  # a load reshards
        ("train", "lr", 0.5),
        ("train", "steps", 7),
        ("checkpoint", "keep", 9),
    ]:
        assert run_identity(changed(section, key, value)) == same, (section, key)
    fixed = changed("train", "global_batch_size", 32)
    micro = json.loads(json.dumps(fixed))
    micro["train"]["batch_size"] = 4  # only the micro-batch: the same items per step
    assert run_identity(micro) == run_identity(fixed)
    assert run_root(Path("/c"), None, base) == Path("/c/local") / same
    assert run_root(Path("/c"), "j", base) == Path("/c/j") / same


def test_resume_from_names_a_run_or_one_of_its_steps() -> None:
    assert resume_source(Path("/c/j/run-x/step-40")) == (Path("/c/j/run-x"), 40)
    assert resume_source(Path("/c/j/run-x")) == (Path("/c/j/run-x"), None)
    assert resume_source(Path("/c/j/run-x/step-x")) == (Path("/c/j/run-x/step-x"), None)


def test_a_save_never_replaces_a_complete_checkpoint_of_its_step(tmp_path: Path) -> None:
    """A group back from a fence after the others finished must not overwrite the job's
    checkpoint of the same step with its own state (issue 34)."""
    first, _ = linear_checkpointer(tmp_path)
    first.save(7)
    first.close()
    written = {p.name: p.read_bytes() for p in (tmp_path / "step-7").iterdir()}
    assert MARKER in written
    again, model = linear_checkpointer(tmp_path)  # another state, the same step
    assert not torch.equal(model.weight, first.state.params["weight"])
    with structlog.testing.capture_logs() as events:
        again.save(7, final=True)
        again.close()
    assert [e["event"] for e in events if e["event"].startswith("checkpoint_")] == [
        "checkpoint_exists"
    ]
    assert {p.name: p.read_bytes() for p in (tmp_path / "step-7").iterdir()} == written
