"""How the failover benches run their ranks: unpaced, as users run them (issue 49)."""

from __future__ import annotations

# start_daemon's env: the ranks sleep nothing at each step (the tests pace theirs).
UNPACED = {"PHALANX_CHAOS_DELAY": "0"}
# The first line of each bench's output, so a figure never hides its pacing.
PACING_LINE = "pacing: none (PHALANX_CHAOS_DELAY=0); every setting at its default"
