"""One replica group whose ranks sit on two hosts (issue 37, its first step): the daemon's
rank environment for a seat (``daemon.ranks.spec.Seat``) numbers the group's ranks node
by node, as torchrun does, and points every node at the store of the group's first, so
the in-group layout spans the hosts. Here the ranks are started with that environment
directly; the daemons do not seat groups across nodes yet.

The two-host group must train exactly as the same group on one host: the same losses,
step by step, and the same parameters at the end.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from daemon.config import load_daemon_config
from daemon.ranks.spec import RANK_ARGV, GroupSpec, Seat, rank_env
from tests.support.multihost import NEEDS_NAMESPACES
from tests.support.netns import Host, Network
from tests.support.ports import free_port

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "daemon_job.toml"
STEPS = 30
LAYOUT = ["parallel.dp_shard=2", f"train.steps={STEPS}", "train.log_every=1"]


def run_group(tmp: Path, hosts: list[Host]) -> list[dict[str, object]]:
    """A group of one rank on each of `hosts` (the first hosts the store), no lighthouse;
    the events of its rank 0."""
    # The job file cannot say yet that a group spans nodes (its check wants node.nproc
    # to be the group's world size): each node's share, one rank, is set on the spec.
    cfg = load_daemon_config(JOB, ["node.nproc=2", *LAYOUT])
    tmp.mkdir(parents=True)
    config = tmp / "job.toml"
    config.write_text(JOB.read_text())
    port = free_port()
    procs = []
    for node_rank, host in enumerate(hosts):
        spec = dataclasses.replace(
            GroupSpec.for_node(cfg, 0, "", config),
            nproc=1,
            advertise_host=host.address,
            bind_host=host.address,
            run_dir=tmp / f"node-{node_rank}",
            metrics_dir=None,
            seat=Seat(node_rank, len(hosts), hosts[0].address),
        )
        (spec.run_dir / "heartbeat").mkdir(parents=True)  # the daemon's, made at its start
        env = rank_env(spec, 0, port, 1)
        env.pop("TORCHFT_LIGHTHOUSE")  # one group, no fault tolerance: the layout alone
        env["OMP_NUM_THREADS"] = "1"
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # the daemon, inside the host, finds it itself
        argv = [*RANK_ARGV, "--config", str(config)] + [f"--set={o}" for o in LAYOUT]
        with (tmp / f"rank-{node_rank}.out").open("wb") as out:
            procs.append(host.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    logs = [(tmp / f"rank-{r}.out").read_text() for r in range(len(hosts))]
    assert codes == [0] * len(hosts), logs[0][-3000:] + logs[-1][-3000:]
    return [json.loads(line) for line in logs[0].splitlines() if line.startswith("{")]


def test_a_group_whose_ranks_sit_on_two_hosts_trains_as_on_one(
    tmp_path: Path, network: Network
) -> None:
    a, b = network.add_host("a"), network.add_host("b")
    across = run_group(tmp_path / "across", [a, b])
    alone = run_group(tmp_path / "alone", [a, a])
    started = next(e for e in across if e["event"] == "rank_started")
    assert started["layout"]["dp_shard"] == 2  # type: ignore[index]

    def losses(events: list[dict[str, object]]) -> list[float]:
        return [float(str(e["loss"])) for e in events if e["event"] == "train_step"]

    def digest(events: list[dict[str, object]]) -> str:
        return str(next(e for e in events if e["event"] == "train_done")["params_sha256"])

    assert len(losses(across)) == STEPS
    assert losses(across) == losses(alone)
    assert digest(across) == digest(alone)
