"""The etcd client underneath the coordination layer: settings, errors, connection.

Failures. Every request carries a ``timeout_s`` deadline. gRPC and pyetcd
errors are mapped to :class:`CoordinationError` subclasses in one place
(:func:`translate_error`): :class:`EtcdUnavailable` is transient (retry with
backoff), :class:`EtcdAccessDenied` is a configuration problem (wrong password,
untrusted certificate, missing permission). After a transient failure the
pyetcd client and its gRPC channel are discarded and the next request builds
fresh ones (round-robin over the endpoints): pyetcd otherwise marks a failed
endpoint unusable for minutes, and a fresh channel also re-authenticates, which
an etcd restart requires (its auth tokens do not survive a restart).

Sessions. A node's claims are bound to one etcd lease, kept alive over one
long-lived stream on a connection of its own, so a slow call elsewhere never
starves it (``daemon.coordination.keepalive``).

Waiting. gRPC's Python streams wait for each message in slices of
``grpc._common.MAXIMUM_WAIT_TIMEOUT`` (0.1 s), so that a main thread blocked on one
still runs its signal handlers. The daemon reads its streams (the job watch, the
keepalive answers) from threads of their own, where those slices only woke each
reader ten times a second for nothing: with three streams, a tenth of the daemon's
CPU beside busy ranks (issue 52). :func:`_wait_longer` makes the slice a second; a
message still wakes its reader at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]  # no stubs; not in the mypy overrides
import grpc._common  # type: ignore[import-untyped]
import pyetcd

from daemon.config.etcd_settings import check_etcd_settings, split_endpoint

T = TypeVar("T")

STREAM_WAIT_SLICE_S = 1.0


def _wait_longer() -> None:
    """Wait for stream messages in one-second slices (module docstring, "Waiting"); a gRPC
    without the setting keeps its own."""
    if isinstance(getattr(grpc._common, "MAXIMUM_WAIT_TIMEOUT", None), float):
        grpc._common.MAXIMUM_WAIT_TIMEOUT = STREAM_WAIT_SLICE_S


_wait_longer()

_GRPC_OPTIONS = [
    # A rebuilt client must not inherit a shared (possibly dying) connection.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class CoordinationError(Exception):
    """Base of all coordination errors; the message is one sentence a user can act on."""


class EtcdUnavailable(CoordinationError):
    """etcd cannot be reached right now (transient: retry with backoff)."""


class SessionExpired(EtcdUnavailable):
    """This node's lease is gone: call ``ensure_session()``, then register and claim again."""


class EtcdAccessDenied(CoordinationError):
    """Wrong user/password, untrusted certificate or missing permission (not transient)."""


class SpecMismatch(CoordinationError):
    """The job is running with a different job file; the message names the sections."""


class NotLeader(CoordinationError):
    """A leader-only write was attempted by a node that does not hold the leader key."""


class NodeIdHeld(CoordinationError):
    """Another daemon process holds this node id: its record is in etcd under its own lease."""

    def __init__(self, node_id: str, record: dict[str, Any]) -> None:
        self.instance = str(record.get("instance"))
        host, pid = record.get("host", "an unknown host"), record.get("pid", "?")
        super().__init__(
            f"node id '{node_id}' is held by a live daemon on {host} (pid {pid}); give every "
            "node its own id (--node-id or node.id; the default is the hostname)."
        )


class AddressHeld(CoordinationError):
    """Another machine's node advertises the address this node advertises."""

    def __init__(self, node_id: str, other: str, host: str) -> None:
        self.other = other
        super().__init__(
            f"node '{node_id}' advertises {host}, which node '{other}' on another machine "
            "already advertises, so peers would reach only one of them there; set "
            "node.advertise_host on each to an address of its own machine."
        )


class _TokenExpired(EtcdUnavailable):
    """The auth token was rejected (expired, or etcd restarted): authenticate again."""


