"""etcd with server TLS, client-certificate auth and user/password auth, end to end.

The certificates are made in the test: with the ``cryptography`` package when
it is installed, else with the ``openssl`` command; the module is skipped when
neither is available.
"""

from __future__ import annotations

import datetime
import importlib
import ipaddress
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemon.coordination.coordinator import (
    Coordinator,
    EtcdAccessDenied,
    EtcdSettings,
    EtcdUnavailable,
)
from daemon.coordination.etcd_server import ServerTls
from tests.support.coordinators import wait_for
from tests.support.etcd_control import ControlledEtcd, EtcdUser

pytestmark = pytest.mark.integration

TIMEOUT_S = 2.0
USER, PASSWORD = "phalanx", "s3cret-pw"
OUTSIDER, OUTSIDER_PASSWORD = "outsider", "other-pw"


@dataclass(frozen=True)
class Pki:
    """Files of a test PKI: ``ca`` signs the server and ``client``; ``other`` signs ``stranger``."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    stranger_cert: str
    stranger_key: str


def _can_make_certificates() -> bool:
    try:
        importlib.import_module("cryptography")
    except ImportError:
        return shutil.which("openssl") is not None
    return True


def make_pki(d: Path) -> Pki:
    issue = _issue_with_cryptography
    try:
        importlib.import_module("cryptography")
    except ImportError:
        issue = _issue_with_openssl
    issue(d, "ca", None, ca=True)
    issue(d, "server", "ca", server=True)
    issue(d, "client", "ca")
    issue(d, "other", None, ca=True)
    issue(d, "stranger", "other")
    return Pki(
        ca=str(d / "ca.crt"),
        server_cert=str(d / "server.crt"),
        server_key=str(d / "server.key"),
        client_cert=str(d / "client.crt"),
        client_key=str(d / "client.key"),
        other_ca=str(d / "other.crt"),
        stranger_cert=str(d / "stranger.crt"),
        stranger_key=str(d / "stranger.key"),
    )


def _issue_with_openssl(
    d: Path, name: str, issuer: str | None, ca: bool = False, server: bool = False
) -> None:
    """Write ``name.key`` (EC P-256) and ``name.crt`` signed by ``issuer`` (self-signed if None)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    key_opts = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subject = ["-subj", f"/CN=phalanx-test-{name}"]
    if issuer is None:
        run(
            "req",
            "-x509",
            *key_opts,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.crt",
            "-days",
            "1",
            *subject,
        )
        return
    usage = "serverAuth,clientAuth" if server else "clientAuth"
    ext = f"extendedKeyUsage={usage}\n"
    if server:
        ext += "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    (d / f"{name}.ext").write_text(ext)
    run("req", *key_opts, "-keyout", f"{name}.key", "-out", f"{name}.csr", *subject)
    run(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt", "-CAkey", f"{issuer}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext",
    )  # fmt: skip


