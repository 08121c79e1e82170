"""Every-step against DiLoCo across slow links (issue 55).

Three hosts, each a network namespace (``tests.support.netns``) holding one replica
group of one rank, their links to the bridge capped both ways with a token bucket
(``tc qdisc ... tbf rate 50mbit``; ``--rate`` changes it). The lighthouse runs with the
daemon's defaults for its settings (``[lighthouse]`` of the job file) in the machine's
own namespace, reached over the bridge. The ranks are launched as the daemon launches
them (the environment contract), without daemons: the link carries only the groups'
exchange, which is what is measured.

The same job (``examples/single.toml``'s model and synthetic corpus, every setting at
its default but ``train.steps`` and ``train.eval_every``) runs eight times in one
invocation: every step, DiLoCo (``ft.sync_steps`` 20), the same sending its
pseudo-gradients as bfloat16 (``ft.sync_bf16``) or as int8 (``ft.should_quantize``),
streaming DiLoCo (``ft.num_fragments`` 4: a quarter of the parameters every 5 steps),
and three times DiLoCo with one group's rank SIGKILLed in the job's seventh round's
eleventh step (step 130; not replaced), each group in turn. Printed and written as JSON: steps/s (from the
first step all three groups committed together to the last), the bytes that crossed
the three links over those steps (sampled every 0.1 s; the whole run's, with the heals
of groups that joined late, beside them), the evaluation loss at the last step (the
same fixed items in every mode: equal tokens at equal steps) against the corpus
entropy, the digests at the end, and for each kill each survivor's round whose sync
went on without the dead group against its other rounds' median (its first round,
which holds its start, left out). Nothing paces the ranks. Run as root:
``python -m bench.slow_link [--steps 200] [--rate 50mbit] [--out FILE] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from daemon.config.sections import LighthouseConfig
from daemon.leadership.lighthouse import lighthouse_argv, lighthouse_command
from tests.support.harness import ROOT, Event, Proc, event_time, start
from tests.support.netns import Host, Network
from tests.support.ports import free_port

CONFIG = ROOT / "examples" / "single.toml"
GROUPS = 3
SYNC_STEPS = 20
FRAGMENTS = 4  # the streaming run's: a quarter of the parameters every 5 steps
MODES: dict[str, list[str]] = {
    "every_step": [],
    "diloco": ['ft.semi_sync_method="diloco"', f"ft.sync_steps={SYNC_STEPS}"],
    "diloco_bf16": [
        'ft.semi_sync_method="diloco"',
        f"ft.sync_steps={SYNC_STEPS}",
        "ft.sync_bf16=true",
    ],
    "diloco_int8": [
        'ft.semi_sync_method="diloco"',
        f"ft.sync_steps={SYNC_STEPS}",
        "ft.should_quantize=true",
    ],
    "diloco_streaming": [
        'ft.semi_sync_method="diloco"',
        f"ft.sync_steps={SYNC_STEPS}",
        f"ft.num_fragments={FRAGMENTS}",
    ],
}


def cap(net: Network, host: Host, rate: str) -> None:
    """Both directions of `host`'s link: its own egress, and the bridge's toward it."""
    tbf = ["tbf", "rate", rate, "burst", "64kb", "latency", "100ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", host.veth, "root", *tbf], check=True)
    host_side = host.run(["tc", "qdisc", "add", "dev", "eth0", "root", *tbf])
    assert host_side.returncode == 0, host_side.stderr


def wire_bytes(hosts: list[Host]) -> int:
    """Bytes both ways over every host's link so far (the bridge side's counters)."""
    total = 0
    for h in hosts:
        for way in ("tx_bytes", "rx_bytes"):
            total += int(Path(f"/sys/class/net/{h.veth}/statistics/{way}").read_text())
    return total


class WireSamples:
    """`wire_bytes` every 0.1 s with the wall-clock time, in a thread, so that the bytes
    of a window of the run (the steps measured, not the start's heals) can be read."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts, self.samples = hosts, [(time.time(), wire_bytes(hosts))]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.1):
            self.samples.append((time.time(), wire_bytes(self.hosts)))

    def stop(self) -> int:
        """Stop; the bytes of the whole run."""
        self.done.set()
        self.thread.join()
        self.samples.append((time.time(), wire_bytes(self.hosts)))
        return self.samples[-1][1] - self.samples[0][1]

    def between(self, t0: float, t1: float) -> int:
        """The bytes from the last sample at or before t0 to the first at or after t1."""
        start = max((b for t, b in self.samples if t <= t0), default=self.samples[0][1])
        end = min((b for t, b in self.samples if t >= t1), default=self.samples[-1][1])
        return end - start


def start_lighthouse(net: Network, log_dir: Path) -> tuple[Proc, str]:
    port = free_port()
    argv = lighthouse_argv(lighthouse_command(), LighthouseConfig(), f"{net.gateway}:{port}", 1)
    proc = start(argv, log_dir, "lighthouse")
    time.sleep(1.0)
    return proc, f"http://{net.gateway}:{port}"


def launch(
    host: Host,
    group: int,
    lighthouse: str,
    overrides: list[str],
    log_dir: Path,
    env: dict[str, str],
) -> Proc:
    argv = [sys.executable, "-m", "trainer", "--config", str(CONFIG)]
    for o in overrides:
        argv += ["--set", o]
    rank_env = {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": host.address, "MASTER_PORT": str(free_port()),
        "REPLICA_GROUP_ID": str(group), "NUM_REPLICA_GROUPS": str(GROUPS),
        "TORCHFT_LIGHTHOUSE": lighthouse, "OMP_NUM_THREADS": "1",
        "PHALANX_ADVERTISE_HOST": host.address, "PHALANX_BIND_HOST": host.address,
        "GLOO_SOCKET_IFNAME": "eth0",  # as the daemon names the advertised address's
        **env,
    }  # fmt: skip
    return start(host.argv(argv), log_dir, f"{log_dir.name}-g{group}", rank_env)


def committed(events: list[Event]) -> list[Event]:
    return [e for e in events if e["event"] in ("train_step", "step_items")]


def run(
    net: Network, name: str, overrides: list[str], steps: int, root: Path, kill: int | None = None
) -> dict[str, Any]:
    """One run of the job on the three hosts; `kill`: the group whose rank dies."""
    log_dir = root / name
    log_dir.mkdir(parents=True)
    hosts = list(net.hosts.values())
    lighthouse, address = start_lighthouse(net, log_dir)
    settings = [*overrides, f"train.steps={steps}", f"train.eval_every={SYNC_STEPS * 5}"]
    wire_samples = WireSamples(hosts)
    procs = []
    for g, host in enumerate(hosts):
        # The job's step 130 (its seventh round's eleventh step), whenever the victim
        # joined: the groups have all trained together by then.
        chaos = {"PHALANX_CHAOS": f"forward@{6 * SYNC_STEPS + 10}"} if g == kill else {}
        procs.append(launch(host, g, address, settings, log_dir, chaos))
    try:
        codes = [p.wait(1800) for p in procs]
    finally:
        lighthouse.stop()
        wire = wire_samples.stop()
    alive = [g for g in range(GROUPS) if g != kill]
    assert all(codes[g] == 0 for g in alive), [p.tail() for p in procs]
    events = [p.events() for p in procs]
    survivors = [events[g] for g in alive]
    together = [[e for e in committed(ev) if e["participants"] == GROUPS] for ev in survivors]
    first = max(min(int(e["step"]) for e in t) for t in together) if all(together) else 0
    ends = [committed(ev) for ev in survivors]
    t0 = max(event_time(next(e for e in ev if int(e["step"]) == first)) for ev in ends)
    t1 = max(event_time(ev[-1]) for ev in ends)
    evals = [e for e in survivors[0] if e["event"] == "eval"]
    started = next(e for e in survivors[0] if e["event"] == "rank_started")
    done = [next(e for e in ev if e["event"] == "train_done") for ev in survivors]
    figures: dict[str, Any] = {
        "steps": steps,
        "measured_from_step": first,
        "steps_per_s": (steps - first) / (t1 - t0),
        "wire_bytes": wire,  # the whole run: its start's heals too
        "wire_bytes_per_step": wire_samples.between(t0, t1) / (steps - first),  # measured
        "eval_loss": {int(e["step"]): float(e["loss"]) for e in evals},
        "final_eval_loss": float(evals[-1]["loss"]),
        "entropy": float(started["entropy"]),
        "digests_equal": len({d["params_sha256"] for d in done}) == 1,
        "items_lost": sum(
            len(range(*e["items"])) for ev in events for e in ev if e["event"] == "items_lost"
        ),
    }
    if kill is not None:
        figures["killed_group"] = kill
        figures["survivor_round_s"] = {str(g): kill_round(events[g]) for g in alive}
        figures["pause"] = max(r["pause"] for r in figures["survivor_round_s"].values())
    return figures


def kill_round(events: list[Event]) -> dict[str, float]:
    """A survivor's rounds after its first (which holds its start): the one whose sync
    went on without the killed group (the first with fewer groups) against the rest."""
    rounds = [e for e in committed(events) if "step_seconds" in e][1:]
    hit = next(e for e in rounds if e["participants"] < GROUPS)
    rest = [float(e["step_seconds"]) for e in rounds if e is not hit]
    return {
        "kill_round": float(hit["step_seconds"]),
        "kill_round_step": int(hit["step"]),
        "median_other_rounds": statistics.median(rest),
        "pause": float(hit["step_seconds"]) - statistics.median(rest),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rate", default="50mbit")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the ranks' logs here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench.slow_link: run as root (network namespaces and tc)")
    print(f"links {args.rate} each way (tbf); nothing paces the ranks; {GROUPS} groups of one rank")
    root = args.keep or Path(tempfile.mkdtemp(prefix="slow-link-"))
    net = Network()
    try:
        for g in range(GROUPS):
            cap(net, net.add_host(f"g{g}"), args.rate)
        results = {name: run(net, name, o, args.steps, root) for name, o in MODES.items()}
        for g in range(GROUPS):  # each group's rank killed in turn, every ring position
            name = f"diloco_kill_g{g}"
            results[name] = run(net, name, MODES["diloco"], args.steps, root, kill=g)
    finally:
        net.close()
    every, dl, streaming = results["every_step"], results["diloco"], results["diloco_streaming"]
    summary = {
        "rate": args.rate,
        "sync_steps": SYNC_STEPS,
        "steps_per_s_ratio": dl["steps_per_s"] / every["steps_per_s"],
        "wire_bytes_ratio": dl["wire_bytes_per_step"] / every["wire_bytes_per_step"],
        "loss_ratio": dl["final_eval_loss"] / every["final_eval_loss"],
        "diloco_loss_over_entropy": dl["final_eval_loss"] / dl["entropy"],
        "every_step_loss_over_entropy": every["final_eval_loss"] / every["entropy"],
        "bf16_steps_per_s_ratio": results["diloco_bf16"]["steps_per_s"] / every["steps_per_s"],
        "bf16_wire_bytes_over_diloco": results["diloco_bf16"]["wire_bytes_per_step"]
        / dl["wire_bytes_per_step"],
        "bf16_loss_ratio": results["diloco_bf16"]["final_eval_loss"] / every["final_eval_loss"],
        "int8_steps_per_s_ratio": results["diloco_int8"]["steps_per_s"] / every["steps_per_s"],
        "int8_wire_bytes_over_diloco": results["diloco_int8"]["wire_bytes_per_step"]
        / dl["wire_bytes_per_step"],
        "int8_loss_ratio": results["diloco_int8"]["final_eval_loss"] / every["final_eval_loss"],
        "streaming_steps_per_s_ratio": streaming["steps_per_s"] / every["steps_per_s"],
        # a sync's bytes: per step times the steps between syncs
        "streaming_bytes_per_sync_over_diloco": streaming["wire_bytes_per_step"]
        * (SYNC_STEPS // FRAGMENTS)
        / (dl["wire_bytes_per_step"] * SYNC_STEPS),
        "streaming_loss_ratio": streaming["final_eval_loss"] / every["final_eval_loss"],
    }
    print("| run | steps/s | wire MB/step | final eval loss | digests equal |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['steps_per_s']:.2f} | {r['wire_bytes_per_step'] / 1e6:.3f} | "
            f"{r['final_eval_loss']:.4f} | {r['digests_equal']} |"
        )
    print(f"corpus entropy {every['entropy']:.4f} nats")
    for key, value in summary.items():
        print(f"{key}: {value if isinstance(value, str) else round(value, 4)}")
    for g in range(GROUPS):
        killed = results[f"diloco_kill_g{g}"]
        for survivor, r in killed["survivor_round_s"].items():
            print(
                f"group {g} killed: group {survivor}'s round that synced without it "
                f"{r['kill_round']:.3f} s against {r['median_other_rounds']:.3f} s (median of "
                f"its others): {r['pause']:.3f} s more; items lost {killed['items_lost']}"
            )
    summary["kill_pause_max_s"] = max(results[f"diloco_kill_g{g}"]["pause"] for g in range(GROUPS))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
