"""The Kubernetes manifests in ops/k8s, loaded, and every disagreement between them and
the job file they carry, as sentences (:func:`consistency_problems`)."""

from __future__ import annotations

import itertools
import math
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from daemon.config import DaemonConfig
from daemon.coordination.leader_lease import DEFAULT_LEADER_TTL_S
from trainer.config import validate

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "ops" / "k8s"

Doc = dict[str, Any]
Manifests = dict[str, list[Doc]]


# --------------------------------------------------------------------------- loading


def load_manifests() -> Manifests:
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
    }


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


def quantity(value: str | int) -> int:
    """A Kubernetes byte quantity (``512Mi``, ``20Gi``, ``8589934592``) in bytes."""
    text = str(value)
    for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti"), start=1):
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) << (10 * power)
    return int(text)


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

    # Identity: node id, advertised name and bound address from the downward API.
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    check(env.get("POD_NAME") == "metadata.name", "POD_NAME is not the pod name")
    check(env.get("POD_NAMESPACE") == "metadata.namespace", "POD_NAMESPACE is not the namespace")
    args: list[str] = c["args"]
    check(args[:1] == ["run"] and "--node-id" in args, "args do not run with --node-id")
    if "--node-id" in args:
        check(args[args.index("--node-id") + 1] == "$(POD_NAME)", "--node-id is not $(POD_NAME)")
    host = f"node.advertise_host=$(POD_NAME).{svc['metadata']['name']}.$(POD_NAMESPACE).svc"
    check(any(a == "--set" and b == host for a, b in itertools.pairwise(args)), host)
    # Listeners: bound to the pod's address, given by the downward API (not resolved).
    check(env.get("POD_IP") == "status.podIP", "POD_IP is not the pod's address")
    bind = "node.bind_host=$(POD_IP)"
    check(any(a == "--set" and b == bind for a, b in itertools.pairwise(args)), bind)

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
    problems.extend(policy_problems(m, labels, http_port))
    return problems


def policy_problems(m: Manifests, pod_labels: dict[str, str], http_port: int) -> list[str]:
    """The NetworkPolicies: only the job's pods reach the trainer pods (Prometheus only on
    the HTTP port), and only the trainer pods and the members reach etcd."""
    problems: list[str] = []
    pol = find(m, "NetworkPolicy", "phalanx")["spec"]
    if not selects(pol["podSelector"]["matchLabels"], pod_labels) or pol["policyTypes"] != [
        "Ingress"
    ]:
        problems.append("the trainer NetworkPolicy does not govern the trainer pods' ingress")
    for rule in pol["ingress"]:
        peers = rule.get("from", [])
        if not peers:
            problems.append("a trainer NetworkPolicy rule admits everyone")
        for peer in peers:
            own = "namespaceSelector" not in peer and selects(
                peer.get("podSelector", {}).get("matchLabels", {}), pod_labels
            )
            ports = [p.get("port") for p in rule.get("ports", [])]
            if not own and ports != [http_port]:
                problems.append(
                    f"a trainer NetworkPolicy rule admits others on {ports or 'all ports'}"
                )
    etcd = find(m, "NetworkPolicy", "phalanx-etcd")["spec"]
    members = find(m, "StatefulSet", "phalanx-etcd")["spec"]["template"]["metadata"]["labels"]
    if not selects(etcd["podSelector"]["matchLabels"], members):
        problems.append("the etcd NetworkPolicy does not govern the etcd pods")
    clients = [
        r
        for r in etcd["ingress"]
        for peer in r.get("from", [])
        if selects(peer.get("podSelector", {}).get("matchLabels", {}), pod_labels)
    ]
    if [p.get("port") for r in clients for p in r.get("ports", [])] != [2379]:
        problems.append("the trainer pods may not reach etcd's client port (only)")
    if any(not r.get("from") for r in etcd["ingress"]):
        problems.append("an etcd NetworkPolicy rule admits everyone")
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
    problems.extend(etcd_size_problems(sts, flags))
    problems.extend(etcd_timing_problems(flags))
    metrics = url_port(flags.get("listen-metrics-urls", ":0"))
    for probe in ("livenessProbe", "readinessProbe"):
        port = container_port(c, c[probe]["httpGet"]["port"])
        if port != metrics:
            problems.append(f"etcd {probe} port {port} != metrics port {metrics}")
    return problems


def etcd_timing_problems(flags: dict[str, str]) -> list[str]:
    """etcd grants Phalanx's default leader lease: its shortest lease is 1.5 election
    timeouts, in whole heartbeats, rounded up to a second (etcd's ``minTTL``)."""
    heartbeat = int(flags.get("heartbeat-interval", "100"))
    election = int(flags.get("election-timeout", "1000"))
    shortest = math.ceil((3 * (election // heartbeat) // 2) * heartbeat / 1000)
    if shortest > DEFAULT_LEADER_TTL_S:
        return [
            f"etcd's shortest lease is {shortest} s with --election-timeout={election}: "
            f"the {DEFAULT_LEADER_TTL_S} s leader lease needs 750 ms or less"
        ]
    return []


def etcd_size_problems(sts: Doc, flags: dict[str, str]) -> list[str]:
    """History compacted, a quota set, and a memory limit and volume that hold the quota
    (the database is mapped into memory; a defrag writes a copy of it next to it)."""
    problems: list[str] = []
    if flags.get("auto-compaction-retention", "0") == "0":
        problems.append("etcd runs without --auto-compaction-retention")
    quota = int(flags.get("quota-backend-bytes", "0"))
    if not 0 < quota <= 8 << 30:
        problems.append(f"--quota-backend-bytes={quota} is not set within 8 GiB (etcd's maximum)")
    memory = quantity(container(sts)["resources"]["limits"]["memory"])
    if memory < quota:
        problems.append(f"the etcd memory limit {memory} is below the backend quota {quota}")
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    if quantity(claim) < 2 * quota:
        problems.append(f"the etcd volume ({claim}) cannot hold the backend quota twice (defrag)")
    return problems
