"""Prometheus for the observability tests: promtool, a real Prometheus on loopback,
and the queries of the shipped dashboard and alert rules."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
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

from tests.support.harness import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "ops" / "prometheus"
ALERTS = PROM_DIR / "alerts.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "phalanx.json"
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
