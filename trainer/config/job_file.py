"""Reading a job file for the trainer: TOML or JSON, ``--set`` overrides, validation
into the section models with one-sentence errors, and the hash of chosen sections."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainer.config.checks import check_trainer
from trainer.config.limits import (
    MAX_DEPTH,
    MAX_JOB_FILE_BYTES,
    check_text_depth,
    check_value_depth,
    shorten,
    too_deep,
)
from trainer.config.sections import DAEMON_SECTIONS, C, ConfigError, TrainerConfig


def add_override_option(parser: argparse.ArgumentParser) -> None:
    """The `--set section.key=value` option every Phalanx command shares."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a setting; the value is a TOML literal (bare words are strings)",
    )


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``section.key=value`` and read the value as a TOML literal (bare words are strings)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"--set {text!r} is not of the form section.key=value; write for example --set train.steps=100."
        )
    raw = raw.strip()
    if len(parts) > MAX_DEPTH:
        raise too_deep(f"--set {key.strip()[:60]!r}")
    check_text_depth(raw, f"the value of --set {key.strip()}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise too_deep(f"the value of --set {key.strip()}") from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``section.key=value`` override applied."""
    check_value_depth(data, "the job file")
    result: dict[str, Any] = json.loads(json.dumps(data))
    for text in overrides:
        parts, value = parse_override(text)
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"--set {text!r} goes through {part!r}, which is a value and not a section."
                )
            node = child
        node[parts[-1]] = value
    check_value_depth(result, "the job file with its --set overrides")
    return result


def _read_regular_file(p: Path) -> bytes:
    """The bytes of ``p``, which must be a regular file of at most MAX_JOB_FILE_BYTES: checked
    with ``stat`` before it is opened, so a FIFO or a device (/dev/zero) is never opened."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(
            f"job file {p} does not exist; pass an existing file to --config."
        ) from None
    except OSError as e:
        raise ConfigError(
            f"job file {p} cannot be read ({e.strerror}); check its permissions."
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"job file {p} is not a regular file; pass a TOML file to --config.")
    if st.st_size > MAX_JOB_FILE_BYTES:
        raise ConfigError(
            f"job file {p} is {st.st_size} bytes, more than a job file's limit of "
            f"{MAX_JOB_FILE_BYTES} (1 MiB); pass the job's TOML file to --config."
        )
    try:  # O_NONBLOCK: should the path have become a FIFO since the stat, do not wait on it
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(
                    f"job file {p} is not a regular file; pass a TOML file to --config."
                )
            raw = f.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(
            f"job file {p} cannot be read ({e.strerror}); check its permissions."
        ) from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise ConfigError(
            f"job file {p} is more than a job file's limit of {MAX_JOB_FILE_BYTES} bytes "
            "(1 MiB); pass the job's TOML file to --config."
        )
    return raw


def read_job_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML job file (or the JSON the daemon writes) into a dict."""
    p = Path(path)
    raw = _read_regular_file(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"job file {p} is not UTF-8 text (byte {e.start} is invalid); save it as UTF-8."
        ) from None
    is_json = p.suffix == ".json"
    if not is_json:
        check_text_depth(text, f"job file {p}")
    try:
        loaded = json.loads(text) if is_json else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"job file {p} is not valid {p.suffix.lstrip('.') or 'TOML'}: {e}."
        ) from None
    except RecursionError:
        raise too_deep(f"job file {p}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"job file {p} must hold a table of sections.")
    check_value_depth(loaded, f"job file {p}")
    return loaded if is_json else _beside(loaded, p)


def _beside(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Relative workload.python_path entries of a TOML job file name directories beside the
    file, wherever it is run from (as a systemd unit's or a pod's working directory is not
    the job file's); a ``--set`` value stays relative to the current directory."""
    workload = data.get("workload")
    if not isinstance(workload, dict):
        return data
    entries = workload.get("python_path")
    if isinstance(entries, list):
        base = path.resolve().parent
        workload["python_path"] = [
            str(base / e) if isinstance(e, str) and not Path(e).is_absolute() else e
            for e in entries
        ]
    return data


def _describe(error: Mapping[str, Any], model: type[BaseModel], source: str) -> str:
    loc = [str(x) for x in error["loc"]]
    field = ".".join(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        if len(loc) == 1:
            known = ", ".join(sorted(model.model_fields))
            return f"{source}: [{field}] is not a known section; the sections are {known}."
        parent: Any = model
        for part in loc[:-1]:
            parent = parent.model_fields[part].annotation
        known = ", ".join(sorted(f.alias or name for name, f in parent.model_fields.items()))
        return f"{source}: {field} is not a known setting; [{'.'.join(loc[:-1])}] accepts {known}."
    got = shorten(error.get("input"))
    message = str(error["msg"])
    message = message.removeprefix("Input ").removeprefix("Value error, ")
    message = message[0].lower() + message[1:]
    return (
        f"{source}: {field} {message} (got {got}); fix it in the job file or with --set {field}=..."
    )


def validate(model: type[C], data: Mapping[str, Any], source: str) -> C:
    """Validate ``data`` against ``model``, turning the first error into a ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e.errors()[0], model, source)) from None


def load_trainer_config(
    path: str | Path, overrides: Sequence[str] = (), world_size: int | None = None
) -> TrainerConfig:
    """Read, override, validate and cross-check a job file for the trainer."""
    data = apply_overrides(read_job_file(path), overrides)
    own = {k: v for k, v in data.items() if k not in DAEMON_SECTIONS}
    cfg = validate(TrainerConfig, own, str(path))
    try:
        check_trainer(cfg, world_size)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cfg


def spec_hash(data: Mapping[str, Any], sections: Iterable[str]) -> str:
    """SHA-256 of the given sections of a resolved config, independent of key order."""
    picked = {name: data.get(name) for name in sorted(sections)}
    blob = json.dumps(picked, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
