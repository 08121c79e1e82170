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

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import Daemon, free_port, start_daemon, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "ops" / "prometheus"
ALERTS = PROM_DIR / "alerts.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "phalanx.json"
STATEFULSET = ROOT / "ops" / "k8s" / "statefulset.yaml"
JOB = "itest"  # job.name of tests/integration/daemon_job.toml

# Grafana's variables as a dashboard user would have them for this run.
GRAFANA_VARS = {
    "$phalanx_job": JOB,
    "$node": ".+",
    "$__rate_interval": "15s",
    "$__range": "5m",
    "$__interval": "1s",
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` is not installed (Debian: apt-get install prometheus; .ci/run does)")
    return path


def promtool(*args: str, cwd: Path = PROM_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


# ----------------------------------------------------------------- promtool


def test_alert_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alert_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def kubernetes_sd_supported() -> bool:
    """Debian builds Prometheus without Kubernetes discovery (its client library is not packaged)."""
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / "probe.yml"
        probe.write_text(
            "scrape_configs:\n  - job_name: k\n    kubernetes_sd_configs:\n      - role: pod\n"
        )
        done = promtool("check", "config", str(probe), cwd=Path(d))
    return "field kubernetes_sd_configs not found" not in done.stdout + done.stderr


def local_config(tmp_path: Path, pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """ops/prometheus/prometheus.yml with absolute rule paths; Kubernetes discovery
    swapped for a file of equivalent targets where this Prometheus lacks it."""
    config: dict[str, Any] = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["rule_files"] = [str(PROM_DIR / f) for f in config["rule_files"]]
    if pods is not None or not kubernetes_sd_supported():
        targets = tmp_path / "pods.json"
        targets.write_text(json.dumps(pods or []))
        for job in config["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
    return config


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


# --------------------------------------------------------------- Prometheus


class PromError(Exception):
    """Prometheus answered an API call with an error (a query that does not parse, ...)."""


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
                doc: dict[str, Any] = json.loads(r.read())
        except urllib.error.HTTPError as e:
            doc = json.loads(e.read())
        if doc.get("status") != "success":
            raise PromError(f"{path} {params}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("/api/v1/query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, step: float = 1.0) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api(
            "/api/v1/query_range", query=expr, start=start, end=time.time(), step=step
        )["result"]
        return result

    def by(self, expr: str, label: str) -> dict[str, float]:
        """An instant query's values keyed by one label."""
        return {s["metric"].get(label, ""): float(s["value"][1]) for s in self.query(expr)}

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


@contextlib.contextmanager
def running_prometheus(tmp_path: Path, config: dict[str, Any]) -> Iterator[Prometheus]:
    """A Prometheus on 127.0.0.1 (only) with its data in tmp_path; stopped on exit."""
    binary = tool("prometheus")
    work = tmp_path / "prometheus"
    work.mkdir()
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = work / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=work,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"prometheus exited:\n{prom.tail()}"
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(ready, 30, "prometheus to be ready")
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def finite_values(series: list[dict[str, Any]]) -> list[float]:
    return [
        float(v)
        for s in series
        for _, v in s.get("values", [s.get("value", [0, "NaN"])])
        if math.isfinite(float(v))
    ]


# ----------------------------------------------------------- the dashboard


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows' nested panels included."""
    doc = json.loads(DASHBOARD.read_text())
    panels: list[dict[str, Any]] = []
    for panel in doc["panels"]:
        panels += [panel, *panel.get("panels", [])]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    for var in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, GRAFANA_VARS[var])
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    ]


# --------------------------------------------------------------- live tests


def test_dashboard_and_alerts_on_a_live_pair_through_a_rank_failure(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    tool("prometheus")  # skip before starting anything
    overrides = [
        "train.steps=100000",  # outlasts the test; the daemons are stopped at the end
        f'checkpoint.dir="{tmp_path / "checkpoints"}"',
        "checkpoint.interval_steps=10",
        # Node-a trains alone for at least this long after the kill: a few scrapes.
        "node.restart_backoff_s=2",
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
    victim = b.rank_pids()[0]
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    wait_for(lambda: b.events("heal_done"), 60, "node-b's new rank to heal", interval=0.5)
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
