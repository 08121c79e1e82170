"""A standby's device warm-up (issue 53, build 4): on a CUDA job it makes its CUDA
context and runs a first step's kernels while it waits; on a CPU job, or wherever that
fails, it does nothing and never fails the standby. The CUDA branch runs where a GPU is."""

from __future__ import annotations

import torch

from tests.support.harness import ROOT
from trainer.config import TrainerConfig, load_trainer_config
from trainer.spares.device_warmup import first_use, job_device, warm_device

SINGLE = str(ROOT / "examples" / "single.toml")


def on(cfg: TrainerConfig, device: str) -> TrainerConfig:
    return cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"device": device})})


def test_the_first_steps_kernels_run_on_the_device_given_in_both_precisions() -> None:
    for bf16 in (False, True):
        first_use(torch.device("cpu"), bf16=bf16)


def test_a_cpu_job_warms_no_device() -> None:
    cfg = on(load_trainer_config(SINGLE, [], 1), "cpu")
    assert job_device(cfg) == "cpu"
    assert warm_device(SINGLE, cfg, 1) is None


def test_a_job_file_that_does_not_load_warms_nothing_and_raises_nothing() -> None:
    assert warm_device("/nonexistent/job.toml", None, 1) is None


def test_a_cuda_job_warms_its_local_device_where_there_is_one() -> None:
    cfg = on(load_trainer_config(SINGLE, [], 1), "cuda")
    warmed = warm_device(SINGLE, cfg, 1)
    if torch.cuda.is_available():
        assert warmed == "cuda:0" and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    else:  # set_device fails without CUDA: the standby goes on, the rank reports it
        assert warmed is None
