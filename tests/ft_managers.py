"""Real torchft Managers for one-rank replica groups, built as Phalanx's ranks build them
(scoped Gloo process group, manager server on loopback), for tests of the adapter."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

from trainer import torchft_adapter as ft
from trainer.transport import checkpoint_transport


def one_rank_manager(
    lighthouse: str,
    store: Any,
    timeout: timedelta,
    *,
    group: int = 0,
    replica_uuid: str | None = None,
    pg: Any = None,
    quorum_retries: int = 0,
    quorum_timeout: timedelta | None = None,
) -> Manager:
    """The Manager of group `group` (replica id phalanx_group_<group>, and :<replica_uuid>
    unless None: torchft's own uuid), storing in `store`, serving on the loopback address."""
    with ft.manager_server_bound_to("127.0.0.1"), ft.replica_uuid(replica_uuid):
        return Manager(
            pg=pg if pg is not None else ft.scoped_process_group(ProcessGroupGloo)(timeout=timeout),
            load_state_dict=lambda _: None,
            state_dict=lambda: {},
            min_replica_size=1,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=quorum_timeout or timeout,
            connect_timeout=timeout,
            quorum_retries=quorum_retries,
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lighthouse,
            replica_id=f"phalanx_group_{group:05d}",
            hostname="127.0.0.1",
            checkpoint_transport=checkpoint_transport(timeout),
            init_sync=False,
        )
