"""etcd's wall clock, read from the ``Date`` header of its HTTP ``/version`` answer.

etcd serves HTTP/1.1 on its client port beside gRPC (``/version``, ``/health``), and
Go's HTTP server dates every answer with the server's clock, in whole seconds. The gRPC
API carries no time at all (a response header holds revisions and the raft term), so
this is the one etcd-side clock a client can read without etcd's debug endpoints. Over
TLS the request presents the node's client certificate, as the gRPC client does;
``/version`` needs no etcd user. One request every ``health.interval_s``.
"""

from __future__ import annotations

import http.client
import ssl
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from daemon.config.etcd_settings import split_endpoint
from daemon.health.checks import ClockSample


@dataclass(frozen=True)
class EtcdAccess:
    """How to reach etcd's HTTP side: its endpoints and the TLS files of etcd.*."""

    endpoints: tuple[str, ...]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    timeout_s: float = 2.0

    def secure(self, endpoint: str) -> bool:
        """TLS exactly when the gRPC client uses it (daemon.coordination.etcd_client)."""
        return bool(self.ca_file or self.cert_file or endpoint.startswith("https://"))


def read_clock(access: EtcdAccess) -> tuple[ClockSample | None, str]:
    """One sample of etcd's clock from the first endpoint that answers with a Date, or
    None and why none did."""
    why = "no etcd endpoint"
    for endpoint in access.endpoints:
        try:
            return sample(access, endpoint), ""
        except (OSError, ValueError, TypeError, http.client.HTTPException) as e:
            why = f"{endpoint}: {type(e).__name__}: {e}"[:200]
    return None, why


def sample(access: EtcdAccess, endpoint: str) -> ClockSample:
    """GET /version from `endpoint`; raises what the connection or the answer raise."""
    host, port = split_endpoint(endpoint)
    host = host.strip("[]")  # an IPv6 address
    conn: http.client.HTTPConnection
    if access.secure(endpoint):
        context = ssl.create_default_context(cafile=access.ca_file)
        if access.cert_file:
            context.load_cert_chain(access.cert_file, access.key_file)
        conn = http.client.HTTPSConnection(host, port, timeout=access.timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=access.timeout_s)
    try:
        conn.connect()  # the connection's setup is not part of the round trip
        sent = time.time()
        conn.request("GET", "/version")
        answer = conn.getresponse()
        received = time.time()
        answer.read()
        date = answer.getheader("Date")
    finally:
        conn.close()
    if not date:
        raise ValueError("the answer has no Date header")
    return ClockSample(sent, received, parsedate_to_datetime(date).timestamp(), endpoint)
