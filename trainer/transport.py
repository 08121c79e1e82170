"""torchft's HTTP checkpoint transport, hardened for Phalanx.

Two differences from ``torchft.checkpointing.HTTPTransport``:

* Received state is loaded with ``weights_only=True``. torchft 0.2.0 loads healing
  checkpoints with full pickle, which would let any peer on the network run code
  in a recovering rank. Phalanx only sends tensors and plain containers (DTensors
  are converted to their local shards first, see ``trainer.state``), so the safe
  unpickler is enough.
* The advertised address uses ``PHALANX_ADVERTISE_HOST`` when set (for example a
  pod's stable DNS name), else the hostname, as torchft does.
* It listens on :func:`bind_host` only, not on every interface as torchft does;
  so do the group's store (``trainer.mesh``) and torchft's manager server
  (``trainer.fault_tolerance``).

Both override torchft internals, so the class, :class:`SafeHTTPTransport`, lives
in ``trainer.torchft_adapter``; this module holds Phalanx's choices.
"""

from __future__ import annotations

from datetime import timedelta

from trainer.env import advertise_host, bind_host
from trainer.torchft_adapter import SafeHTTPTransport

__all__ = ["SafeHTTPTransport", "advertise_host", "bind_host", "checkpoint_transport"]


def checkpoint_transport(timeout: timedelta) -> SafeHTTPTransport:
    """The transport a group heals through: one unchunked transfer, at the advertised host."""
    return SafeHTTPTransport(
        timeout=timeout, num_chunks=0, host=advertise_host(), bind_host=bind_host()
    )
