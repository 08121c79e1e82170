"""sd_notify for ``Type=notify`` services, without a systemd library.

systemd passes a service the address of its notification socket in
``$NOTIFY_SOCKET``: a file-system path, or a name in the Linux abstract socket
namespace written with a leading ``@``. A notification is one AF_UNIX datagram
of newline-separated ``KEY=value`` assignments (``READY=1``, ``STATUS=...``,
``WATCHDOG=1``, ``STOPPING=1``). With ``WatchdogSec=`` set in the unit, systemd
also passes ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, the process it expects the
pings from) and kills the service if no ``WATCHDOG=1`` arrives in that time.

Outside systemd (no ``$NOTIFY_SOCKET``: a terminal, a container, the tests) every
method is a no-op. Notifications are best effort: a send that fails is logged and
dropped, never raised, so a broken or vanished socket cannot take the
supervisor down. The unit file is ``ops/systemd/phalanx.service``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from trainer import logs

log = logs.get()

# A send waits at most this long for room in systemd's socket queue; a watchdog
# ping that cannot be delivered in time is dropped rather than stall the loop.
_SEND_TIMEOUT_S = 1.0


def _socket_address(raw: str | None) -> str | None:
    """The address to send to: a path, or an abstract name (leading NUL); None if unusable."""
    if not raw:
        return None
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    # systemd >= 253 may also pass vsock:CID:PORT (for VMs); Phalanx runs on hosts.
    log.warning("sd_notify_unsupported_socket", notify_socket=raw)
    return None


def _one_line(text: str) -> str:
    """A value on one line: a newline would start a new (forged) assignment."""
    return " ".join(text.splitlines())


class Notifier:
    """Sends service state to systemd when the daemon runs under ``Type=notify``.

    ``environ`` defaults to ``os.environ`` and is read once, here. ``clock`` is
    the monotonic time source the watchdog rate limit uses (tests pass a fake).
    Safe to call from several threads.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self._address = _socket_address(env.get("NOTIFY_SOCKET"))
        self._watchdog_usec = env.get("WATCHDOG_USEC")
        self._watchdog_pid = env.get("WATCHDOG_PID")
        self._clock = clock
        self._lock = threading.Lock()
        self._last_watchdog: float | None = None

    @property
    def enabled(self) -> bool:
        """True when systemd gave us a notification socket."""
        return self._address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """systemd's watchdog timeout for this process in seconds, or None if it has none.

        None when ``WATCHDOG_USEC`` is unset or not a positive integer, or when
        ``WATCHDOG_PID`` names another process (the variables were inherited).
        """
        if self._watchdog_pid is not None:
            try:
                if int(self._watchdog_pid) != os.getpid():
                    return None
            except ValueError:
                return None
        if self._watchdog_usec is None:
            return None
        try:
            usec = int(self._watchdog_usec)
        except ValueError:
            return None
        return usec / 1_000_000 if usec > 0 else None

    def ready(self, status: str | None = None) -> None:
        """Startup is complete: systemd moves the unit from activating to active."""
        self._send({"READY": "1"} | self._status(status))

    def status(self, text: str) -> None:
        """A one-line state shown by ``systemctl status``."""
        self._send({"STATUS": _one_line(text)})

    def watchdog(self) -> None:
        """Ping the watchdog; sends at most once per half watchdog interval.

        Call it from the supervisor's monitor loop as often as the loop ticks:
        a loop that stops ticking stops the pings and systemd restarts the
        service. A no-op when the unit has no ``WatchdogSec=``.
        """
        interval = self.watchdog_interval_s
        if interval is None or not self.enabled:
            return
        with self._lock:
            now = self._clock()
            if self._last_watchdog is not None and now - self._last_watchdog < interval / 2:
                return
            # Counted even if the send fails: failures are then rate-limited too.
            self._last_watchdog = now
        self._send({"WATCHDOG": "1"})

    def stopping(self, status: str | None = None) -> None:
        """Shutdown (the drain) has begun."""
        self._send({"STOPPING": "1"} | self._status(status))

    @staticmethod
    def _status(status: str | None) -> dict[str, str]:
        return {} if status is None else {"STATUS": _one_line(status)}

    def _send(self, assignments: Mapping[str, str]) -> None:
        if self._address is None:
            return
        message = "\n".join(f"{key}={value}" for key, value in assignments.items())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(_SEND_TIMEOUT_S)
                sock.sendto(message.encode("utf-8"), self._address)
        except OSError as e:
            log.warning(
                "sd_notify_failed",
                notify_socket=self._address.replace("\0", "@"),
                message=message.replace("\n", " "),
                error=str(e),
            )
