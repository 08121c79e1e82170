"""Build one rank of the trainer in order and run it:
config -> device mesh -> model -> parallelize -> optimizer + LR -> torchft wiring -> data -> loop.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer import checkpoint_resume, logs
from trainer.chaos import Chaos
from trainer.checkpoint import Checkpointer
from trainer.checkpoint_files import run_root
from trainer.config import TrainerConfig, spec_hash
from trainer.data import Sampler
from trainer.digest import params_sha256
from trainer.env import RankEnv
from trainer.fault_tolerance import Replication, SingleGroup, TorchFTGroup
from trainer.lease_fence import LeaseFence
from trainer.loop import Loop, StepReport, cross_entropy, touch
from trainer.mesh import Layout, init_distributed
from trainer.metrics import TrainMetrics
from trainer.model import Transformer, build_model
from trainer.optim import build_optimizer, build_scheduler, init_optimizer_state
from trainer.parallelize import parallelize
from trainer.state import TrainState

EXIT_DRAINED = 128 + signal.SIGTERM


def run(cfg: TrainerConfig, env: RankEnv) -> int:
    """Train to cfg.train.steps (exit code 0), or until SIGTERM drains the group (143)."""
    log = logs.get()
    started = time.monotonic()
    chaos = Chaos()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    torch.manual_seed(cfg.train.seed)
    layout = init_distributed(cfg.parallel, env, cfg.ft.timeout_s)
    touch(env.heartbeat)

    if cfg.parallel.pp > 1:
        # Imported here: torch.distributed.pipelining adds about 0.5 s to every rank's start.
        from trainer.pipeline import build_schedule, build_stage_models

        stages = build_stage_models(cfg, layout)
    else:
        stages = [(0, build_model(cfg.model, cfg.train.seed))]
    models: list[Transformer] = [parallelize(m, cfg.parallel, layout) for _, m in stages]
    params = {name: p for m in models for name, p in m.named_parameters()}

    optimizer = build_optimizer(params.values(), cfg.train)
    init_optimizer_state(optimizer)
    scheduler = build_scheduler(optimizer, cfg.train)
    state = TrainState(params=params, optimizer=optimizer, scheduler=scheduler)

    replication: Replication
    if env.fault_tolerant:
        replication = TorchFTGroup(cfg.ft, env, layout.device, state, chaos)
        replication.stop_requested = stop.is_set
    else:
        replication = SingleGroup(state)
    replication.hook_fsdp(m for model in models for m in model.modules())

    schedule = None
    if cfg.parallel.pp > 1:
        schedule, _ = build_schedule(stages, cfg, layout, cross_entropy)

    sampler = Sampler(cfg, env.replica_group, env.num_replica_groups)
    loop = Loop(cfg, env, layout, models, state, replication, sampler, chaos, schedule)
    loop.stop_requested = stop.is_set
    metrics = _observe(loop, replication, env, cfg.train.log_every)
    checkpointer = _checkpoints(cfg, env, layout, loop, state, replication, metrics, chaos)
    if env.rank == 0:
        log.info(
            "rank_started",
            device=str(layout.device),
            layout={"pp": layout.pp, "dp_shard": layout.dp_shard, "tp": layout.tp},
            params=sum(p.numel() for p in params.values()),
            fault_tolerant=env.fault_tolerant,
            entropy=sampler.entropy(),
            checkpoints=None if checkpointer is None else str(checkpointer.root),
        )
    chaos.at("start")
    loop.run()
    if checkpointer is not None:
        # At the end and on a drain (SIGTERM) alike, the writer group saves the last
        # committed step: stopping every node and starting them later loses nothing.
        checkpointer.save(replication.current_step(), final=True)
        checkpointer.close()  # never leave a save half-written on a clean exit

    if loop.drained:
        if env.rank == 0:
            log.info("train_stopped", step=replication.current_step(), reason="SIGTERM")
        _leave(replication)
        return EXIT_DRAINED
    digest = params_sha256(params, layout.group("pp"))
    if env.rank == 0:
        log.info(
            "train_done",
            step=replication.current_step(),
            loss=loop.last_loss,
            params_sha256=digest,
            tokens=state.tokens,
            seconds=round(time.monotonic() - started, 3),
        )
    _leave(replication)
    return 0


def _observe(loop: Loop, replication: Replication, env: RankEnv, log_every: int) -> TrainMetrics:
    """Metrics for every step and heal; `train_step` events from rank 0."""
    metrics = TrainMetrics(env)

    def record(r: StepReport) -> None:
        metrics.observe_step(
            r.step, r.committed, r.loss, r.lr, r.seconds, r.tokens, r.participants, r.quorum_id,
            r.finite, r.diverged,
        )  # fmt: skip

    loop.on_step.append(record)
    if isinstance(replication, TorchFTGroup):
        replication.on_heal.append(lambda _step, seconds: metrics.observe_heal(seconds))
    if env.rank == 0:
        loop.on_step.append(StepLogger(log_every))
    return metrics


def _checkpoints(
    cfg: TrainerConfig,
    env: RankEnv,
    layout: Layout,
    loop: Loop,
    state: TrainState,
    replication: Replication,
    metrics: TrainMetrics,
    chaos: Chaos,
) -> Checkpointer | None:
    """Periodic saves after committed steps; a fresh start resumes from the newest checkpoint."""
    if not cfg.checkpoint.dir:
        return None
    config = cfg.model_dump(mode="json")
    root = run_root(Path(cfg.checkpoint.dir), env.job, config)
    checkpointer = Checkpointer(
        cfg.checkpoint,
        root,
        state,
        replication,
        metrics,
        model_hash=spec_hash(config, ["model"]),
        layout={"pp": layout.pp, "dp_shard": layout.dp_shard, "tp": layout.tp},
        rank=env.rank,
        chaos=chaos,
        fence=LeaseFence(env.lease_file) if env.lease_file else None,
    )

    def resume() -> None:
        # No group of this quorum has committed a step (no live peer to heal from): every
        # group continues from the same checkpoint on disk, if there is one.
        if replication.fresh_start():
            checkpoint_resume.resume(checkpointer, replication, chaos, cfg.checkpoint.resume_from)

    loop.before_first_commit.append(resume)
    loop.on_step.append(lambda r: checkpointer.after_commit(r.step) if r.committed else None)
    return checkpointer


def _leave(replication: Replication) -> None:
    if dist.is_initialized():
        # Rank 0 hosts the group's store: nobody leaves while a peer still needs it.
        dist.barrier()
    replication.shutdown()


class StepLogger:
    """Emits `train_step` (committed) and `step_skipped` (not committed) events."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.log = logs.get()

    def __call__(self, r: StepReport) -> None:
        if not r.committed:
            self.log.warning("step_skipped", step=r.step, participants=r.participants)
            return
        if r.step % self.every == 0 or r.step == 1:
            self.log.info(
                "train_step",
                step=r.step,
                loss=None if r.loss is None else round(r.loss, 6),
                lr=r.lr,
                grad_norm=round(r.grad_norm, 6),
                tokens_per_s=round(r.tokens / r.seconds, 1) if r.seconds > 0 else None,
                step_seconds=round(r.seconds, 4),
                participants=r.participants,
            )
