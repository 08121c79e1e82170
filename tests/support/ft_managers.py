"""A real torchft lighthouse, and real torchft Managers for one-rank replica groups built as
Phalanx's ranks build them (scoped Gloo process group, manager server on loopback), for
tests of the adapter."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

from tests.support.ports import free_port
from trainer.config.env import replica_id
from trainer.ft import torchft_adapter as ft
from trainer.ft.transport import checkpoint_transport


@contextmanager
def running_lighthouse(
    *flags: str, port: int | None = None, min_replicas: int = 1
) -> Iterator[str]:
    """torchft_lighthouse on 127.0.0.1:`port` (a free one if None) until the block ends;
    yields its address. Passing a port starts it again where an earlier one served."""
    port = port or free_port()
    argv = [str(Path(sys.executable).parent / "torchft_lighthouse"), "--bind", f"127.0.0.1:{port}"]
    argv += [
        "--min_replicas",
        str(min_replicas),
        "--join_timeout_ms",
        "100",
        "--quorum_tick_ms",
        "50",
        *flags,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, "the lighthouse exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the lighthouse did not listen"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


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
            replica_id=replica_id(group),
            hostname="127.0.0.1",
            checkpoint_transport=checkpoint_transport(timeout),
            init_sync=False,
        )
