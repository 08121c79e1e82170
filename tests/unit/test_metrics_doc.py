"""docs/metrics.md, the alert rules and the Grafana dashboard against what the code exports.

The exported metrics are not listed here: they are read from a node's /metrics
as the daemon renders it (:class:`daemon.surfaces.metrics.DaemonMetrics` over a minimal
stand-in for the supervisor), with a rank's :class:`trainer.metrics.TrainMetrics`
writing its multiprocess files from a separate process exactly as under the
daemon. A metric added to or renamed in the code without the doc (or the other
way round), or a rule or panel that queries a name the code does not export,
fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from daemon.coordination.job_view import JobView
from daemon.health import CheckResult, HealthReport
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import RanksReport, UpkeepReport
from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.surfaces.metrics import DaemonMetrics

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "ops" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "phalanx.json"

# A rank 0 that touches every metric, so each one has samples (and labels).
RANK_SCRIPT = textwrap.dedent(
    """
    from trainer.config.env import RankEnv
    from trainer.metrics import TrainMetrics
    from trainer.step_report import StepReport, SyncFigures

    m = TrainMetrics(RankEnv(rank=0, replica_group=1, job="doc-job", node="doc-node"))
    m.observe_step(StepReport(5, True, 1.5, 0.001, 0.5, 2, 7, 0.2, 4096, range(32, 48)))
    sync = SyncFigures(5, 0.1, 1024, pseudo_norm=0.7, items_lost=16, items_partly_lost=8)
    m.observe_step(StepReport(10, True, 1.4, 0.001, 0.5, 2, 9, 0.4, 4096, range(48, 64), sync=sync))
    m.observe_step(StepReport(6, False, 1.5, 0.001, 0.5, 1, 8, 0.2, 0, finite=False))
    m.observe_heal(0.5)
    m.observe_rank(0.2, 0.15, True, 2.5)
    m.observe_eval(5, 1.25)
    m.observe_checkpoint(5, 0.01, 0.3)
    m.observe_checkpoint_failure()
    m.observe_checkpoint_skipped()
    """
)
PROMQL_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
    | {"and", "or", "unless", "offset", "inf", "nan"}
)


@dataclass(frozen=True)
class Family:
    """One exported metric family, named as it appears in /metrics."""

    name: str
    type: str  # counter, gauge, histogram, info
    labels: frozenset[str]
    samples: frozenset[str]  # sample names: x_total, x_bucket, ...


def node_metrics_text(tmp: Path) -> str:
    """/metrics of a node whose daemon is leader with one rank that did everything once."""
    job = JobView(
        nodes={}, groups={0: "a", 1: "doc-node"}, leader="doc-node", lighthouse=None,
        checkpoint=None, state=None, spec=None,
    )  # fmt: skip
    checks = (CheckResult("checkpoint_dir", True, "writable"), CheckResult("clock", False, "off"))
    health = HealthReport(checks, at=0.0, failed_in_a_row=1)
    view = NodeView(health=health)
    view.restarts["rank_exit"] = 1
    ranks = RanksReport(
        pids=(os.getpid(),),
        hang_timeouts=MappingProxyType({"start": 300.0, "step": 35.0, "quorum": 300.0}),
        hang_learned=True,
        step_time_quantile_s=0.2,
        step_time_median_s=0.1,
    )
    # The forwarder has a target and, on this leader, the lighthouse process is alive.
    upkept = UpkeepReport(lighthouse_up=True, leader=True, slot=1, etcd_up=True, job=job)
    # The ranks' progress carries the node's time ledger (phalanx_activity_seconds_total).
    progress = RankProgress()
    status = NodeStatus.of(
        view,
        "doc-node",
        "doc-job",
        2,
        shared_fault=False,
        ranks=ranks,
        upkept=upkept,
        progress=progress,
    )
    metrics = DaemonMetrics(lambda: status, tmp / "metrics")  # wipes and creates the directory
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics")}
    subprocess.run([sys.executable, "-c", RANK_SCRIPT], cwd=ROOT, env=env, check=True, timeout=120)
    return metrics.render().decode()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Family]:
    text = node_metrics_text(tmp_path_factory.mktemp("metrics"))
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("phalanx_"):
            continue
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        # The text format has no info type: an Info is a gauge named *_info with value 1.
        kind = "info" if fam.type == "gauge" and name.endswith("_info") else fam.type
        samples = {s.name for s in fam.samples}
        if fam.type == "counter":
            samples.add(name)
        elif fam.type == "histogram":
            samples |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            samples.add(name)
        labels = {label for s in fam.samples for label in s.labels} - {"le"}
        out[name] = Family(name, kind, frozenset(labels), frozenset(samples))
    assert len(out) >= 20, f"expected the daemon's and a rank's metrics, got {sorted(out)}"
    return out


def sample_names(exported: dict[str, Family]) -> set[str]:
    return {s for f in exported.values() for s in f.samples}


def all_labels(exported: dict[str, Family]) -> set[str]:
    return {label for f in exported.values() for label in f.labels} | {"le"}


# ------------------------------------------------------------------ the doc


@dataclass(frozen=True)
class DocRow:
    name: str
    type: str
    labels: frozenset[str]
    unit: str
    meaning: str


def doc_rows() -> dict[str, DocRow]:
    """The metric tables of docs/metrics.md: | `name` | type | labels | unit | meaning |."""
    rows: dict[str, DocRow] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not re.fullmatch(r"`phalanx_[a-z0-9_]+`", cells[0]):
            continue
        name = cells[0].strip("`")
        assert name not in rows, f"{name} is listed twice in {DOC.name}"
        labels = frozenset(re.findall(r"`([a-z_]+)`", cells[2]))
        rows[name] = DocRow(name, cells[1], labels, cells[3], cells[4])
    return rows


def test_the_doc_lists_exactly_the_exported_metrics(exported: dict[str, Family]) -> None:
    documented = doc_rows()
    missing = sorted(set(exported) - set(documented))
    extra = sorted(set(documented) - set(exported))
    assert not missing, f"exported but not in {DOC.name}: {missing}"
    assert not extra, f"in {DOC.name} but not exported by the code: {extra}"


def test_the_doc_gives_each_metric_its_type_labels_unit_and_meaning(
    exported: dict[str, Family],
) -> None:
    for name, row in doc_rows().items():
        fam = exported.get(name)
        if fam is None:
            continue  # reported by the test above
        assert row.type == fam.type, f"{name}: documented as {row.type}, exported as {fam.type}"
        if fam.labels:
            assert row.labels == fam.labels, (
                f"{name}: documented labels {sorted(row.labels)}, exported {sorted(fam.labels)}"
            )
        assert row.unit and row.meaning, f"{name}: unit and meaning must not be empty"


def test_every_metric_name_the_doc_mentions_exists(exported: dict[str, Family]) -> None:
    known = sample_names(exported) | set(exported) | all_labels(exported) | rule_names()
    mentioned = set(re.findall(r"\bphalanx_[a-z0-9_:]*[a-z0-9_]", DOC.read_text()))
    assert not sorted(mentioned - known), f"{DOC.name} mentions unknown names"


# ------------------------------------------------------------------- PromQL


def strip_promql(expr: str) -> str:
    """The expression without strings, label matchers, grouping clauses and ranges."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    return re.sub(r"\boffset\s+\S+", " ", s)


