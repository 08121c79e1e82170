"""One rank of the trainer: :func:`build` makes its components in a fixed order and
returns them as :class:`Built`; :func:`train` runs the steps, and after each one, in
plain sight, the metrics, the step log, the evaluation and the checkpoint.

The order of build: workload -> device mesh -> model (meta) -> pipeline stages ->
parallelize -> materialise -> pipeline schedule -> optimizer + LR -> training state ->
replication across groups (torchft) -> metrics -> checkpointer -> data and loop ->
evaluator.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from trainer import logs
from trainer import workloads as workload
from trainer.chaos import Chaos
from trainer.checkpoint import resume as checkpoint_resume
from trainer.checkpoint.files import run_root
from trainer.checkpoint.lease_fence import LeaseFence
from trainer.checkpoint.saver import Checkpointer
from trainer.config import TrainerConfig, spec_hash
from trainer.config.env import RankEnv
from trainer.contracts import rank_events as events
from trainer.contracts.heartbeat import Heartbeat
from trainer.data.sources import Sampler
from trainer.evaluate import Evaluator
from trainer.exits import EXIT_DRAINED
from trainer.ft.buffers import Buffers, persistent_buffers
from trainer.ft.outer import OuterStep
from trainer.ft.replication import Replication, SingleGroup
from trainer.ft.state import TrainState
from trainer.ft.torchft_group import TorchFTGroup
from trainer.loop import Loop
from trainer.metrics import TrainMetrics
from trainer.optim import build_optimizer, build_scheduler, init_optimizer_state
from trainer.parallel.context import context_parallel
from trainer.parallel.digest import params_sha256
from trainer.parallel.materialize import materialize
from trainer.parallel.mesh import Layout, init_distributed
from trainer.parallel.parallelize import parallelize
from trainer.round_loop import RoundLoop
from trainer.step_log import StepLogger


@dataclass
class Built:
    """One rank's components, in the order :func:`build` makes them."""

    cfg: TrainerConfig
    env: RankEnv
    started: float  # when build began (monotonic)
    chaos: Chaos
    work: workload.Workload
    layout: Layout
    models: list[nn.Module]  # the model, or this rank's pipeline stages
    params: dict[str, nn.Parameter]
    init_digest: str | None  # train.log_init_digest
    state: TrainState
    replication: Replication
    loop: Loop | RoundLoop  # RoundLoop: ft.semi_sync_method = "diloco"
    metrics: TrainMetrics
    step_log: StepLogger | None  # each node's first rank's train_step events
    evaluator: Evaluator | None  # train.eval_every
    checkpointer: Checkpointer | None  # checkpoint.dir
    beat: Heartbeat  # progress for the daemon's hang detection


def run(cfg: TrainerConfig, env: RankEnv, work: workload.Workload | None = None) -> int:
    """Train to cfg.train.steps (exit code 0), or until SIGTERM drains the group (143).
    `work`: the job's workload, already loaded (by a standby), else loaded here."""
    return train(build(cfg, env, work))


