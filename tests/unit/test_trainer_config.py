"""Job-file parsing, overrides and cross-field checks (pure logic, no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.config import (
    ConfigError,
    TrainerConfig,
    apply_overrides,
    load_trainer_config,
    parse_override,
    spec_hash,
)
from trainer.config.checks import check_trainer
from trainer.config.env import RankEnv

ROOT = Path(__file__).resolve().parents[2]


def test_examples_validate() -> None:
    for path, world in [("single.toml", 1), ("fsdp_tp.toml", 4), ("pipeline.toml", 4)]:
        cfg = load_trainer_config(ROOT / "examples" / path, world_size=world)
        assert cfg.parallel.world_size == world


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("train.steps=3", 3),
        ("train.lr=0.5", 0.5),
        ("parallel.compile=true", True),
        ('data.source="text"', "text"),
        ("data.source=text", "text"),  # a bare word is a string
        ('job.tags=["a", "b"]', ["a", "b"]),
        ("data.path=/tmp/x y", "/tmp/x y"),
    ],
)
def test_override_values_are_toml_literals(text: str, value: object) -> None:
    parts, parsed = parse_override(text)
    assert parsed == value
    assert parts == text.split("=")[0].split(".")


def test_overrides_nest_and_do_not_mutate() -> None:
    data = {"train": {"steps": 1}}
    out = apply_overrides(data, ["train.steps=5", "model.dim=32"])
    assert out == {"train": {"steps": 5}, "model": {"dim": 32}}
    assert data == {"train": {"steps": 1}}


def test_override_through_a_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train\.steps"):
        apply_overrides({"train": {"steps": 1}}, ["train.steps.x=2"])


def test_strict_types() -> None:
    with pytest.raises(ConfigError, match=r"train\.steps"):
        load_trainer_config(ROOT / "examples" / "single.toml", ["train.steps=1.5"])
    # An integer is a fine float.
    cfg = load_trainer_config(ROOT / "examples" / "single.toml", ["train.lr=1"])
    assert cfg.train.lr == 1.0


def test_tensor_parallel_divisibility_is_checked() -> None:
    cfg = TrainerConfig.model_validate({"parallel": {"tp": 3}, "model": {"n_heads": 4}})
    with pytest.raises(ConfigError, match=r"model\.n_heads"):
        check_trainer(cfg, 3)


def test_interleaved_needs_two_stages_per_rank() -> None:
    cfg = TrainerConfig.model_validate(
        {
            "parallel": {"pp": 2, "pp_schedule": "Interleaved1F1B", "pp_stages_per_rank": 1},
            "model": {"n_layers": 4},
        }
    )
    with pytest.raises(ConfigError, match="pp_stages_per_rank"):
        check_trainer(cfg, 2)


def test_a_pipelined_global_batch_is_whole_schedule_batches() -> None:
    def cfg(global_batch: int) -> TrainerConfig:
        return TrainerConfig.model_validate(
            {
                "parallel": {"pp": 2, "pp_schedule": "GPipe", "pp_microbatches": 2},
                "train": {"batch_size": 8, "global_batch_size": global_batch},
            }
        )

    check_trainer(cfg(24), 2)  # three schedule batches of 8
    with pytest.raises(ConfigError, match=r"train\.global_batch_size \(20\) must be a multiple"):
        check_trainer(cfg(20), 2)


def test_daemon_sections_are_skipped_by_the_trainer(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "x"\n[node]\nnproc = 1\n[train]\nsteps = 7\n')
    assert load_trainer_config(job).train.steps == 7


def test_json_job_file(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text('{"train": {"steps": 9}, "checkpoint": {"async": false}}')
    cfg = load_trainer_config(job)
    assert cfg.train.steps == 9 and cfg.checkpoint.async_save is False


def test_spec_hash_ignores_key_order_and_other_sections() -> None:
    a = {"train": {"steps": 1, "lr": 2.0}, "node": {"id": "a"}}
    b = {"node": {"id": "b"}, "train": {"lr": 2.0, "steps": 1}}
    assert spec_hash(a, ["train"]) == spec_hash(b, ["train"])
    assert spec_hash(a, ["train"]) != spec_hash({"train": {"steps": 2, "lr": 2.0}}, ["train"])


def test_env_contract_defaults_and_errors() -> None:
    env = RankEnv.from_environ({})
    assert (env.rank, env.world_size, env.replica_group, env.fault_tolerant) == (0, 1, 0, False)
    with pytest.raises(ConfigError, match="REPLICA_GROUP_ID"):
        RankEnv.from_environ({"REPLICA_GROUP_ID": "2", "NUM_REPLICA_GROUPS": "2"})
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        RankEnv.from_environ({"TORCHFT_LIGHTHOUSE": "http://x:1"})


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=8))
def test_batch_divisibility_property(batch: int, dp: int) -> None:
    cfg = TrainerConfig.model_validate(
        {"train": {"batch_size": batch}, "parallel": {"dp_shard": dp}}
    )
    if batch % dp:
        with pytest.raises(ConfigError, match=r"train\.batch_size"):
            check_trainer(cfg, dp)
    else:
        check_trainer(cfg, dp)


def test_a_relative_python_path_is_beside_the_job_file(tmp_path: Path) -> None:
    """Not the current directory: a systemd unit's or a pod's is not the job file's."""
    job = tmp_path / "jobs" / "job.toml"
    (job.parent / "lib").mkdir(parents=True)
    (job.parent / "m.py").write_text("def spec(ctx): ...\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job.write_text(f'[workload]\nspec = "m:spec"\npython_path = [".", "lib", "{elsewhere}"]\n')
    got = load_trainer_config(job).workload.python_path
    assert got == [str(job.parent), str(job.parent / "lib"), str(elsewhere)]
    flagged = load_trainer_config(job, ['workload.python_path=["tests"]', 'workload.spec="json:x"'])
    assert flagged.workload.python_path == ["tests"]  # a --set value: relative to the cwd


def test_diloco_commits_whole_rounds_and_names_what_is_not_a_multiple() -> None:
    def cfg(**sections: Mapping[str, object]) -> TrainerConfig:
        ft = {"semi_sync_method": "diloco", "sync_steps": 20, **sections.pop("ft", {})}
        base = {"train": {"steps": 200}, "checkpoint": {"interval_steps": 100}}
        return TrainerConfig.model_validate({**base, **sections, "ft": ft})

    check_trainer(cfg(), 1)
    for sections, field in (
        ({"train": {"steps": 210}}, r"train\.steps \(210\)"),
        ({"checkpoint": {"interval_steps": 50}}, r"checkpoint\.interval_steps \(50\)"),
        ({"ft": {"digest_every": 30}}, r"ft\.digest_every \(30\)"),
    ):
        with pytest.raises(ConfigError, match=field + r" must be a multiple of ft\.sync_steps"):
            check_trainer(cfg(**sections), 1)
    with pytest.raises(ConfigError, match=r"parallel\.pp = 1 and parallel\.cp = 1"):
        check_trainer(cfg(parallel={"pp": 2, "pp_schedule": "GPipe"}, model={"n_layers": 4}), 2)
    with pytest.raises(ConfigError, match="semi_sync_method"):
        load_trainer_config(ROOT / "examples" / "single.toml", ['ft.semi_sync_method="local"'])
    check_trainer(cfg(ft={"should_quantize": True}), 1)
    with pytest.raises(ConfigError, match=r"ft\.should_quantize .* and ft\.sync_bf16 .* set one"):
        check_trainer(cfg(ft={"should_quantize": True, "sync_bf16": True}), 1)
    # The default exchanges every step, as before; train.steps needs no multiple.
    check_trainer(TrainerConfig.model_validate({"train": {"steps": 7}}), 1)
