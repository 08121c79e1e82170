"""Prometheus metrics of a replica group, written by its rank 0.

Ranks run under the daemon with ``PROMETHEUS_MULTIPROC_DIR`` set: prometheus-client
then keeps values in memory-mapped files there, and the daemon merges them into
the node's ``/metrics``. Only group rank 0 records (every rank of a group sees
the same steps, quorums and heals), so nothing is counted twice. Without the
variable (plain torchrun) the metrics live in this process and cost nothing.

Labels: ``phalanx_job``, ``node`` and ``replica_group``; all bounded. The job's
name is not called ``job`` because Prometheus reserves that label for the scrape.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trainer.config.env import RankEnv
from trainer.step_report import StepReport, SyncFigures

LABELS = ("phalanx_job", "node", "replica_group")
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
HEAL_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
SAVE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class TrainMetrics:
    def __init__(self, env: RankEnv) -> None:
        self.enabled = env.rank == 0
        multiproc = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        # In multiprocess mode values go to files; a private registry avoids the default one.
        registry = None if multiproc else CollectorRegistry()
        values = (env.job or "", env.node or "", str(env.replica_group))

        def gauge(name: str, doc: str) -> Any:
            return Gauge(
                name, doc, LABELS, registry=registry, multiprocess_mode="livemostrecent"
            ).labels(*values)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, LABELS, registry=registry).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, LABELS, registry=registry, buckets=buckets).labels(*values)

        self.step = gauge("phalanx_train_step", "Last committed optimizer step.")
        self.loss = gauge("phalanx_train_loss", "Loss of the last committed step (group mean).")
        self.step_seconds = histogram(
            "phalanx_train_step_seconds",
            "Wall time of one step attempt, quorum to optimizer.",
            STEP_BUCKETS,
        )
        self.tokens = counter(
            "phalanx_train_tokens", "Tokens this replica group trained on (committed steps)."
        )
        self.items = counter(
            "phalanx_items",
            "Dataset items this replica group trained on (its share of committed steps).",
        )
        self.eval_loss = gauge(
            "phalanx_eval_loss", "Mean loss over the fixed evaluation items at the last evaluation."
        )
        self.eval_step = gauge("phalanx_eval_step", "Committed step of the last evaluation.")
        self.lr = gauge("phalanx_train_learning_rate", "Learning rate of the last committed step.")
        self.participants = gauge(
            "phalanx_ft_participants",
            "Replica groups whose gradients the last step attempt averaged (a healing "
            "group is in the quorum but not among them).",
        )
        self.quorum_id = gauge("phalanx_ft_quorum_id", "Identifier of the current torchft quorum.")
        self.heals = counter("phalanx_ft_heals", "Live heals of this group from a peer.")
        self.heal_seconds = histogram(
            "phalanx_ft_heal_seconds",
            "Time from the quorum that needed a heal to the state being applied.",
            HEAL_BUCKETS,
        )
        self.join_timeouts = counter(
            "phalanx_ft_quorum_join_timeouts",
            "Quorums that waited out lighthouse.join_timeout_ms for members of the quorum "
            "before (a stall every group paid; event quorum_join_timeout).",
        )
        self.commit_failures = counter(
            "phalanx_ft_commit_failures", "Steps the quorum did not commit (retried)."
        )
        self.not_finite = counter(
            "phalanx_steps_not_finite",
            "Steps voted down for a NaN or infinite loss or gradient norm (never committed).",
        )
        self.divergences = counter(
            "phalanx_replica_divergences",
            "Parameter comparisons (every ft.digest_every steps) that found the groups different.",
        )
        self.ckpt_blocked = histogram(
            "phalanx_checkpoint_blocked_seconds",
            "Time training was blocked by a checkpoint save.",
            SAVE_BUCKETS,
        )
        self.ckpt_save = histogram(
            "phalanx_checkpoint_save_seconds",
            "Time from a save's start to its completion marker.",
            SAVE_BUCKETS,
        )
        self.ckpt_last_step = gauge(
            "phalanx_checkpoint_last_step", "Step of the newest complete checkpoint."
        )
        self.ckpt_failures = counter("phalanx_checkpoint_failures", "Checkpoint saves that failed.")
        self.ckpt_skipped = counter(
            "phalanx_checkpoint_skipped",
            "Checkpoints skipped because the previous save was still running.",
        )
        self.compute_seconds = histogram(
            "phalanx_compute_seconds",
            "Rank 0's compute in one step: forward and backward, without waiting on other groups.",
            STEP_BUCKETS,
        )

        # ft.semi_sync_method = "diloco": the rounds' syncs across groups.
        self.sync_steps = gauge(
            "phalanx_ft_sync_steps", "Steps each group takes on its own between syncs (diloco)."
        )
        self.sync_seconds = histogram(
            "phalanx_ft_sync_seconds",
            "A sync across groups (diloco): its quorum, the exchange and the commit.",
            STEP_BUCKETS,
        )
        self.sync_bytes = counter(
            "phalanx_ft_sync_bytes",
            "Bytes of the tensors rank 0's syncs averaged across groups (diloco).",
        )
        self.pseudo_norm = gauge(
            "phalanx_ft_pseudo_gradient_norm",
            "L2 norm of the last committed sync's averaged pseudo-gradient (diloco).",
        )
        self.items_lost = counter(
            "phalanx_items_lost",
            "Items of a round that no group trained: a group lost during it (diloco; "
            "counted by one group of the round, event items_lost).",
        )
        self.items_partly_lost = counter(
            "phalanx_items_partly_lost",
            "Items a group trained and took with it before one fragment of the parameters "
            "synced them (streaming diloco, ft.num_fragments > 1; counted once per fragment "
            "by one group, event items_partly_lost).",
        )

        # Every rank's own (label `rank`, the rank in its group): stragglers are ranks.
        def rank_gauge(name: str, doc: str) -> Any:
            return Gauge(
                name, doc, (*LABELS, "rank"), registry=registry,
                multiprocess_mode="livemostrecent",
            ).labels(*values, str(env.rank))  # fmt: skip

        self.rank_step = rank_gauge("phalanx_rank_step_seconds", "This rank's last step attempt.")
        self.rank_compute = rank_gauge(
            "phalanx_rank_compute_seconds",
            "This rank's compute in its last step, without waiting on other groups.",
        )
        self.straggler = rank_gauge(
            "phalanx_straggler",
            "1 while this rank's compute is persistently ft.straggler_factor times the other "
            "groups' (trainer/ft/straggler.py).",
        )
        self.straggler_ratio = rank_gauge(
            "phalanx_straggler_ratio",
            "This rank's median compute over the other groups' (ft.straggler_steps steps).",
        )

    def observe_step(self, r: StepReport) -> None:
        """Every step attempt: its time, quorum and outcome; a committed one's progress."""
        if not self.enabled:
            return
        if not r.finite:
            self.not_finite.inc()
        if r.diverged:
            self.divergences.inc()
        self.step_seconds.observe(r.seconds)
        if r.sync is not None:
            self._observe_sync(r.sync)
        self.participants.set(r.participants)
        if r.quorum_id is not None:
            self.quorum_id.set(r.quorum_id)
        if not r.committed:
            self.commit_failures.inc()
            return
        self.step.set(r.step)
        if r.loss is not None:  # None: healed in this step, its forward ran on stale parameters
            self.loss.set(r.loss)
        self.lr.set(r.lr)
        self.tokens.inc(r.tokens)
        self.items.inc(len(r.items))

    def _observe_sync(self, sync: SyncFigures) -> None:
        self.sync_steps.set(sync.every)
        self.sync_seconds.observe(sync.seconds)
        self.sync_bytes.inc(sync.bytes)
        if sync.pseudo_norm is not None:
            self.pseudo_norm.set(sync.pseudo_norm)
        if sync.items_lost:
            self.items_lost.inc(sync.items_lost)
        if sync.items_partly_lost:
            self.items_partly_lost.inc(sync.items_partly_lost)

    def observe_rank(
        self, seconds: float, compute_s: float | None, straggler: bool, ratio: float | None
    ) -> None:
        """Every rank, every step: its own times and straggler state."""
        self.rank_step.set(seconds)
        if compute_s is not None:
            self.rank_compute.set(compute_s)
            if self.enabled:
                self.compute_seconds.observe(compute_s)
        self.straggler.set(float(straggler))
        if ratio is not None:
            self.straggler_ratio.set(ratio)

    def observe_eval(self, step: int, loss: float) -> None:
        if self.enabled:
            self.eval_loss.set(loss)
            self.eval_step.set(step)

    def observe_heal(self, seconds: float) -> None:
        if self.enabled:
            self.heals.inc()
            self.heal_seconds.observe(seconds)

    def observe_join_timeouts(self, count: int) -> None:
        if self.enabled and count:
            self.join_timeouts.inc(count)

    def observe_checkpoint(self, step: int, blocked_s: float, total_s: float) -> None:
        if self.enabled:
            self.ckpt_blocked.observe(blocked_s)
            self.ckpt_save.observe(total_s)
            self.ckpt_last_step.set(step)

    def observe_checkpoint_failure(self) -> None:
        if self.enabled:
            self.ckpt_failures.inc()

    def observe_checkpoint_skipped(self) -> None:
        if self.enabled:
            self.ckpt_skipped.inc()
