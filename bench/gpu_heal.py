"""`make gpu-check`'s heal rows: two replica groups of one rank on one device, one
group's rank SIGKILLed mid-run, healed two ways side by side:

* cold: the groups started by hand (the real torchft lighthouse, no daemon), the killed
  group launched again as a new process;
* warm: two `phalanx run` daemons on a real etcd with the demo's job file (its
  defaults), the killed rank replaced by its node's standby, which warmed its device
  while it waited (trainer/spares/device_warmup.py).

Reported: the healed group's heal and first commit after the kill, the survivor's
longest pause between commits after it, and whether both groups end with equal
parameters. Every step sleeps 0.05 s (``PHALANX_CHAOS_DELAY``, said in the output) so
that the kill lands mid-run. The groups exchange over gloo (``ft.backend``): NCCL
refuses two ranks of one communicator on one GPU. Runs on the CPU too (``--device
cpu``), which is how its code is checked on machines without a GPU:

    .venv/bin/python -m bench.gpu_heal --device cpu [--mode cold|warm|both]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.support.harness import ROOT, event_time, largest_step_gap, wait_for
from tests.support.rank_groups import cleanup, launch_group, start_lighthouse

CONFIG = ROOT / "examples" / "single.toml"
STEPS = 400
KILL_AT = 40  # the victim SIGKILLs itself in the forward of this attempt
DELAY = {"PHALANX_CHAOS_DELAY": "0.05"}  # steps of at least 50 ms: the kill lands mid-run


def measure(device: str) -> tuple[str, bool]:
    """One line for the table, and whether the heal happened with equal digests."""
    with tempfile.TemporaryDirectory(prefix="phalanx-gpu-heal-") as scratch:
        tmp = Path(scratch)
        lighthouse = start_lighthouse(tmp)
        sets = [f'parallel.device="{device}"', 'ft.backend="gloo"', f"train.steps={STEPS}"]
        common = {"num_groups": 2, "nproc": 1, "lighthouse": lighthouse.address}
        survivor = launch_group(CONFIG, tmp, group=0, overrides=sets, env=DELAY, **common)  # type: ignore[arg-type]
        chaos = {**DELAY, "PHALANX_CHAOS": f"forward@+{KILL_AT}:kill"}
        with cleanup(lighthouse, survivor):
            victim = launch_group(
                CONFIG,
                tmp,
                group=1,
                name="victim",
                overrides=sets,
                env=chaos,
                **common,  # type: ignore[arg-type]
            )
            victim.wait(300)
            killed_at = max(event_time(e) for e in victim.events())
            started = time.time()
            again = launch_group(
                CONFIG,
                tmp,
                group=1,
                name="again",
                overrides=sets,
                env=DELAY,
                **common,  # type: ignore[arg-type]
            )
            with cleanup(again):
                heal = wait_for(
                    lambda: again.events("heal_done"), 300, "the relaunched group to heal"
                )
                codes = again.wait(600) + survivor.wait(120)
        # Read before the scratch directory, which holds the logs, goes.
        healed = event_time(heal[0])
        pause = largest_step_gap(survivor.events(), killed_at)
        digests = {
            g.events("train_done")[0]["params_sha256"]
            for g in (survivor, again)
            if g.events("train_done")
        }
    equal = len(digests) == 1 and codes == [0, 0]
    line = (
        f"healed {healed - started:.2f} s after its cold start (process launched) ({healed - killed_at:.2f} s after "
        f"the kill); survivor's longest pause {pause:.2f} s; digests "
        f"{'equal' if equal else 'DIFFER or a group failed: exit codes ' + str(codes)}"
    )
    return line, equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--mode", default="both", choices=["cold", "warm", "both"])
    args = parser.parse_args(argv)
    print("pacing: every step sleeps 0.05 s (PHALANX_CHAOS_DELAY), so the kill lands mid-run")
    ok = True
    if args.mode in ("cold", "both"):
        line, healed = measure(args.device)
        print(f"cold: {line}")
        ok = ok and healed
    if args.mode in ("warm", "both"):
        from bench.gpu_heal_warm import measure_warm

        line, healed, _ = measure_warm(args.device)
        print(f"warm: {line}")
        ok = ok and healed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
