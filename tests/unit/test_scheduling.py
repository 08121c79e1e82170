"""trainer/scheduling.py: whether standbys may warm at idle priority, which also decides
when the daemon refills its standby pool (daemon/node_group.py). Each case runs in a
child process with its own capabilities and RLIMIT_NICE (setpriv and prlimit, from
util-linux)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The daemon asks the question too, so the module must keep it free of torch.
PROBE = (
    "import sys\n"
    "import daemon.node_group\n"
    "from trainer.scheduling import may_leave_idle\n"
    "assert 'torch' not in sys.modules\n"
    "print(may_leave_idle())\n"
)
DROP_CAP = ["setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice"]


def probe(prefix: list[str]) -> bool:
    out = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return out.stdout.strip() == "True"


def test_root_may_leave_idle_and_without_cap_sys_nice_or_rlimit_it_may_not() -> None:
    if os.geteuid() == 0:  # CI and the shipped units run the daemon as root
        assert probe([])
    assert not probe([*DROP_CAP, "prlimit", "--nice=0"])
