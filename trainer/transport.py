"""torchft's HTTP checkpoint transport, hardened for Phalanx.

Two differences from ``torchft.checkpointing.HTTPTransport``:

* Received state is loaded with ``weights_only=True``. torchft 0.2.0 loads healing
  checkpoints with full pickle, which would let any peer on the network run code
  in a recovering rank. Phalanx only sends tensors and plain containers (DTensors
  are converted to their local shards first, see ``trainer.state``), so the safe
  unpickler is enough.
* The advertised address uses ``PHALANX_ADVERTISE_HOST`` when set (for example a
  pod's stable DNS name), else the hostname, as torchft does.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from datetime import timedelta
from typing import Any

from torch.distributed._serialization import _streaming_load
from torchft.checkpointing.http_transport import HTTPTransport


def advertise_host() -> str:
    return os.environ.get("PHALANX_ADVERTISE_HOST") or socket.gethostname()


class SafeHTTPTransport(HTTPTransport[Any]):  # type: ignore[misc]
    @classmethod
    def _load_from_address(cls, address: str, timeout: timedelta) -> object:
        with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
            return _streaming_load(f, weights_only=True)

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        return f"http://{advertise_host()}:{port}/checkpoint/"
