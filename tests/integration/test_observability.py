"""The Prometheus rules and config in ops/prometheus and the dashboard in ops/grafana,
checked by promtool and against a real Prometheus scraping two real daemons.

The main test runs etcd, two `phalanx run` daemons with checkpointing on, and a
Prometheus on loopback that scrapes them every second and evaluates the repo's
alerts.yml; it kills a rank of node-b and then asks Prometheus's HTTP API
whether every dashboard query and every rule parses and has data, and whether
the restart, the heal and the dip of the quorum show where they should.

Needs `prometheus` and `promtool` (Debian: `apt-get install prometheus`, which
.ci/run does); the tests skip when they are not installed.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.harness import Daemon, start_daemon, wait_for
from tests.support.prometheus_harness import (
    ALERTS,
    JOB,
    PromError,
    Prometheus,
    dashboard_targets,
    finite_values,
    local_config,
    promtool,
    rule_exprs,
    running_prometheus,
    substitute,
    tool,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STATEFULSET = ROOT / "ops" / "k8s" / "statefulset.yaml"

# ----------------------------------------------------------------- promtool


def test_alert_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alert_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_prometheus_config_passes_promtool_check(tmp_path: Path) -> None:
    config = local_config(tmp_path)
    assert config["rule_files"] == [str(ALERTS)]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {"phalanx", "phalanx-pods"} <= set(jobs)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = promtool("check", "config", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "1 rule files found" in done.stdout


# --------------------------------------------------------------- live tests


def test_dashboard_and_alerts_on_a_live_pair_through_a_rank_failure(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    tool("prometheus")  # skip before starting anything
    overrides = [
        "train.steps=100000",  # outlasts the test; the daemons are stopped at the end
        f'checkpoint.dir="{tmp_path / "checkpoints"}"',
        "checkpoint.interval_steps=10",
        "train.eval_every=10",  # the Loss panel's evaluation series has data too
        # Node-b's group restarts this long after the kill. Node-a trains alone from when
        # the lighthouse drops node-b (its heartbeat timeout, 2 s in daemon_job.toml)
        # until node-b's new rank joins: about 3 s, a few scrapes (with 2 s it was
        # 0.8 s at times, and the scrapes missed it).
        "node.restart_backoff_s=5",
    ]
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=overrides)
    b = start_daemon(tmp_path, "node-b", [etcd_endpoint], overrides=overrides)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "phalanx",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{d.http_port}" for d in (a, b)]},
                ],
            }
        ],
    }
    try:
        with running_prometheus(tmp_path, config) as prom:
            began = time.time()
            check_live_pair(prom, a, b, began)
    finally:
        a.stop()
        b.stop()


def check_live_pair(prom: Prometheus, a: Daemon, b: Daemon, began: float) -> None:
    job = f'phalanx_job="{JOB}"'

    # Both groups train in one quorum of two, and Prometheus has scraped that for
    # a few seconds (the group that joined second healed once at startup).
    wait_for(
        lambda: (
            prom.by(f"min_over_time(phalanx_ft_participants{{{job}}}[3s]) == 2", "node").keys()
            == {"node-a", "node-b"}
        ),
        90,
        "Prometheus to see both groups in a quorum of two",
        interval=0.5,
    )
    heals_before = prom.by(f"phalanx_ft_heals_total{{{job}}}", "node")
    healed_before = len(b.events("heal_done"))  # node-b may have healed at startup
    victim = b.rank_pids()[0]
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    wait_for(
        lambda: len(b.events("heal_done")) > healed_before,
        60,
        "node-b's new rank to heal",
        interval=0.5,
    )
    try:
        wait_for(
            lambda: (
                prom.by(f"phalanx_ft_heals_total{{{job}}}", "node")["node-b"]
                > heals_before["node-b"]
                and prom.by(f"phalanx_ft_participants{{{job}}} == 2", "node").keys()
                == {"node-a", "node-b"}
            ),
            30,
            "Prometheus to see the heal and the quorum of two again",
            interval=0.5,
        )
    except AssertionError as e:
        state = {
            m: prom.query(f"{m}{{{job}}}")
            for m in ("phalanx_ft_heals_total", "phalanx_ft_participants")
        }
        raise AssertionError(f"{e}; Prometheus has {state}") from None

    # Every dashboard query parses and has data (the checkpoint panels need a
    # completed save: with checkpoint.interval_steps=10 that takes seconds).
    panels = [(title, substitute(expr)) for title, expr in dashboard_targets()]
    assert len(panels) >= 20

    def problem(expr: str) -> str | None:
        try:
            return None if finite_values(prom.query_range(expr, began)) else "no data"
        except PromError as e:
            return str(e)

    deadline = time.monotonic() + 30
    while True:
        problems = [f"{title}: {expr}: {p}" for title, expr in panels if (p := problem(expr))]
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not problems, "dashboard queries that fail or have no data:\n" + "\n".join(problems)

    # The template variables' label_values(...) find the job and both nodes.
    assert JOB in prom.api("/api/v1/label/phalanx_job/values", **{"match[]": "phalanx_node_info"})
    nodes = prom.api("/api/v1/label/node/values", **{"match[]": f"phalanx_node_info{{{job}}}"})
    assert set(nodes) == {"node-a", "node-b"}

    # The restart is node-b's alone, and so is the heal that followed it (either
    # group may have healed once at startup, joining the other).
    window = f"[{int(time.time() - began) + 5}s]"
    restarts = {
        (s["metric"]["node"], s["metric"]["reason"]): float(s["value"][1])
        for s in prom.query(f"increase(phalanx_group_restarts_total{{{job}}}{window})")
    }
    assert set(restarts) == {(n, r) for n in ("node-a", "node-b") for r in ("hang", "rank_exit")}
    assert restarts.pop(("node-b", "rank_exit")) > 0
    assert set(restarts.values()) == {0.0}, restarts
    since_kill = f"[{int(time.time() - killed)}s]"  # samples after the kill only
    heals = prom.by(f"increase(phalanx_ft_heals_total{{{job}}}{since_kill})", "node")
    assert heals["node-b"] > 0 and heals["node-a"] == 0, heals

    # Node-a's quorum dipped to one while node-b was away and came back to two:
    # its raw samples go 2 (at the kill) ... 1 ... 2.
    since = f"[{int(time.time() - killed) + 5}s]"
    (series,) = prom.query(f'phalanx_ft_participants{{{job},node="node-a"}}{since}')
    before = [int(float(v)) for t, v in series["values"] if t <= killed]
    after = [int(float(v)) for t, v in series["values"] if t > killed]
    assert before[-1:] == [2] and 1 in after, (before, after)
    assert 2 in after[after.index(1) :], (before, after)
    low = prom.by(f"min_over_time(phalanx_ft_participants{{{job}}}{since_kill})", "node")
    high = prom.by(f"max_over_time(phalanx_ft_participants{{{job}}}{since_kill})", "node")
    assert (low["node-a"], high["node-a"], high["node-b"]) == (1, 2, 2), (low, high)

    # Every rule expression parses, and Prometheus evaluates every rule without error.
    for name, expr in rule_exprs():
        try:
            prom.query(expr)
        except PromError as e:
            raise AssertionError(f"{name}: {e}") from None

    def rules() -> list[dict[str, Any]]:
        groups = prom.api("/api/v1/rules")["groups"]
        return [rule for g in groups for rule in g["rules"]]

    wait_for(lambda: all(r["health"] != "unknown" for r in rules()), 10, "every rule evaluated")
    errors = {r["name"]: r.get("lastError") for r in rules() if r["health"] != "ok"}
    assert not errors, errors
    assert len(rules()) == len(rule_exprs())

    # A group was missing from the quorum during the dip (pending), and no longer is
    # once it healed. One running group still meets job.min_replicas = 1, so the
    # below-minimum alert never went pending.
    pending = f'ALERTS{{alertname="PhalanxReplicaGroupMissing",alertstate="pending",{job}}}'
    assert finite_values(prom.query_range(pending, killed)), (
        "the missing-group alert never went pending"
    )
    wait_for(lambda: not prom.query(pending), 10, "the missing-group alert to resolve")
    below = f'ALERTS{{alertname="PhalanxQuorumBelowMinReplicas",{job}}}'
    assert not finite_values(prom.query_range(below, killed)), (
        "one running group meets min_replicas 1"
    )
    assert not prom.query('ALERTS{alertstate="firing"}')


def test_kubernetes_relabeling_scrapes_each_statefulset_pod_once(tmp_path: Path) -> None:
    """The phalanx-pods job of prometheus.yml on the targets Kubernetes discovery
    would produce for the StatefulSet's pods (and for pods it must leave alone)."""
    sts = yaml.safe_load(STATEFULSET.read_text())
    template = sts["spec"]["template"]
    annotations: dict[str, str] = template["metadata"]["annotations"]
    (container,) = template["spec"]["containers"]

    def pod(
        name: str,
        ip: str,
        labels: dict[str, str],
        annotations: dict[str, str],
        phase: str = "Running",
    ) -> list[dict[str, Any]]:
        """One target per container port, labelled as the pod role labels them."""
        meta = {
            "__meta_kubernetes_namespace": "phalanx",
            "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": phase,
        }
        for prefix, values in (("label", labels), ("annotation", annotations)):
            for key, value in values.items():
                meta[f"__meta_kubernetes_pod_{prefix}_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"] = value
        return [
            {
                "targets": [f"{ip}:{port['containerPort']}"],
                "labels": {
                    **meta,
                    "__meta_kubernetes_pod_container_port_name": port["name"],
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                },
            }
            for port in container["ports"]
        ]

    labels = template["metadata"]["labels"]
    # TEST-NET addresses: nothing answers, and only the discovered targets matter here.
    pods = [
        *pod("phalanx-0", "192.0.2.10", labels, annotations),
        *pod("phalanx-1", "192.0.2.11", labels, annotations),
        *pod("phalanx-2", "192.0.2.12", labels, annotations, phase="Failed"),
        *pod("phalanx-3", "192.0.2.13", labels, {}),
        *pod("etcd-0", "192.0.2.20", {"app.kubernetes.io/name": "etcd"}, annotations),
    ]
    config = local_config(tmp_path, pods)
    config["global"] = {"scrape_interval": "1m", "scrape_timeout": "1s"}
    config["scrape_configs"] = [
        j for j in config["scrape_configs"] if j["job_name"] == "phalanx-pods"
    ]
    with running_prometheus(tmp_path, config) as prom:
        found: dict[str, Any] = {}

        def discovered() -> bool:
            found.update(prom.api("/api/v1/targets", state="any"))
            return bool(found["activeTargets"]) and len(found["droppedTargets"]) >= 6

        wait_for(discovered, 20, "the pod targets to be discovered")
    active = sorted(
        (t["scrapeUrl"], t["labels"]["pod"], t["labels"]["namespace"], t["labels"]["job"])
        for t in found["activeTargets"]
    )
    port, path = annotations["prometheus.io/port"], annotations["prometheus.io/path"]
    assert active == [
        (f"http://192.0.2.10:{port}{path}", "phalanx-0", "phalanx", "phalanx-pods"),
        (f"http://192.0.2.11:{port}{path}", "phalanx-1", "phalanx", "phalanx-pods"),
    ]