def promql_metrics(expr: str) -> set[str]:
    """Metric names an expression selects (identifiers that are not functions or keywords)."""
    s = strip_promql(expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def promql_labels(expr: str) -> set[str]:
    """Label names an expression matches on or groups by."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = set()
    for matchers in re.findall(r"\{([^}]*)\}", s):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    for group in re.findall(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", s
    ):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    return labels


def test_the_promql_helpers_find_metrics_and_labels() -> None:
    expr = (
        'histogram_quantile(0.5, sum by (le, node) (rate(a_bucket{phalanx_job=~"$j"}'
        "[$__rate_interval]))) or on (phalanx_job) max(b:rule offset 5m) > bool 1 unless c"
    )
    assert promql_metrics(expr) == {"a_bucket", "b:rule", "c"}
    assert promql_labels(expr) == {"le", "node", "phalanx_job"}


# ------------------------------------------------------------------- alerts


def alert_rules() -> list[dict[str, Any]]:
    doc: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def rule_names() -> set[str]:
    """Recording rules alerts.yml defines, and the per-job overrides it reads."""
    names = set()
    for rule in alert_rules():
        if "record" in rule:
            names.add(rule["record"])
        names |= {n for n in promql_metrics(rule["expr"]) if n.endswith(":override")}
    return names


def test_alerts_use_only_exported_metrics_and_labels(exported: dict[str, Family]) -> None:
    known, labels = sample_names(exported) | rule_names(), all_labels(exported)
    for rule in alert_rules():
        what = rule.get("alert") or rule["record"]
        unknown = promql_metrics(rule["expr"]) - known
        assert not unknown, f"{what} queries {sorted(unknown)}, which the code does not export"
        bad = promql_labels(rule["expr"]) - labels
        assert not bad, f"{what} uses labels {sorted(bad)}, which the metrics do not carry"


def test_every_alert_has_for_severity_and_annotations() -> None:
    alerts = [r for r in alert_rules() if "alert" in r]
    assert len(alerts) >= 8
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"[0-9]+[smh]", str(rule.get("for", ""))), f"{name}: no `for:`"
        assert rule.get("labels", {}).get("severity") in {"critical", "warning"}, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    tests: dict[str, Any] = yaml.safe_load(ALERTS_TEST.read_text())
    assert tests["rule_files"] == [ALERTS.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    for rule in alert_rules():
        if "alert" in rule:
            assert rule["alert"] in fires, f"no test shows {rule['alert']} firing"
            assert rule["alert"] in quiet, f"no test shows {rule['alert']} not firing"


# ---------------------------------------------------------------- dashboard


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def dashboard_panels() -> list[dict[str, Any]]:
    out = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return [p for p in out if p["type"] != "row"]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard_panels() for t in p["targets"]]


def template_queries() -> dict[str, str]:
    out = {}
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out[var["name"]] = query["query"] if isinstance(query, dict) else query
    return out


def test_dashboard_queries_use_only_exported_metrics_and_labels(
    exported: dict[str, Family],
) -> None:
    known, labels = sample_names(exported), all_labels(exported)
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    for title, expr in exprs:
        unknown = promql_metrics(expr) - known
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}, not exported"
        bad = promql_labels(expr) - labels
        assert not bad, f"panel {title!r} uses labels {sorted(bad)}, not on the metrics"
    for name, query in template_queries().items():
        m = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?,\s*(\w+)\)", query)
        assert m, f"variable {name}: {query!r} is not label_values(metric{{...}}, label)"
        assert m.group(1) in known, f"variable {name} reads {m.group(1)}, not exported"
        assert m.group(3) in exported[m.group(1)].labels, f"variable {name}: no such label"


def without_grouping(expr: str) -> str:
    """The expression without by/on (...) clauses; label matchers stay."""
    return re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)


def test_dashboard_panels_filter_by_the_job_and_node_variables() -> None:
    for title, expr in dashboard_exprs():
        selectors = re.findall(r"\b(phalanx_[a-z0-9_]+)(\{[^}]*\})?", without_grouping(expr))
        assert selectors, f"panel {title!r} selects no phalanx metric"
        for metric, matchers in selectors:
            assert 'phalanx_job=~"$phalanx_job"' in matchers and 'node=~"$node"' in matchers, (
                f"panel {title!r}: {metric} is not filtered by $phalanx_job and $node"
            )


def test_dashboard_structure() -> None:
    doc = dashboard()
    assert doc["schemaVersion"] >= 38
    assert doc["uid"] and doc["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert set(template_queries()) == {"phalanx_job", "node"}
    assert "$phalanx_job" in template_queries()["node"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for panel in dashboard_panels():
        assert panel["datasource"] == ds, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == ds and target["refId"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
