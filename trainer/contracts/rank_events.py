"""The names of the events a rank logs that its daemon reads (``daemon.node_state.progress``, the
standby handshake, ``phalanx demo``): the trainer logs them under these names, the
daemon matches these names; each is spelled here only (tests/unit/test_rank_contracts.py).
Every other event a rank logs is relayed to the daemon's log as it is. Torch-free."""

from __future__ import annotations

import json
from typing import Any

TRAIN_STEP = "train_step"  # a committed step, logged (every train.log_every)
STEP_ITEMS = "step_items"  # a committed step that train.log_every leaves out
HEAL_DONE = "heal_done"
TRAIN_DONE = "train_done"
TRAIN_STOPPED = "train_stopped"  # a drained group's ranks leave after their last save
RANK_STARTED = "rank_started"
RANK_FAILED = "rank_failed"
BAD_INPUT = "bad_input"
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_INVALID = "checkpoint_invalid"
STRAGGLER = "straggler"
STRAGGLER_CLEARED = "straggler_cleared"
STANDBY_READY = "standby_ready"  # a standby has imported and built what it can
STEP_SKIPPED = "step_skipped"  # a step that did not commit (retried with the same data)
STEP_ABANDONED = "step_abandoned"  # a drain left a step whose quorum did not form
ITEMS_LOST = "items_lost"  # diloco: a share of a round no group of its sync trained
ITEMS_PARTLY_LOST = "items_partly_lost"  # streaming diloco: a share one fragment never saw
CHECKPOINT_LOADED = "checkpoint_loaded"  # every rank, with the step it resumed from
CHECKPOINT_FAILED = "checkpoint_failed"  # a save failed (training goes on)
STEP_NOT_FINITE = "step_not_finite"  # a step voted down for a NaN or infinite value
REPLICAS_DIVERGED = "replicas_diverged"  # the groups' parameters differed

# Fields of a step's end (train_step, step_items, step_skipped): where the loop's time went
# (daemon.accounting), only when there is something to say (trainer.step_log.StepLogger): the
# rank's first step, a quorum wait, a save or an evaluation; train_step always has its
# step's seconds.
STEP_SECONDS = "step_seconds"  # the step attempt, from its start to its end
QUORUM_S = "quorum_s"  # of the step: waiting for its quorum to form (a heal in it included)
CHECKPOINT_S = "checkpoint_s"  # the loop blocked on a checkpoint save after the last step
EVAL_S = "eval_s"  # the loop ran an evaluation after the last step


def event_of(line: str) -> dict[str, Any] | None:
    """The event a line of a rank's output holds (a JSON object with an ``event``), or
    None. A rank writes each event as one line, in one write; torchft's Rust logger
    writes its time stamp and the rest of its line in two, so an event can land between
    them, after a time stamp: it is read from its first brace."""
    start = line.find('{"')
    if start < 0:
        return None
    try:
        parsed = json.loads(line[start:])
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and "event" in parsed else None
