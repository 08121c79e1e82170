"""A rank's exit codes, the contract with whatever started it (Phalanx's daemon reads
them as ``daemon.exits`` lists them; torchrun reads any non-zero code as a failure).

* ``EXIT_OK`` (0): trained to ``train.steps``.
* ``EXIT_FAILED`` (1): any other failure.
* ``EXIT_BAD_INPUT`` (2): the job file, the overrides or the data were refused.
* ``EXIT_NO_QUORUM`` (75, sysexits' EX_TEMPFAIL): no quorum formed within
  ``ft.quorum_timeout_s``: the peers this group waits for did not join in time.
  Nothing is wrong with this rank; starting it again once they are there helps. In a
  group that spans nodes, also its group's store on another node out of reach, or a
  gloo link to another rank failed (a split inside the group, or that node gone): the
  same wait, not a crash.
* ``EXIT_DRAINED`` (143 = 128 + SIGTERM): the rank left the quorum after a SIGTERM.

Torch-free: ``python -m trainer`` imports it before validating its input.
"""

from __future__ import annotations

import signal

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_QUORUM = 75
EXIT_DRAINED = 128 + signal.SIGTERM


class NoQuorum(TimeoutError):
    """The lighthouse gave this group no quorum within ``ft.quorum_timeout_s``."""
