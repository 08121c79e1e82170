"""Exit codes, in one place.

The daemon's own (``phalanx run``):

* ``EXIT_OK`` (0): training completed, or the node was drained.
* ``EXIT_FAILED`` (1): anything else that stopped the node, transient or not (a
  crash loop, a wait that timed out, an error nobody foresaw). systemd's
  ``Restart=on-failure`` and Kubernetes restart it.
* ``EXIT_BAD_INPUT`` (2): the input is wrong (job file, flags, credentials, a job
  file that differs from the running job's). Restarting cannot help, so the
  shipped unit lists it in ``RestartPreventExitStatus``. Nothing transient may
  ever produce it.

A rank's (``python -m trainer``), as the daemon reads them:

* ``RANK_BAD_INPUT`` (2): the trainer refused its input before training.
* ``RANK_NO_QUORUM`` (75, EX_TEMPFAIL): no quorum formed in ``ft.quorum_timeout_s``;
  the peers were late (still starting, or gone), which is waited out, not counted
  as a crash.
* ``RANK_DRAINED`` (143 = 128 + SIGTERM): the rank left the quorum after a SIGTERM.

``trainer.exits`` is the rank's side of the same list.
"""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

RANK_BAD_INPUT = 2
RANK_NO_QUORUM = 75
RANK_DRAINED = 128 + signal.SIGTERM
