"""What the nodes share through etcd: the client and the embedded server, the job's
view and spec, the copy of it that the watch keeps current, the slots and seats and
the keys of groups that span nodes, the node's identity, and the lease fence that
stops a node's ranks when its lease is gone. The coordinator is the one object that
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
from daemon.coordination.fencing import (
    AHEAD_BY,
    HOLD_S,
    LEASE_FILE,
    NOTICE_FILE,
    Fence,
    after_fence,
    epoch_doubt_s,
    fence_margin_s,
    refresh_every_s,
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

__all__ = [
    "AHEAD_BY",
    "HOLD_S",
    "LEASE_FILE",
    "NOTICE_FILE",
    "RESYNC_S",
    "AddressHeld",
    "CoordinationError",
    "Coordinator",
    "EmbeddedEtcd",
    "EtcdAccessDenied",
    "EtcdSettings",
    "EtcdStartError",
    "EtcdUnavailable",
    "Fence",
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
    "after_fence",
    "differing_sections",
    "epoch_doubt_s",
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
