"""The trainer's job file, torch-free: the section models (model, parallel, train, data,
workload, checkpoint, ft), reading TOML or JSON with `--set` overrides, the
cross-field checks, and the environment contract with the launcher. The daemon
validates job files with these same modules.
"""

from __future__ import annotations

from trainer.config.checks import check_trainer
from trainer.config.env import RankEnv, advertise_host, bind_host
from trainer.config.job_file import (
    add_override_option,
    apply_overrides,
    load_trainer_config,
    parse_override,
    read_job_file,
    spec_hash,
    validate,
)
from trainer.config.sections import (
    TRAINER_SECTIONS,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    FaultToleranceConfig,
    ModelConfig,
    ParallelConfig,
    Section,
    TrainConfig,
    TrainerConfig,
)

__all__ = [
    "TRAINER_SECTIONS",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "FaultToleranceConfig",
    "ModelConfig",
    "ParallelConfig",
    "RankEnv",
    "Section",
    "TrainConfig",
    "TrainerConfig",
    "add_override_option",
    "advertise_host",
    "apply_overrides",
    "bind_host",
    "check_trainer",
    "load_trainer_config",
    "parse_override",
    "read_job_file",
    "spec_hash",
    "validate",
]
