"""A JSON schema for the ServiceMonitor in ops/k8s, a CRD the bundled Kubernetes schemas
do not cover: written from the prometheus-operator's published CRD
(monitoring.coreos.com/v1, operator 0.84), with metadata and the label selector checked
against the Kubernetes definitions (tests/integration/test_ops_k8s.py)."""

from __future__ import annotations

from typing import Any

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
