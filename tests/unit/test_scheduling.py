"""trainer/spares/scheduling.py: whether standbys may warm at idle priority, which also decides
when the daemon refills its standby pool (daemon/ranks/node_group.py). Each case runs in a
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
    "import daemon.ranks.node_group\n"
    "from trainer.spares.scheduling import may_leave_idle\n"
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


GROUP_PROBE = (
    "from trainer.spares.scheduling import autogroup_nice, set_autogroup_nice\n"
    "before = autogroup_nice()\n"
    "lowered = set_autogroup_nice(19)\n"
    "low = autogroup_nice()\n"
    "restored = set_autogroup_nice(0 if before is None else before)\n"
    "print(before, lowered, low, restored, autogroup_nice())\n"
)


def test_a_standby_session_group_goes_to_nice_19_and_back() -> None:
    """A standby lowers its session group while it warms and puts it back as a rank; in a
    session of its own (as the daemon starts it) that touches nothing else."""
    out = subprocess.run(
        [sys.executable, "-c", GROUP_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    ).stdout.split()
    if not Path("/proc/self/autogroup").exists():  # a kernel built without autogroup
        assert out == ["None", "False", "None", "False", "None"]
        return
    assert out == ["0", "True", "19", "True", "0"]