def build(cfg: TrainerConfig, env: RankEnv, work: workload.Workload | None = None) -> Built:
    """Every component of one rank, in order; nothing trains yet."""
    started = time.monotonic()
    chaos = Chaos(rank=env.rank)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    torch.manual_seed(cfg.train.seed)

    # The workload, checked on the meta device before the mesh exists.
    work = work or workload.load(cfg)
    where = f"workload {cfg.workload.spec or work.name!r}"
    workload.probe_data(work, where)
    full = workload.build_meta(work, where)
    layout = init_distributed(cfg.parallel, env, cfg.ft.timeout_s)
    beat = Heartbeat(env.heartbeat, background=True)  # step beats off the step loop
    beat.enter("start")  # the process group formed: progress

    # Pipeline stages, parallelize and materialise each, then the pipeline's schedule.
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
    schedule = pipeline_loss = None
    if cfg.parallel.pp > 1:  # the stages' schedule, with the loss it weights
        from trainer.parallel.pipeline import WeightedLoss

        pipeline_loss = WeightedLoss(work.loss)
        schedule, _ = build_schedule(
            list(zip((i for i, _ in stages), models, strict=True)), cfg, layout, pipeline_loss
        )
    params = {name: p for m in models for name, p in m.named_parameters()}
    init_digest = params_sha256(params, layout.group("pp")) if cfg.train.log_init_digest else None

    # Optimizer, LR schedule and the state one group hands another.
    optimizer = build_optimizer(params, cfg.train, work.param_groups)
    init_optimizer_state(optimizer)
    scheduler = build_scheduler(optimizer, cfg.train)
    state = TrainState(
        params=params,
        optimizer=optimizer,
        scheduler=scheduler,
        buffers=Buffers(persistent_buffers(models)),
    )

    # Replication across replica groups.
    replication: Replication
    if env.fault_tolerant:
        replication = TorchFTGroup(cfg.ft, env, layout.device, state, chaos, stop.is_set, beat)
    else:
        replication = SingleGroup(state)
    outer = None  # diloco: only the syncs cross groups (round_loop.py), no FSDP hook
    if cfg.ft.semi_sync_method == "diloco":
        outer = state.outer = OuterStep.build(
            params, cfg.ft.outer_lr, cfg.ft.outer_momentum, cfg.ft.num_fragments
        )
    else:
        replication.hook_fsdp(m for model in models for m in model.modules())

    # The loop, then what follows its steps.
    indices = [i for i, _ in stages]
    metrics = TrainMetrics(env)
    checkpointer = _checkpointer(cfg, env, layout, state, replication, metrics, chaos)
    resume = None if checkpointer is None else _resume(cfg, checkpointer, replication, chaos, beat)
    sampler = Sampler(work.train_data, work.collate)
    parts = (cfg, env, layout, models, state, replication, sampler, chaos, work.loss)
    loop: Loop | RoundLoop
    if outer is not None:
        loop = RoundLoop(
            *parts,
            outer,
            tokens_per_item=work.tokens_per_item,
            stop_requested=stop.is_set,
            cold_start=resume,
        )
    else:
        loop = Loop(
            *parts,
            tokens_per_item=work.tokens_per_item,
            schedule=schedule,
            pipeline_loss=pipeline_loss,
            first=0 in indices,
            last=n_stages - 1 in indices,
            stop_requested=stop.is_set,
            cold_start=resume,
            cp=context_parallel(
                cfg.parallel, layout, cfg.train.seq_len, models, work.position_buffers
            ),
        )
    return Built(
        cfg=cfg,
        env=env,
        started=started,
        chaos=chaos,
        work=work,
        layout=layout,
        models=models,
        params=params,
        init_digest=init_digest,
        state=state,
        replication=replication,
        loop=loop,
        metrics=metrics,
        # Each node's first rank: the daemon of every node of a group that spans nodes
        # follows the steps (a group of one node: its rank 0).
        step_log=StepLogger(cfg.train.log_every) if env.local_rank == 0 else None,
        evaluator=_evaluator(cfg, work, where, loop) if cfg.train.eval_every else None,
        checkpointer=checkpointer,
        beat=beat,
    )


def train(b: Built) -> int:
    """Run the steps; after each: metrics, the step log, evaluation, checkpoint, heartbeat."""
    log = logs.get()
    if b.env.rank == 0:
        log.info(
            events.RANK_STARTED,
            pid=os.getpid(),
            device=str(b.layout.device),
            layout=b.layout.degrees(),
            backend=b.layout.backend,  # the group's own process group's; None without one
            params=sum(p.numel() for p in b.params.values()),
            fault_tolerant=b.env.fault_tolerant,
            workload=b.cfg.workload.spec or b.work.name,
            init_sha256=b.init_digest,
            **b.work.extra,
            checkpoints=None if b.checkpointer is None else str(b.checkpointer.root),
            build_seconds=round(time.monotonic() - b.started, 3),  # from build() to the loop
        )
    b.chaos.at("start")
    while not b.loop.done():
        report = b.loop.step()
        if report is None:  # resumed at the final step, or a drain left this step
            break
        b.metrics.observe_step(report)
        watch = b.loop.stragglers
        b.metrics.observe_rank(report.seconds, b.loop.compute_s, watch.flagged, watch.last_ratio)
        for seconds in b.replication.take_heals():
            b.metrics.observe_heal(seconds)
        b.metrics.observe_join_timeouts(b.replication.take_join_timeouts())
        if b.step_log is not None:
            b.step_log(report)
        if b.evaluator is not None and b.evaluator.due(report):
            b.beat.enter("eval")
            began = time.monotonic()
            loss = b.evaluator.evaluate()
            b.metrics.observe_eval(report.step, loss)
            if b.env.rank == 0:
                items = b.cfg.train.eval_batches * b.cfg.train.batch_size
                log.info("eval", step=report.step, loss=loss, items=items)
            if b.step_log is not None:
                b.step_log.spent(events.EVAL_S, time.monotonic() - began)
        if b.checkpointer is not None and report.committed:
            if b.checkpointer.due(report.step):  # a save starts (or is skipped) here
                b.beat.enter("save")
                began = time.monotonic()
                b.checkpointer.after_commit(report.step)
                if b.step_log is not None:
                    b.step_log.spent(events.CHECKPOINT_S, time.monotonic() - began)
            else:
                b.checkpointer.after_commit(report.step)
        b.beat.enter("step")
    return _finish(b)


