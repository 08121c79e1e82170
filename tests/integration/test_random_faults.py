"""Issue 38: random faults in the suite. Three daemons on three network-namespace hosts
(etcd on a fourth) train while a seeded schedule injects at least one fault of each
kind (tests/support/faults.py); after each the job must be whole again. Afterwards every
node exits 0 with the same params_sha256, no committed step was lost, no job-wide pause
outlasted its fault's bound, every log line is structured and nothing is left running.

The seed is random unless PHALANX_FAULT_SEED is set; the schedule and the command that
replays it are printed first. PHALANX_FAULTS (default 11: one of each kind) and
PHALANX_FAULT_STEPS size a longer run: ``make soak`` is 100 faults.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.support.accounting_checks import (
    goodput_by_life,
    incident_problems,
    ledger_goodput,
    life,
    log_goodput,
    unaccounted,
)
from tests.support.fault_checks import (
    healed_from_losing_side,
    left_running,
    long_pauses,
    longest_pause,
    lost_steps,
    timeline,
    unstructured_lines,
)
from tests.support.faults import INJECT, KINDS, NODES, Cluster, schedule
from tests.support.harness import wait_for
from tests.support.job_queries import digest, incidents_json
from tests.support.multihost import NEEDS_NAMESPACES
from tests.support.netns import Network

# Alone: its pause bounds are timings, kept from a second xdist worker's load.
pytestmark = [pytest.mark.integration, pytest.mark.alone, NEEDS_NAMESPACES]

COUNT = int(os.environ.get("PHALANX_FAULTS", str(len(KINDS))))
# The eleven faults were over by step 509-669 in four seeds (11, 222, 3333 and one at
# 2370638) here; a faster machine went past step 900 before the sixth (seed 495583), so
# the job is slowed while ahead of its share (Cluster.keep_up). The steps after the last
# fault only end the job for the digests, unpaced.
STEPS = int(os.environ.get("PHALANX_FAULT_STEPS", "1050"))
MARGIN_STEPS = 150  # a fault is injected only while this many steps are left


@pytest.mark.timeout(int(os.environ.get("PHALANX_FAULT_TIMEOUT", "900")))
def test_random_faults_keep_every_promise(tmp_path: Path, network: Network) -> None:
    seed = int(os.environ.get("PHALANX_FAULT_SEED") or random.SystemRandom().randrange(10**6))
    faults = schedule(seed, COUNT)
    replay = (
        f"PHALANX_FAULT_SEED={seed} PHALANX_FAULTS={COUNT} PHALANX_FAULT_STEPS={STEPS} "
        ".venv/bin/python -m pytest -s tests/integration/test_random_faults.py"
    )
    print(f"\nseed {seed}: {', '.join(f.line() for f in faults)}\nreplay: {replay}")
    c = Cluster(tmp_path, network, STEPS)
    try:
        start = time.time()
        c.wait_whole(0.0)
        for n, f in enumerate(faults):
            assert c.step() < STEPS - MARGIN_STEPS, (
                f"the job reached step {c.step()} of {STEPS} before fault {n + 1} of "
                f"{len(faults)}: raise PHALANX_FAULT_STEPS ({replay})"
            )
            pace = c.keep_up(n, len(faults), STEPS - MARGIN_STEPS)
            at_step = c.step()
            f.started = time.time()
            INJECT[f.kind](c, f)
            f.injected = time.time()
            c.wait_whole(f.injected)
            f.whole = time.time()
            print(
                f"{n + 1:3d} step {at_step:5d} {f.line():28s} whole after "
                f"{f.whole - f.started:5.1f}s, longest "
                f"pause {longest_pause(c, f):5.1f}s, paced {pace:.2f}s {f.note}"
            )
        for d in c.every_life():
            d.hurry()  # every fault was seen through: the job's last steps at full speed
        for node in NODES:
            assert c.daemon(node).wait(600) == 0, c.daemon(node).proc.tail()
        etcd = (c.etcd.pid,) if c.etcd is not None else ()
        wait_for(lambda: not left_running(tmp_path, etcd), 30, "nothing but etcd left running")
        digests = {node: digest(c.daemon(node)) for node in NODES}
        assert len(set(digests.values())) == 1, digests
        lost, pauses = lost_steps(c, faults), long_pauses(c, faults, start)
        assert not lost, f"committed steps lost ({replay}): {[str(x) for x in lost[:8]]}\n" + (
            timeline(c, lost[0].t) if lost else ""
        )
        taken = healed_from_losing_side(c, faults)
        assert not taken, f"a partition's losing side won ({replay}): {taken}"
        assert not pauses, f"pauses beyond their bounds ({replay}): {pauses}"
        assert not unstructured_lines(c), unstructured_lines(c)[:10]
        # Issue 54: each daemon that exited accounted for its whole life, and the job's
        # goodput from those accounts agrees with the ranks' step events.
        exited = [x for x in map(life, c.every_life()) if x is not None]
        assert len(exited) >= len(NODES), [d.proc.stderr.name for d in c.every_life()]
        assert not unaccounted(exited), unaccounted(exited)
        counted, logged = ledger_goodput(exited), log_goodput(c.lives, exited)
        print(f"goodput: {counted:.4f} from the daemons' accounts, {logged:.4f} from the logs")
        assert abs(counted - logged) <= 0.02, (counted, logged, goodput_by_life(c.lives, exited))
        # Every fault is exactly one incident of its kind in the job's record, and no
        # incident is without a fault (each fault was over for every node before the next:
        # Cluster.wait_whole).
        record = incidents_json(c.endpoint)["incidents"]
        for incident in record:
            print(f"incident {incident}")
        problems = incident_problems(faults, record)
        assert not problems, f"incidents against the faults ({replay}): {problems}"
    finally:
        c.close()
