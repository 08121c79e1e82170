"""The checkpoint layout on disk: ``<checkpoint.dir>/<job>/run-<id>/step-<N>/``, with
``COMPLETE.json`` (the completion marker) and ``train_state.json`` (the scalars) in each
step. The ranks write it (trainer/checkpoint/); the daemon's health probe reads the
markers to size the next save (daemon/health/probes.py), and its incident record tells a
partial checkpoint from a corrupt one (daemon/accounting/incident_events.py)."""

from __future__ import annotations

MARKER = "COMPLETE.json"
SCALARS = "train_state.json"
RUN_PREFIX = "run-"
STEP_PREFIX = "step-"
STEPS_GLOB = f"{RUN_PREFIX}*/{STEP_PREFIX}*"  # under a job's directory
MARKERS_GLOB = f"{STEPS_GLOB}/{MARKER}"
# A ``checkpoint_invalid`` event's reason for a step directory without its marker: a save
# cut short (by a kill, whose own failure the daemon recorded) or still being written.
NO_MARKER = "no completion marker (a save that never finished)"