def _finish(b: Built) -> int:
    """The last save, then `train_done` (or `train_stopped` on a drain), and leave."""
    log = logs.get()
    b.beat.enter("finish")
    step = b.replication.current_step()
    if b.checkpointer is not None:
        # At the end and on a drain (SIGTERM) alike, the writer group saves the last
        # committed step: stopping every node and starting them later loses nothing.
        b.checkpointer.save(step, final=True)
        b.checkpointer.close()  # never leave a save half-written on a clean exit
    if b.loop.drained:
        if b.env.rank == 0:
            log.info(events.TRAIN_STOPPED, step=step, reason="SIGTERM")
        _leave(b)
        return EXIT_DRAINED
    digest = params_sha256(b.params, b.layout.group("pp"))
    buffers = params_sha256(b.state.buffers.committed, b.layout.group("pp"))
    if b.env.local_rank == 0:  # every node's daemon reports the digest
        log.info(
            events.TRAIN_DONE,
            step=step,
            loss=b.loop.last_loss,
            params_sha256=digest,
            buffers_sha256=buffers,
            tokens=b.state.tokens,
            seconds=round(time.monotonic() - b.started, 3),
            device_peak_bytes=_device_peak_bytes(b.layout.device),
        )
    _leave(b)
    return 0


def _device_peak_bytes(device: torch.device) -> int | None:
    """The most memory this rank's tensors held on its accelerator (read once, at the
    end: no sync in the step loop); None on a CPU."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def _evaluator(
    cfg: TrainerConfig, work: workload.Workload, where: str, loop: Loop | RoundLoop
) -> Evaluator:
    """Every train.eval_every committed steps: the mean loss over fixed evaluation items."""
    if work.eval_data is None:
        raise workload.WorkloadError(
            f"{where} has no eval_data, but train.eval_every is {cfg.train.eval_every}; give the "
            "workload an eval_data or set train.eval_every = 0."
        )
    return Evaluator(
        every=cfg.train.eval_every,
        batches=cfg.train.eval_batches,
        sampler=Sampler(work.eval_data, work.collate),
        batch_size=cfg.train.batch_size,
        passes=loop.passes,
        layout=loop.layout,
        rows=loop.rows,
    )


def _checkpointer(
    cfg: TrainerConfig,
    env: RankEnv,
    layout: Layout,
    state: TrainState,
    replication: Replication,
    metrics: TrainMetrics,
    chaos: Chaos,
) -> Checkpointer | None:
    """Periodic saves after committed steps (checkpoint.dir); its wait for a background
    copy guards the state against the next mutation."""
    if not cfg.checkpoint.dir:
        return None
    config = cfg.model_dump(mode="json")
    checkpointer = Checkpointer(
        cfg.checkpoint,
        run_root(Path(cfg.checkpoint.dir), env.job, config),
        state,
        replication,
        metrics,
        model_hash=spec_hash(config, ["model", "workload"] if cfg.workload.spec else ["model"]),
        layout=layout.degrees(),
        rank=env.rank,
        chaos=chaos,
        fence=LeaseFence(env.lease_file) if env.lease_file else None,
    )
    state.guard = checkpointer.wait_staged
    return checkpointer


def _resume(
    cfg: TrainerConfig,
    checkpointer: Checkpointer,
    replication: Replication,
    chaos: Chaos,
    beat: Heartbeat,
) -> Callable[[], None]:
    """The loop's cold start: while no group of this quorum has committed a step (no live
    peer to heal from), every group continues from the same checkpoint on disk."""

    def resume() -> None:
        if replication.fresh_start():
            beat.enter("load")
            checkpoint_resume.resume(checkpointer, replication, chaos, cfg.checkpoint.resume_from)

    return resume


def _leave(b: Built) -> None:
    """Leave the group and the quorum."""
    if dist.is_initialized():
        # Rank 0 hosts the group's store: nobody leaves while a peer still needs it.
        dist.barrier()
    b.replication.shutdown()
    b.chaos.at("finish", 0)  # a rank slower to exit than its group's others
