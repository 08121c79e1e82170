"""parallel.cp's pure parts: which positions each cp rank holds, and the refusals of
layouts it cannot run (each one sentence naming the field, before anything starts)."""

from __future__ import annotations

import pytest
import torch

from daemon.config import DaemonConfig
from daemon.config.preflight import check_cuda_settings
from trainer.config import ConfigError, TrainerConfig, validate
from trainer.config.checks import check_trainer
from trainer.parallel.cp_attention import chunk_positions


def test_each_rank_holds_an_early_and_a_late_chunk_and_together_every_position() -> None:
    held = [chunk_positions(16, 2, r).tolist() for r in range(2)]
    assert held == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))
    # Causal work per rank (sum of positions + 1) is equal: the point of the pairing.
    work = {int((chunk_positions(24, 3, r) + 1).sum()) for r in range(3)}
    assert len(work) == 1


def test_the_group_size_counts_cp() -> None:
    cfg = validate(TrainerConfig, {"parallel": {"cp": 2, "dp_shard": 2}}, "job")
    assert cfg.parallel.world_size == 4
    with pytest.raises(ConfigError, match=r"parallel\.dp_shard\*cp\*tp\*pp is 2\*2\*1\*1 = 4"):
        check_trainer(cfg, world_size=2)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"train": {"seq_len": 30}, "parallel": {"cp": 2}},
            r"train\.seq_len \(30\) .* 2\*parallel\.cp \(4\)",
        ),
        ({"parallel": {"cp": 2, "pp": 2}}, r"parallel\.cp > 1 with parallel\.pp > 1"),
        (
            {"parallel": {"cp": 2, "cp_attention": "torch", "device": "cpu"}},
            r"parallel\.cp_attention = 'torch' runs only on CUDA",
        ),
    ],
    ids=["seq-len", "with-pp", "torch-on-cpu"],
)
def test_layouts_cp_cannot_run_are_refused(
    settings: dict[str, dict[str, object]], message: str
) -> None:
    cfg = validate(TrainerConfig, settings, "job")
    with pytest.raises(ConfigError, match=message) as e:
        check_trainer(cfg)
    assert str(e.value).count(". ") == 0


def test_a_cpu_node_refuses_torch_attention_and_nccl_before_starting() -> None:
    on_cpu = {"node": {"device": "cpu"}}
    cfg = validate(DaemonConfig, {"parallel": {"cp": 2, "cp_attention": "torch"}, **on_cpu}, "job")
    with pytest.raises(ConfigError, match=r"parallel\.cp_attention = 'torch' .* on the cpu"):
        check_cuda_settings(cfg)
    check_cuda_settings(validate(DaemonConfig, {"parallel": {"cp": 2}, **on_cpu}, "job"))
    cfg = validate(DaemonConfig, {"ft": {"backend": "nccl"}, **on_cpu}, "job")
    with pytest.raises(ConfigError, match=r"ft\.backend = 'nccl' needs CUDA"):
        check_cuda_settings(cfg)
