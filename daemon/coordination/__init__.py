"""What the nodes share through etcd: the client and the embedded server, the job's
view and spec, the copy of it that the watch keeps current, the slots and seats and
the keys of groups that span nodes, the node's identity, and the lease's timing (the
rule that fences a node whose lease is in doubt is ``daemon.fencing``). The coordinator is the one object that
speaks etcd's transactions for a daemon.
"""

from __future__ import annotations

from daemon.coordination.coordinator import (
    CoordinationError,
    Coordinator,
    EtcdAccessDenied,
    EtcdUnavailable,
    NodeIdHeld,
    NotLeader,
    SessionExpired,
    SpecMismatch,
    translate_error,
)
from daemon.coordination.etcd_client import AddressHeld, EtcdSettings
from daemon.coordination.etcd_server import (
    EmbeddedEtcd,
    EtcdStartError,
    ServerTls,
    find_etcd_binary,
)
from daemon.coordination.identity import (
    Identity,
    address_clash,
    holder_of,
    machine_id,
    new_instance,
    take_identity,
)
from daemon.coordination.job_cache import JobCache
from daemon.coordination.job_view import (
    JobView,
    differing_sections,
    mismatch_message,
    overall_spec_hash,
)
from daemon.coordination.job_watch import RESYNC_S, JobWatch
from daemon.coordination.lease_timing import fence_margin_s, refresh_every_s

__all__ = [
    "RESYNC_S",
    "AddressHeld",
    "CoordinationError",
    "Coordinator",
    "EmbeddedEtcd",
    "EtcdAccessDenied",
    "EtcdSettings",
    "EtcdStartError",
    "EtcdUnavailable",
    "Identity",
    "JobCache",
    "JobView",
    "JobWatch",
    "NodeIdHeld",
    "NotLeader",
    "ServerTls",
    "SessionExpired",
    "SpecMismatch",
    "address_clash",
    "differing_sections",
    "fence_margin_s",
    "find_etcd_binary",
    "holder_of",
    "machine_id",
    "mismatch_message",
    "new_instance",
    "overall_spec_hash",
    "refresh_every_s",
    "take_identity",
    "translate_error",
]
