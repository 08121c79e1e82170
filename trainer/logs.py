"""Structured logging shared by the trainer and the daemon (torch-free).

Events are written to stderr: one JSON object per line when stderr is not a
terminal (services, rank processes read by the daemon), readable console lines
when it is. Event names are stable identifiers (``train_step``, ``train_done``,
``group_started``, ...); context such as job, node, replica_group and rank is
bound once with :func:`bind` and carried on every event.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

# Library loggers that log an empty message with structured `extra` on every step.
_NOISY = ("torchft_quorums", "torchft_commits", "torchft_errors")


def _stamp(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Add the time unless the event already carries one (a relayed rank event keeps its own)."""
    event_dict.setdefault("time", datetime.now(UTC).isoformat().replace("+00:00", "Z"))
    return event_dict


# The job and node bound last in this process: every event gets them, also one logged on
# a thread started without a copy of the binding context (an asyncio loop's, a library's).
_PROCESS: dict[str, Any] = {}
_PROCESS_KEYS = ("job", "node")


def _process_context(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in _PROCESS.items():
        event_dict.setdefault(key, value)
    return event_dict


def _event_first(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Put `event` first so a JSON line reads naturally."""
    event = event_dict.pop("event", None)
    return {"event": event, **event_dict}


def configure(
    json_output: bool | None = None, level: int = logging.INFO, stream: TextIO | None = None
) -> None:
    """Route structlog and stdlib logging to ``stream`` (default stderr).

    ``json_output`` defaults to "stream is not a terminal".
    """
    out = stream or sys.stderr
    if json_output is None:
        json_output = not out.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _process_context,
        structlog.processors.add_log_level,
        _stamp,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, _event_first, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per event (line and newline together): ranks that share one output
        # file (torchrun without redirects) never interleave inside a line, even unbuffered
        # (PYTHONUNBUFFERED), where print() writes the line and its newline separately.
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Libraries (torchft, torch) log through stdlib logging: same format, warnings and up.
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _library_event,
                _event_first,
                renderer,
            ],
        )
    )
    handler.addFilter(_drop_known_noise)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # Python warnings and crashes of background threads become events too, so a
    # service's stderr stays one JSON object per line.
    logging.captureWarnings(True)
    threading.excepthook = _thread_crashed


def _thread_crashed(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    get().error(
        "thread_crashed",
        thread=args.thread.name if args.thread else None,
        error=f"{args.exc_type.__name__}: {args.exc_value}",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def _drop_known_noise(record: logging.LogRecord) -> bool:
    """torchft warns on every reconfiguration that it cannot reset NCCL's flight recorder,
    which is meaningless on Gloo; drop that line, keep everything else."""
    return "flight recorder" not in record.getMessage()


def _library_event(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Library records carry free text: keep it as `message` under the event `library_log`."""
    event_dict["message"] = str(event_dict.get("event", ""))
    event_dict["event"] = "library_log"
    return event_dict


_relay_lock = threading.Lock()
_LEVELS = {"debug", "info", "warning", "error", "critical"}


def relay(event: Mapping[str, Any]) -> None:
    """Re-emit an event another process logged (a rank's JSON line) as this process's event.

    The fields stay fields (no JSON inside a string); the original time and level are kept.
    """
    fields = dict(event)
    name = str(fields.pop("event", "rank_output"))
    level = str(fields.pop("level", "info"))
    method = level if level in _LEVELS else "info"
    with _relay_lock:
        getattr(get(), method)(name, **fields)


def bind(**context: Any) -> None:
    """Attach context (job, node, replica_group, rank, ...) to every later event of this
    context; job and node to every later event of the process."""
    bound = {k: v for k, v in context.items() if v is not None}
    structlog.contextvars.bind_contextvars(**bound)
    _PROCESS.update({k: v for k, v in bound.items() if k in _PROCESS_KEYS})


def get(name: str | None = None) -> Any:
    """A structured logger: ``get().info("train_step", step=3, loss=2.1)``."""
    return structlog.get_logger(name)
