"""torchft's HTTP checkpoint transport, hardened for Phalanx.

Two differences from ``torchft.checkpointing.HTTPTransport``:

* Received state is loaded with ``weights_only=True``. torchft 0.2.0 loads healing
  checkpoints with full pickle, which would let any peer on the network run code
  in a recovering rank. Phalanx only sends tensors and plain containers (DTensors
  are converted to their local shards first, see ``trainer.ft.state``), so the safe
  unpickler is enough.
* The advertised address uses ``PHALANX_ADVERTISE_HOST`` when set (for example a
  pod's stable DNS name), else the hostname, as torchft does.
* It listens on :func:`bind_host` only, not on every interface as torchft does;
  so do the group's store (``trainer.parallel.mesh``) and torchft's manager server
  (``trainer.ft.replication``).

Both override torchft internals, so the class, :class:`SafeHTTPTransport`, lives
in ``trainer.ft.torchft_adapter``; this module holds Phalanx's choices, and one more:

* :class:`SnapshotTransport` serves a healing peer a copy of the state. torchft
  serves the live tensors (a GPU's are copied to host memory first, so those are a
  copy already) and blocks reads from the sender's next commit on, so a survivor's
  commit waits for its healer's whole transfer. With a copy the survivor commits and
  steps while the healer still reads the state of the step before; reads are blocked
  again when the survivor starts its next step, once each healer has begun its read.
  The copy costs host memory for one model and optimizer state while it is served.

And the backend of the collectives across groups (:func:`cross_group_nccl`).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch

from trainer.config import ConfigError
from trainer.config.env import advertise_host, bind_host
from trainer.ft.torchft_adapter import SafeHTTPTransport

__all__ = [
    "SafeHTTPTransport",
    "SnapshotTransport",
    "advertise_host",
    "bind_host",
    "checkpoint_transport",
]

READ_START_WAIT_S = 1.0  # at the sender's next step: for each healer's read to begin


def _copied(value: Any) -> Any:
    """`value` with every host tensor in it copied (containers rebuilt, the rest shared)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone() if value.device.type == "cpu" else value
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copied(v) for v in value)
    return value


class SnapshotTransport(SafeHTTPTransport):
    """Serves a copy of the state sent, so the sender need not wait for the reads (see
    the module's docstring)."""

    def __init__(self, timeout: timedelta, num_chunks: int, host: str, bind_host: str) -> None:
        self._snapshot: Any = None
        self._served = 0  # reads of the copy begun since it was sent
        self._readers = 0  # healers it was sent to
        self._open = False  # serving a copy, reads allowed
        self._count = threading.Lock()
        super().__init__(timeout=timeout, num_chunks=num_chunks, host=host, bind_host=bind_host)

    # HTTPTransport._state_dict: what torchft's request handler streams to a reader (the
    # unchunked path). As a property here it counts the reads that begin.
    @property
    def _state_dict(self) -> Any:
        with self._count:
            self._served += 1
        return self._snapshot

    @_state_dict.setter
    def _state_dict(self, value: Any) -> None:
        self._snapshot = value

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
    ) -> None:
        with self._count:
            self._served, self._readers = 0, len(dst_ranks)
        super().send_checkpoint(dst_ranks, step, _copied(state_dict), timeout)
        self._open = True

    def disallow_checkpoint(self) -> None:
        """torchft calls this in every should_commit: a copy may still be read."""
        if not self._open:
            super().disallow_checkpoint()

    def close(self) -> None:
        """Stop serving the copy (at the start of the sender's next step): once each healer
        it was sent to has begun its read (or READ_START_WAIT_S passed), block new reads,
        waiting for those under way to end; then drop it."""
        if not self._open:
            return
        deadline = time.monotonic() + READ_START_WAIT_S
        while self._served < self._readers and time.monotonic() < deadline:
            time.sleep(0.002)
        self._open = False
        super().disallow_checkpoint()
        self._snapshot = None


def checkpoint_transport(timeout: timedelta) -> SnapshotTransport:
    """The transport a group heals through: one unchunked transfer of a copy, at the
    advertised host."""
    return SnapshotTransport(
        timeout=timeout, num_chunks=0, host=advertise_host(), bind_host=bind_host()
    )


def cross_group_nccl(backend: str, device: torch.device) -> bool:
    """Whether the groups' collectives run on NCCL (``ft.backend``): auto picks NCCL on
    CUDA; gloo works on any device, and lets groups share one GPU."""
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError(
            f"ft.backend = 'nccl' needs CUDA, but the ranks train on {device.type}; set "
            "ft.backend = 'auto' or 'gloo'."
        )
    return backend == "nccl" or (backend == "auto" and device.type == "cuda")
