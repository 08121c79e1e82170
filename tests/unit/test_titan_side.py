"""Issue 53, build 2: torchtitan's trainer beside Phalanx's. What does not need torchtitan
to run: the shape it is given is the 937M model Phalanx's trainer builds, the rows and
ratios gpu_check writes from both runs, the stand-ins for modules a dense run never
calls, and the peak memory a rank reports."""

from __future__ import annotations

import sys

import pytest
import torch

from bench.gpu_check import BIG, CHECKS
from bench.gpu_titan import gpu_figures, titan_figures
from bench.titan_side import SHAPES, _Unused, stand_in_for_unused_modules
from trainer.config.sections import ModelConfig
from trainer.run import _device_peak_bytes

TITAN = {"torchtitan": "0.3.0", "tokens_per_s": 80_000.0, "peak_bytes": 40 * 2**30}


def test_the_937m_shape_is_the_model_phalanx_builds() -> None:
    shape = SHAPES["937m"]
    ours = ModelConfig(
        vocab_size=int(BIG["model.vocab_size"]),
        dim=int(BIG["model.dim"]),
        n_layers=int(BIG["model.n_layers"]),
        n_heads=int(BIG["model.n_heads"]),
        max_seq_len=int(BIG["model.max_seq_len"]),
    )
    assert (shape.dim, shape.n_layers, shape.n_heads, shape.vocab) == (
        ours.dim, ours.n_layers, ours.n_heads, ours.vocab_size,
    )  # fmt: skip
    assert shape.hidden == ours.hidden == 5472
    assert (shape.seq, shape.batch) == (int(BIG["train.seq_len"]), int(BIG["train.batch_size"]))


def test_the_ratio_row_divides_phalanx_by_torchtitan() -> None:
    rows = titan_figures((84_000.0, 30 * 2**30, ""), TITAN, "")
    assert [r[0] for r in rows] == [
        "torchtitan 0.3.0 937M bf16 + compile",
        "Phalanx / torchtitan, 937M bf16 + compile",
    ]
    assert all(ok for _, _, ok, _ in rows)
    ratio = rows[1][3]
    assert ratio["tokens_per_s"] == pytest.approx(1.05)
    assert ratio["peak_memory"] == pytest.approx(0.75)
    assert rows[1][1] == "tokens/s 1.050, peak memory 0.750"


def test_a_failed_run_on_either_side_is_a_failed_row_and_no_ratio() -> None:
    theirs_failed = titan_figures((84_000.0, None, ""), {}, "exit 1: boom")
    assert [(r[1], r[2]) for r in theirs_failed] == [("exit 1: boom", False)]
    ours_failed = titan_figures((None, None, "failed (exit 3): x"), TITAN, "")
    assert [r[2] for r in ours_failed] == [True, False]
    assert ours_failed[1][1] == "failed (exit 3): x"
    no_peak = titan_figures((84_000.0, None, ""), TITAN, "")
    assert no_peak[1][1] == "tokens/s 1.050, peak memory n/a"


def test_phalanx_runs_for_the_ratio_only_when_the_speed_row_did_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("bench.gpu_titan.run_titan", lambda *a, **k: (TITAN, ""))
    calls: list[int] = []

    def ours() -> tuple[float | None, int | None, str]:
        calls.append(1)
        return 40_000.0, None, ""

    from_speed = gpu_figures({"tokens_per_s": 80_000.0, "peak_bytes": 2**30}, ours)
    assert calls == [] and from_speed[-1][3]["tokens_per_s"] == pytest.approx(1.0)
    ran = gpu_figures(None, ours)
    assert calls == [1] and ran[-1][3]["tokens_per_s"] == pytest.approx(0.5)
    assert "titan" in CHECKS


def test_a_stand_in_imports_but_refuses_to_be_used(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = _Unused("some.module")
    stub.why = "ModuleNotFoundError: No module named 'triton'"
    Absent = stub.SomeLoader
    Absent.Config(dataset="c4")  # a default built for a config this run does not use
    with pytest.raises(RuntimeError, match=r"some\.module\.SomeLoader is not available here"):
        Absent()
    with pytest.raises(AttributeError):
        stub.__file__  # noqa: B018  (inspect and importlib ask; a stand-in has none)
    # A module that imports is left as it is.
    monkeypatch.setattr("bench.titan_side.UNUSED", ("json",))
    assert stand_in_for_unused_modules() == []
    assert not isinstance(sys.modules["json"], _Unused)


def test_a_rank_reports_no_device_peak_on_a_cpu() -> None:
    assert _device_peak_bytes(torch.device("cpu")) is None