def _issue_with_cryptography(
    d: Path, name: str, issuer: str | None, ca: bool = False, server: bool = False
) -> None:
    """Same as :func:`_issue_with_openssl`, through the ``cryptography`` package."""
    x509: Any = importlib.import_module("cryptography.x509")
    oid: Any = importlib.import_module("cryptography.x509.oid")
    hashes: Any = importlib.import_module("cryptography.hazmat.primitives.hashes")
    ec: Any = importlib.import_module("cryptography.hazmat.primitives.asymmetric.ec")
    ser: Any = importlib.import_module("cryptography.hazmat.primitives.serialization")

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(oid.NameOID.COMMON_NAME, f"phalanx-test-{name}")])
    if issuer is None:
        issuer_name, issuer_key = subject, key
    else:
        issuer_cert = x509.load_pem_x509_certificate((d / f"{issuer}.crt").read_bytes())
        issuer_name = issuer_cert.subject
        issuer_key = ser.load_pem_private_key((d / f"{issuer}.key").read_bytes(), None)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        usages = [oid.ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.append(oid.ExtendedKeyUsageOID.SERVER_AUTH)
            san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    (d / f"{name}.crt").write_bytes(cert.public_bytes(ser.Encoding.PEM))
    (d / f"{name}.key").write_bytes(
        key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not _can_make_certificates():
        pytest.skip(
            "neither the cryptography package nor the openssl command can make test certificates"
        )
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_etcd(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlledEtcd]:
    """etcd serving TLS, requiring client certificates from ``ca``, with auth enabled."""
    server = ControlledEtcd(
        tmp_path_factory.mktemp("secure") / "etcd",
        tls=ServerTls(cert_file=pki.server_cert, key_file=pki.server_key, trusted_ca_file=pki.ca),
    )
    server.start()
    try:
        server.enable_auth(
            "root-pw",
            [
                EtcdUser(USER, PASSWORD, "/phalanx/"),
                EtcdUser(OUTSIDER, OUTSIDER_PASSWORD, "/elsewhere/"),
            ],
            cert_file=pki.client_cert,
            key_file=pki.client_key,
        )
        yield server
    finally:
        server.stop()


def settings(etcd: ControlledEtcd, pki: Pki, **overrides: Any) -> EtcdSettings:
    values: dict[str, Any] = {
        "endpoints": [etcd.endpoint],
        "ca_file": pki.ca,
        "cert_file": pki.client_cert,
        "key_file": pki.client_key,
        "user": USER,
        "password": PASSWORD,
        "timeout_s": TIMEOUT_S,
    }
    values.update(overrides)
    return EtcdSettings(**values)


def connect_error(s: EtcdSettings) -> tuple[Exception, float]:
    """The error ``connect()`` raises with settings ``s``, and how long it took."""
    c = Coordinator(s, "secure", "n1", 5)
    start = time.monotonic()
    try:
        c.connect()
    except Exception as exc:
        return exc, time.monotonic() - start
    finally:
        c.close()
    pytest.fail("connect() succeeded with bad credentials")


def test_correct_settings_work_end_to_end(secure_etcd: ControlledEtcd, pki: Pki) -> None:
    a = Coordinator(settings(secure_etcd, pki), "secure", "a", 5)
    b = Coordinator(settings(secure_etcd, pki), "secure", "b", 5)
    try:
        for c in (a, b):
            c.connect()
            c.check_spec({"model": "m"})
            assert c.ensure_session() is True
            c.register({"host": "127.0.0.1"})
        assert a.claim_slot(2) == 0 and b.claim_slot(2) == 1
        assert a.campaign() and not b.campaign()
        view = b.snapshot()
        assert view.groups == {0: "a", 1: "b"} and view.leader == "a"
    finally:
        a.close()
        b.close()


def test_wrong_password_is_denied_quickly(secure_etcd: ControlledEtcd, pki: Pki) -> None:
    exc, took = connect_error(settings(secure_etcd, pki, password="wrong"))
    assert isinstance(exc, EtcdAccessDenied), exc
    assert "etcd.password" in str(exc)
    assert took < TIMEOUT_S


def test_user_without_permission_is_denied(secure_etcd: ControlledEtcd, pki: Pki) -> None:
    exc, took = connect_error(settings(secure_etcd, pki, user=OUTSIDER, password=OUTSIDER_PASSWORD))
    assert isinstance(exc, EtcdAccessDenied), exc
    assert "permission" in str(exc) and OUTSIDER in str(exc)
    assert took < TIMEOUT_S


def test_untrusted_server_certificate_is_denied(secure_etcd: ControlledEtcd, pki: Pki) -> None:
    exc, took = connect_error(settings(secure_etcd, pki, ca_file=pki.other_ca))
    assert isinstance(exc, EtcdAccessDenied | EtcdUnavailable), exc
    assert "not trusted" in str(exc)
    assert isinstance(exc, EtcdAccessDenied)
    assert took < TIMEOUT_S


def test_untrusted_client_certificate_is_denied(secure_etcd: ControlledEtcd, pki: Pki) -> None:
    exc, took = connect_error(
        settings(secure_etcd, pki, cert_file=pki.stranger_cert, key_file=pki.stranger_key)
    )
    assert isinstance(exc, EtcdAccessDenied), exc
    assert "client certificate" in str(exc)
    assert took < TIMEOUT_S


def _daemon_tls_args(secure_etcd: ControlledEtcd, pki: Pki, password_file: Path) -> list[str]:
    return [
        f'etcd.endpoints=["{secure_etcd.endpoint}"]',
        f'etcd.ca_file="{pki.ca}"',
        f'etcd.cert_file="{pki.client_cert}"',
        f'etcd.key_file="{pki.client_key}"',
        f'etcd.user="{USER}"',
        f'etcd.password_file="{password_file}"',
    ]


def test_daemon_trains_against_etcd_with_tls_and_auth(
    secure_etcd: ControlledEtcd, pki: Pki, tmp_path: Path
) -> None:
    """`phalanx run` end to end over TLS with client certificates and a password."""
    from tests.support.harness import start_daemon

    secret = tmp_path / "etcd-password"
    secret.write_text(PASSWORD + "\n")
    args = [*_daemon_tls_args(secure_etcd, pki, secret), "train.steps=20", 'job.name="tls"']
    daemon = start_daemon(tmp_path, "tls-node", None, overrides=args)
    try:
        assert daemon.wait(120) == 0, daemon.proc.tail()
    finally:
        daemon.stop()
    assert daemon.events("train_done")[0]["step"] == 20
    assert_never_printed(PASSWORD, tmp_path, secret)


def assert_never_printed(password: str, root: Path, password_file: Path) -> None:
    """No file the daemon or its ranks wrote (logs, events, status, run files) holds it."""
    written = [p for p in root.rglob("*") if p.is_file() and p != password_file]
    assert any(p.suffix in (".out", ".err") for p in written), written  # the logs were read
    for path in written:
        assert password.encode() not in path.read_bytes(), f"{path} holds the etcd password"


def test_daemon_with_a_wrong_password_fails_clearly(
    secure_etcd: ControlledEtcd, pki: Pki, tmp_path: Path
) -> None:
    from tests.support.harness import start_daemon

    secret = tmp_path / "etcd-password"
    secret.write_text("not-the-password\n")
    daemon = start_daemon(
        tmp_path, "bad-node", None, overrides=_daemon_tls_args(secure_etcd, pki, secret)
    )
    started = time.monotonic()
    try:
        assert daemon.wait(30) == 2, daemon.proc.tail()
    finally:
        daemon.stop()
    assert time.monotonic() - started < 20
    failure = daemon.events("node_failed")[0]["error"]
    assert "password" in failure.lower() or "authentication" in failure.lower(), failure
    assert_never_printed("not-the-password", tmp_path, secret)


def test_the_lease_keepalive_survives_an_etcd_restart_under_tls_and_auth(
    secure_etcd: ControlledEtcd, pki: Pki
) -> None:
    """The keepalive stream was opened with an auth token that a restarted etcd no longer
    knows: the stream is opened again on a client that authenticates again, and the lease
    (restored by etcd) is kept. Last here: it restarts the module's etcd."""

    def confirmed_after(since: float) -> bool:
        confirmation = a.lease_confirmation()
        return confirmation is not None and confirmation[1] > since

    a = Coordinator(settings(secure_etcd, pki), "secure", "keepalive", 5)
    try:
        a.connect()
        assert a.ensure_session() is True
        lease = a.lease_confirmation()
        assert lease is not None
        opened = time.monotonic()
        wait_for(lambda: confirmed_after(opened), 5, "a keepalive over TLS with a token")
        secure_etcd.restart()
        restarted = time.monotonic()
        wait_for(lambda: confirmed_after(restarted), 10, "the restarted etcd to confirm the lease")
        kept = a.lease_confirmation()
        assert kept is not None and kept[0] == lease[0]
        assert a.ensure_session() is False
    finally:
        a.close()
