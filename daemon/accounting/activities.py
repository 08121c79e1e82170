"""What a node's time goes to: each second of a daemon's life is one of these.

``TRAINING`` is goodput: the time of steps the job committed and kept. Every other
activity is badput, named for its cause. A daemon's seconds times its ranks
(``node.nproc``) are its accelerators' seconds, so the same split holds for GPU time.
docs/metrics.md says what each one covers and how the job's goodput follows.
"""

from __future__ import annotations

from enum import StrEnum


class Activity(StrEnum):
    TRAINING = "training"  # steps that committed (and were not redone later)
    # Steps thrown away: skipped (no commit), abandoned, cut short by a failure, and steps
    # trained again after a cold restart (the job had reached them before).
    DISCARDED = "discarded"
    QUORUM = "quorum"  # the ranks waited for a quorum to form
    HEALING = "healing"  # the ranks took a peer's state (a live heal)
    # The ranks being stopped, the restart backoff, and new ranks starting (spawn, build,
    # checkpoint load) until their first step ends; a node's first start counts here too.
    RESTARTING = "restarting"
    CHECKPOINT = "checkpoint"  # the step loop blocked on a checkpoint save
    EVALUATING = "evaluating"  # the step loop ran train.eval_every's evaluation
    # Joining, claiming a seat, waiting for a lighthouse or job.min_replicas groups, or
    # held back by a failed health check.
    WAITING = "waiting"
    SPARE = "spare"  # every seat held: this node waits, idle, to take one
    FENCED = "fenced"  # the ranks are paused until etcd says what they may keep
    DRAINING = "draining"  # SIGTERM or the job's end: the ranks leave


ORDER: tuple[Activity, ...] = tuple(Activity)
INDEX: dict[Activity, int] = {a: i for i, a in enumerate(ORDER)}
