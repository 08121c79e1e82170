"""Pure logic of the coordination layer: spec hashing, messages, error mapping (no etcd)."""

from __future__ import annotations

import subprocess
import sys

import grpc  # type: ignore[import-untyped]
import pyetcd
import pytest

from daemon.coordination.coordinator import (
    CoordinationError,
    Coordinator,
    EtcdAccessDenied,
    EtcdSettings,
    EtcdUnavailable,
    SessionExpired,
    translate_error,
)
from daemon.coordination.job_view import differing_sections, mismatch_message, overall_spec_hash

SETTINGS = EtcdSettings(
    endpoints=["127.0.0.1:2379"], ca_file="/etc/ca.pem", user="u", password="p", timeout_s=5.0
)


class FakeRpcError(grpc.RpcError):  # type: ignore[misc]
    """What grpc raises: an RpcError with code() and details()."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def translate(code: grpc.StatusCode, details: str) -> CoordinationError:
    return translate_error(FakeRpcError(code, details), "127.0.0.1:2379", SETTINGS)


def test_spec_hash_is_order_independent_and_sensitive() -> None:
    a = overall_spec_hash({"model": "1", "train": "2"})
    assert a == overall_spec_hash({"train": "2", "model": "1"})
    assert a != overall_spec_hash({"model": "1", "train": "3"})


def test_differing_sections_includes_added_and_removed() -> None:
    old = {"model": "1", "train": "2", "data": "3"}
    new = {"model": "1", "train": "9", "checkpoint": "4"}
    assert differing_sections(old, new) == ["checkpoint", "data", "train"]


def test_mismatch_message_singular_and_plural() -> None:
    assert mismatch_message("demo", ["model"]) == (
        "job 'demo' is running with a different job file: section model differs; "
        "use the same file on every node or another job.name."
    )
    assert "sections model, train differ;" in mismatch_message("demo", ["model", "train"])


@pytest.mark.parametrize(
    ("code", "details", "kind", "phrase"),
    [
        (grpc.StatusCode.UNAVAILABLE, "failed to connect: ipv4:1.2.3.4:2379: Connection refused", EtcdUnavailable, "Connection refused"),
        (grpc.StatusCode.UNAVAILABLE, "ipv4:1: Handshake read failed (Endpoint closing)", EtcdUnavailable, "cannot reach"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", EtcdUnavailable, "did not answer within 5 s"),
        (grpc.StatusCode.UNKNOWN, "No status received", EtcdUnavailable, "cannot reach"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded", EtcdUnavailable, "NOSPACE alarm"),
        (grpc.StatusCode.UNAVAILABLE, "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate", EtcdAccessDenied, "not trusted by etcd.ca_file (/etc/ca.pem)"),
        (grpc.StatusCode.UNAVAILABLE, "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: SSLV3_ALERT_BAD_CERTIFICATE", EtcdAccessDenied, "client certificate"),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password", EtcdAccessDenied, "wrong etcd.user or etcd.password"),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty", EtcdAccessDenied, "set etcd.user and etcd.password"),
        (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied", EtcdAccessDenied, "user 'u' may not"),
        (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", EtcdUnavailable, "auth token"),
        (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found", SessionExpired, "ensure_session()"),
    ],
)  # fmt: skip
def test_grpc_errors_map_to_actionable_exceptions(
    code: grpc.StatusCode, details: str, kind: type[CoordinationError], phrase: str
) -> None:
    err = translate(code, details)
    assert isinstance(err, kind)
    assert phrase in str(err)
    assert str(err).endswith(".")


def test_pyetcd_wrapped_error_uses_the_grpc_context() -> None:
    """pyetcd raises its own exception inside ``except RpcError``: the details are in the context."""
    wrapped = pyetcd.exceptions.ConnectionFailedError()
    wrapped.__context__ = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x: Connection refused")
    err = translate_error(wrapped, "h:1", SETTINGS)
    assert isinstance(err, EtcdUnavailable) and "Connection refused" in str(err)


@pytest.mark.parametrize(
    ("settings", "phrase"),
    [
        (EtcdSettings(endpoints=[]), "set etcd.endpoints"),
        (EtcdSettings(endpoints=["no-port"]), "must be host:port"),
        (EtcdSettings(endpoints=["h:1"], user="u"), "go together"),
        (EtcdSettings(endpoints=["h:1"], cert_file="c.pem"), "go together"),
        (EtcdSettings(endpoints=["h:1"], timeout_s=5.0), r"below etcd.lease_ttl_s \(5\)"),
    ],
)
def test_bad_settings_are_reported_before_connecting(settings: EtcdSettings, phrase: str) -> None:
    with pytest.raises(CoordinationError, match=phrase):
        Coordinator(settings, "demo", "a", 5)


@pytest.mark.parametrize(("job", "node"), [("", "a"), ("a/b", "a"), ("demo", "x/y"), ("d", "..")])
def test_bad_names_are_rejected(job: str, node: str) -> None:
    with pytest.raises(CoordinationError, match="start with a letter or digit"):
        Coordinator(EtcdSettings(endpoints=["h:1"]), job, node, 5)


def test_lease_ttl_bounds_are_the_job_files() -> None:
    for ttl in (1, 301):
        with pytest.raises(CoordinationError, match=r"etcd.lease_ttl_s .* must be from 2 to 300"):
            Coordinator(EtcdSettings(endpoints=["h:1"], timeout_s=0.5), "demo", "a", ttl)


def test_unreadable_ca_file_is_a_clear_error() -> None:
    c = Coordinator(EtcdSettings(endpoints=["h:1"], ca_file="/nonexistent/ca.pem"), "demo", "a", 5)
    with pytest.raises(CoordinationError, match=r"cannot read etcd.ca_file '/nonexistent/ca.pem'"):
        c.connect()
    c.close()


def test_coordination_never_imports_torch() -> None:
    code = "import sys, daemon.coordination.coordinator, daemon.coordination.etcd_server; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
