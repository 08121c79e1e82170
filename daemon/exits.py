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

The rank's codes are the ones ``trainer.exits`` defines (a torch-free module), read
here under the daemon's names.
"""

from __future__ import annotations

from trainer.exits import EXIT_BAD_INPUT as RANK_BAD_INPUT
from trainer.exits import EXIT_DRAINED as RANK_DRAINED
from trainer.exits import EXIT_NO_QUORUM as RANK_NO_QUORUM

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "RANK_BAD_INPUT",
    "RANK_DRAINED",
    "RANK_NO_QUORUM",
]
