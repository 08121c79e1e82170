"""Deprecated: the workload API moved to :mod:`trainer.workloads` (0.2.0).

``from trainer.workload import Workload, WorkloadContext`` keeps working for one release,
with a DeprecationWarning naming the new module; it is removed in 0.3.0. Every name this
module had is still here, as the same object as in :mod:`trainer.workloads`.
"""

from __future__ import annotations

import warnings

from trainer.workloads import *  # noqa: F403  (the same names, the same objects)
from trainer.workloads import __all__ as __all__

warnings.warn(
    "trainer.workload is deprecated and will be removed in Phalanx 0.3.0: import the "
    "workload API from trainer.workloads instead (same names)",
    DeprecationWarning,
    stacklevel=2,
)
