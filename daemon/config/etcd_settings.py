"""The one place that validates etcd settings: a job file's and a Coordinator's.

A password crosses the network only under TLS (or to loopback), unless the job
file says ``etcd.allow_insecure_password = true``; the password itself is read
from ``etcd.password_file`` and never printed (``EtcdSettings`` leaves it out of
its repr).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.config import ConfigError
from trainer.config.limits import shorten

if TYPE_CHECKING:
    from daemon.config.sections import DaemonConfig

# Node ids (and job names) are etcd key segments and the default run_dir's last component;
# at most 63 characters, like a DNS label or a Kubernetes name, so a StatefulSet pod's
# name fits.
NODE_ID_MAX = 63
NODE_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NODE_ID_MAX - 1}}}")
NODE_ID_RULE = (
    f"must be 1 to {NODE_ID_MAX} characters, start with a letter or digit and hold only "
    "letters, digits, '.', '_' and '-'"
)
SCHEMES = ("http", "https")


def check_endpoint(endpoint: str) -> None:
    """One etcd.endpoints entry: ``host:port`` or ``http(s)://host:port``, no credentials.

    Raises ValueError naming the entry and the fix.
    """
    shown = shorten(endpoint)
    scheme, sep, rest = endpoint.partition("://")
    if sep and scheme.lower() not in SCHEMES:
        raise ValueError(
            f"etcd.endpoints entry {shown} has the scheme {shorten(scheme)}; etcd is reached "
            "over http:// or https:// (or write host:port)"
        )
    if "@" in (rest if sep else endpoint).partition("/")[0]:
        raise ValueError(
            f"etcd.endpoints entry {shorten(endpoint.rpartition('@')[2])} carries credentials "
            "(user@ or user:password@); remove them and set etcd.user and etcd.password_file"
        )
    try:
        split_endpoint(endpoint)
    except ValueError:
        raise ValueError(
            f"etcd.endpoints entry {shown} must be host:port with a port from 1 to 65535"
        ) from None


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """Host and port of an etcd endpoint ``host:port`` (an ``http(s)://`` scheme is allowed).

    Raises ValueError when it is not host:port with a port from 1 to 65535.
    """
    netloc = endpoint.split("://", 1)[-1].rstrip("/")
    host, _, port = netloc.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{endpoint!r} is not host:port with a port from 1 to 65535")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost


def check_etcd_settings(
    endpoints: Sequence[str],
    timeout_s: float,
    lease_ttl_s: float,
    job: str,
    node_id: str,
    user: str | None = None,
    secret: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    ca_file: str | None = None,
    allow_insecure_password: bool = False,
) -> None:
    """The one check of etcd settings, for a job file and for a Coordinator built in code.

    Raises ValueError naming the job-file field and the fix. ``secret`` is the
    password (a Coordinator) or the password file (a job file): set with ``user``.
    """
    if not 2 <= lease_ttl_s <= 300:
        raise ValueError(f"etcd.lease_ttl_s ({lease_ttl_s:g}) must be from 2 to 300 s")
    if not 0 < timeout_s < lease_ttl_s:
        raise ValueError(
            f"etcd.timeout_s ({timeout_s:g}) must be above 0 and below etcd.lease_ttl_s "
            f"({lease_ttl_s:g}), or one slow request outlives the lease; lower etcd.timeout_s"
        )
    if bool(cert_file) != bool(key_file):
        raise ValueError("etcd.cert_file and etcd.key_file go together; set both or neither")
    if bool(user) != bool(secret):
        raise ValueError("etcd.user and etcd.password_file go together; set both or neither")
    for endpoint in endpoints:
        check_endpoint(endpoint)
    plain = [e for e in endpoints if not (ca_file or cert_file or e.startswith("https://"))]
    remote = [e for e in plain if not _is_loopback(split_endpoint(e)[0])]
    if secret and remote and not allow_insecure_password:
        raise ValueError(
            f"etcd.password_file is set but etcd at {remote[0]} is plain HTTP, so the password "
            "would cross the network unencrypted; set etcd.ca_file (TLS) or, if you accept "
            "that, etcd.allow_insecure_password = true"
        )
    for name, value in (("job.name", job), ("node id", node_id)):
        if not NODE_ID.fullmatch(value):  # both are etcd key segments
            raise ValueError(f"{name} {shorten(value)} {NODE_ID_RULE}")


def check_etcd_job(cfg: DaemonConfig, path: str | Path) -> None:
    """The etcd settings of a job file: the shared check, then the files it names."""
    etcd = cfg.etcd
    try:
        check_etcd_settings(
            etcd.endpoints,
            etcd.timeout_s,
            etcd.lease_ttl_s,
            cfg.job.name,
            cfg.node_id,
            etcd.user,
            etcd.password_file,
            etcd.cert_file,
            etcd.key_file,
            etcd.ca_file,
            etcd.allow_insecure_password,
        )
    except ValueError as e:
        raise ConfigError(f"{path}: {e}.") from None
    if etcd.leader_ttl_s > etcd.lease_ttl_s:
        raise ConfigError(
            f"{path}: etcd.leader_ttl_s ({etcd.leader_ttl_s}) must not exceed etcd.lease_ttl_s "
            f"({etcd.lease_ttl_s}); lower etcd.leader_ttl_s."
        )
    for field in ("ca_file", "cert_file", "key_file", "password_file"):
        value = getattr(etcd, field)
        if value and not Path(value).is_file():
            what = "is not a file" if Path(value).exists() else "does not exist"
            raise ConfigError(
                f"{path}: etcd.{field} {value} {what}; point it at the file or remove it."
            )


def read_password(cfg: DaemonConfig) -> str | None:
    """The etcd password from etcd.password_file; ConfigError when it cannot be used."""
    path = cfg.etcd.password_file
    if not path:
        return None
    try:
        password = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(
            f"etcd.password_file {path} cannot be read ({e.strerror}); "
            "make it readable by the daemon's user."
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"etcd.password_file {path} is not UTF-8 text; write the password as UTF-8."
        ) from None
    if not password:
        raise ConfigError(f"etcd.password_file {path} is empty; write the etcd password into it.")
    return password