@dataclass(frozen=True)
class EtcdSettings:
    endpoints: list[str]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # never printed
    timeout_s: float = 2.0  # below the lease TTL (daemon.config.check_etcd_settings)
    allow_insecure_password: bool = False  # the password may cross the network in clear

    def check(self, lease_ttl_s: int, job: str, node_id: str) -> None:
        """The job file's check of these settings (``check_etcd_settings``): raise
        :class:`CoordinationError` with its sentence where one is wrong."""
        s = self
        named = (s.endpoints, s.timeout_s, lease_ttl_s, job, node_id, s.user, s.password)
        files = (s.cert_file, s.key_file, s.ca_file)
        try:
            check_etcd_settings(*named, *files, s.allow_insecure_password)
        except ValueError as e:
            raise CoordinationError(f"{e}.") from None


def _rpc_error(exc: BaseException) -> Any:
    """The gRPC error behind ``exc``: pyetcd re-raises its own exception inside the handler."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, grpc.RpcError) and hasattr(seen, "code"):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


_TRANSIENT_CODES = {
    "UNAVAILABLE",
    "CANCELLED",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
    "UNKNOWN",
    "INTERNAL",
}


def _tls_error(low: str, endpoint: str, settings: EtcdSettings) -> EtcdAccessDenied | None:
    """A failed TLS handshake is a configuration problem, unless the socket merely closed."""
    if "certificate_verify_failed" in low:
        return EtcdAccessDenied(
            f"the TLS certificate of etcd at {endpoint} is not trusted by etcd.ca_file "
            f"({settings.ca_file}); point etcd.ca_file at the CA that signed the etcd server certificate."
        )
    if "alert" in low and ("certificate" in low or "unknown_ca" in low):
        return EtcdAccessDenied(
            f"etcd at {endpoint} rejected this node's TLS client certificate (missing or not trusted); "
            "set etcd.cert_file and etcd.key_file to a certificate signed by the CA etcd trusts."
        )
    if "ssl_error_ssl" in low:
        return EtcdAccessDenied(
            f"the TLS handshake with etcd at {endpoint} failed; check that etcd serves TLS "
            "and that etcd.ca_file, etcd.cert_file and etcd.key_file match it."
        )
    return None


def translate_error(exc: BaseException, endpoint: str, settings: EtcdSettings) -> CoordinationError:
    """Map any gRPC/pyetcd failure to a :class:`CoordinationError` with an actionable message."""
    if isinstance(exc, CoordinationError):
        return exc
    rpc = _rpc_error(exc)
    if rpc is None:
        if isinstance(exc, pyetcd.exceptions.NoServerAvailableError | ValueError):
            return EtcdUnavailable(f"the connection to etcd at {endpoint} was closed; retrying.")
        return CoordinationError(f"etcd request to {endpoint} failed: {exc}.")
    code = rpc.code()
    details = str(rpc.details() or "").strip()
    low = details.lower()
    user = settings.user or "(client certificate)"
    if code == grpc.StatusCode.UNAVAILABLE and (tls := _tls_error(low, endpoint, settings)):
        return tls
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EtcdUnavailable(
            f"etcd at {endpoint} did not answer within {settings.timeout_s:g} s."
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "space exceeded" in low:
        return EtcdUnavailable(
            f"etcd at {endpoint} refuses writes: its database reached its space quota (NOSPACE "
            "alarm); compact and defragment it, then disarm the alarm (docs/operations.md)."
        )
    if code.name in _TRANSIENT_CODES:
        reason = details.rsplit(": ", 1)[-1][:160] or code.name
        return EtcdUnavailable(
            f"cannot reach etcd at {endpoint} ({reason}); check that etcd runs and etcd.endpoints is right."
        )
    if "authentication failed" in low:
        return EtcdAccessDenied(
            f"etcd at {endpoint} rejected user '{user}': wrong etcd.user or etcd.password."
        )
    if "user name is empty" in low:
        return EtcdAccessDenied(
            f"etcd at {endpoint} requires authentication: set etcd.user and etcd.password."
        )
    if "authentication is not enabled" in low:
        return EtcdAccessDenied(
            f"etcd.user is set but etcd at {endpoint} has authentication disabled; "
            "remove etcd.user and etcd.password or enable auth on the server."
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return EtcdAccessDenied(
            f"etcd user '{user}' may not read or write the job's keys on {endpoint}; "
            "grant it a role with readwrite permission on the /phalanx/ prefix."
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return _TokenExpired(f"etcd at {endpoint} rejected the auth token ({details}); retrying.")
    if code == grpc.StatusCode.NOT_FOUND and "lease" in low:
        return SessionExpired(
            "this node's etcd lease has expired; call ensure_session() and register again."
        )
    return CoordinationError(f"etcd at {endpoint} refused a request: {details} ({code.name}).")


# ----------------------------------------------------------------------- connection


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    try:  # parsed where the job file's etcd settings are validated
        return split_endpoint(endpoint)
    except ValueError:
        raise CoordinationError(
            f"etcd endpoint '{endpoint}' is not host:port with a port from 1 to 65535; "
            "fix etcd.endpoints."
        ) from None


def _read(path: str | None, field: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CoordinationError(
            f"cannot read {field} '{path}' ({exc.strerror}); fix the path."
        ) from exc


class _Connection:
    """A pyetcd client that is rebuilt (next endpoint, fresh channel) after a failure.

    Thread-safe; each thread that must not wait on another (the keepalive) gets
    its own connection.
    """

    def __init__(self, settings: EtcdSettings, timeout_s: float) -> None:
        """`settings` were checked by the Coordinator (daemon.config.check_etcd_settings)."""
        self.settings = settings
        self.timeout_s = timeout_s
        self.endpoint = settings.endpoints[0]
        self._next = 0
        self._client: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(client)``; failures come out as :class:`CoordinationError`."""
        for attempt in (1, 2):
            client, endpoint = self._get()
            try:
                return fn(client)
            except (grpc.RpcError, pyetcd.Etcd3Exception, ValueError) as exc:
                if isinstance(exc, ValueError) and "channel" not in str(exc):
                    raise
                err = translate_error(exc, endpoint, self.settings)
                if isinstance(err, EtcdUnavailable) and not isinstance(err, SessionExpired):
                    self._discard(client)
                if isinstance(err, _TokenExpired) and attempt == 1:
                    continue  # rejected before it was applied: safe to send again
                raise err from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _get(self) -> tuple[Any, str]:
        with self._lock:
            if self._closed:
                raise CoordinationError("the etcd connection is closed.")
            if self._client is None:
                self._client = self._build()
            return self._client, self.endpoint

    def _discard(self, client: Any) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        client.close()

    def _build(self) -> Any:
        s = self.settings
        self.endpoint = s.endpoints[self._next % len(s.endpoints)]
        self._next += 1
        host, port = _split_endpoint(self.endpoint)
        secure = bool(s.ca_file or s.cert_file or self.endpoint.startswith("https://"))
        creds = None
        if secure:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(s.ca_file, "etcd.ca_file"),
                private_key=_read(s.key_file, "etcd.key_file"),
                certificate_chain=_read(s.cert_file, "etcd.cert_file"),
            )
        ep = pyetcd.Endpoint(
            host, port, secure=secure, creds=creds, time_retry=0.0, opts=_GRPC_OPTIONS
        )
        try:
            # Authenticates here (one request) when user/password are set.
            return pyetcd.MultiEndpointEtcd3Client(
                endpoints=[ep], timeout=self.timeout_s, user=s.user, password=s.password
            )
        except (grpc.RpcError, pyetcd.Etcd3Exception) as exc:
            ep.close()
            raise translate_error(exc, self.endpoint, s) from exc
