"""Build one rank of the trainer in order and run it: config -> workload -> device mesh ->
model (meta) -> pipeline stages -> parallelize -> materialise -> optimizer + LR -> torchft
wiring -> data -> loop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer import logs
from trainer import workloads as workload
from trainer.chaos import Chaos
from trainer.checkpoint import resume as checkpoint_resume
from trainer.checkpoint.files import run_root
from trainer.checkpoint.lease_fence import LeaseFence
from trainer.checkpoint.saver import Checkpointer
from trainer.config import TrainerConfig, spec_hash
from trainer.config.env import RankEnv
from trainer.data.sources import Sampler
from trainer.evaluate import Evaluator
from trainer.exits import EXIT_DRAINED
from trainer.ft.replication import Replication, SingleGroup
from trainer.ft.state import TrainState
from trainer.ft.step_report import StepReport
from trainer.ft.torchft_group import TorchFTGroup
from trainer.loop import Loop, touch
from trainer.metrics import TrainMetrics
from trainer.optim import build_optimizer, build_scheduler, init_optimizer_state
from trainer.parallel.digest import params_sha256
from trainer.parallel.materialize import materialize
from trainer.parallel.mesh import Layout, init_distributed
from trainer.parallel.parallelize import parallelize


def run(cfg: TrainerConfig, env: RankEnv, work: workload.Workload | None = None) -> int:
    """Train to cfg.train.steps (exit code 0), or until SIGTERM drains the group (143).
    `work`: the job's workload, already loaded (by a standby), else loaded here."""
    log = logs.get()
    started = time.monotonic()
    chaos = Chaos()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    torch.manual_seed(cfg.train.seed)
    work = work or workload.load(cfg)
    where = f"workload {cfg.workload.spec or work.name!r}"
    workload.probe_data(work, where)
    full = workload.build_meta(work, where)
    layout = init_distributed(cfg.parallel, env, cfg.ft.timeout_s)
    touch(env.heartbeat)

    n_stages = cfg.parallel.pp * cfg.parallel.stages_per_rank
    if cfg.parallel.pp > 1:
        # Imported here: torch.distributed.pipelining adds about 0.5 s to every rank's start.
        from trainer.parallel.pipeline import build_schedule, build_stage_models

        stages = build_stage_models(full, work, cfg, layout, where)
    else:
        stages = [(0, full)]
    models = [parallelize(m, work, cfg.parallel, layout) for _, m in stages]
    for m in models:
        materialize(m, work.init, cfg.train.seed, layout.device, where)
    params = {name: p for m in models for name, p in m.named_parameters()}
    init_digest = params_sha256(params, layout.group("pp")) if cfg.train.log_init_digest else None

    optimizer = build_optimizer(params, cfg.train, work.param_groups)
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

    schedule = pipeline_loss = None
    if cfg.parallel.pp > 1:
        from trainer.parallel.pipeline import WeightedLoss

        pipeline_loss = WeightedLoss(work.loss)
        schedule, _ = build_schedule(
            list(zip((i for i, _ in stages), models, strict=True)), cfg, layout, pipeline_loss
        )

    sampler = Sampler(work.train_data, work.collate)
    indices = [i for i, _ in stages]
    loop = Loop(
        cfg, env, layout, models, state, replication, sampler, chaos, work.loss,
        tokens_per_item=work.tokens_per_item,
        schedule=schedule,
        pipeline_loss=pipeline_loss,
        first=0 in indices,
        last=n_stages - 1 in indices,
    )  # fmt: skip
    loop.stop_requested = stop.is_set
    metrics = _observe(loop, replication, env, cfg.train.log_every)
    if cfg.train.eval_every:
        _evaluate(cfg, work, where, loop, metrics)
    checkpointer = _checkpoints(cfg, env, layout, loop, state, replication, metrics, chaos)
    if env.rank == 0:
        log.info(
            "rank_started",
            pid=os.getpid(),
            device=str(layout.device),
            layout={"pp": layout.pp, "dp_shard": layout.dp_shard, "tp": layout.tp},
            params=sum(p.numel() for p in params.values()),
            fault_tolerant=env.fault_tolerant,
            workload=cfg.workload.spec or work.name,
            init_sha256=init_digest,
            **work.extra,
            checkpoints=None if checkpointer is None else str(checkpointer.root),
            build_seconds=round(time.monotonic() - started, 3),  # from run() to the loop
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
            r.finite, r.diverged, len(r.items),
        )  # fmt: skip

    loop.on_step.append(record)
    if isinstance(replication, TorchFTGroup):
        replication.on_heal.append(lambda _step, seconds: metrics.observe_heal(seconds))
    if env.rank == 0:
        loop.on_step.append(StepLogger(log_every))
    return metrics


def _evaluate(
    cfg: TrainerConfig, work: workload.Workload, where: str, loop: Loop, metrics: TrainMetrics
) -> None:
    """Every train.eval_every committed steps: the `eval` event and phalanx_eval_loss."""
    if work.eval_data is None:
        raise workload.WorkloadError(
            f"{where} has no eval_data, but train.eval_every is {cfg.train.eval_every}; give the "
            "workload an eval_data or set train.eval_every = 0."
        )
    evaluator = Evaluator(
        every=cfg.train.eval_every,
        batches=cfg.train.eval_batches,
        sampler=Sampler(work.eval_data, work.collate),
        batch_size=cfg.train.batch_size,
        models=loop.models,
        layout=loop.layout,
        loss_fn=work.loss,
        rows=loop.rows,
        autocast=loop.autocast,
        schedule=loop.schedule,
        first=loop.first,
        last=loop.last,
    )
    evaluator.on_eval.append(metrics.observe_eval)
    if loop.env.rank == 0:
        log = logs.get()
        items = cfg.train.eval_batches * cfg.train.batch_size
        evaluator.on_eval.append(
            lambda step, loss: log.info("eval", step=step, loss=loss, items=items)
        )
    loop.on_step.append(evaluator.after_step)


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
        model_hash=spec_hash(config, ["model", "workload"] if cfg.workload.spec else ["model"]),
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
        # The data accounting: the items of every committed step, in train_step or alone.
        items = [r.items.start, r.items.stop]
        if r.step % self.every == 0 or r.step == 1:
            self.log.info(
                "train_step",
                step=r.step,
                items=items,
                loss=None if r.loss is None else round(r.loss, 6),
                lr=r.lr,
                grad_norm=round(r.grad_norm, 6),
                tokens_per_s=round(r.tokens / r.seconds, 1) if r.seconds > 0 else None,
                step_seconds=round(r.seconds, 4),
                participants=r.participants,
            )
        else:
            self.log.info("step_items", step=r.step, items=items, participants=r.participants)
