"""What the daemon and its spare processes say to each other: a standby's start (on its
stdin, one line) and the zygote's fork request (on its control socket) are
``{"env": {...}}``, the environment the rank runs with; the zygote answers a fork with
``{"pid": P}`` (0: none forked). The daemon's side is ``daemon/ranks/{standby,zygote}.py``,
the spares' ``trainer/spares/{standby,zygote}.py``; both use this module. Torch-free."""

from __future__ import annotations

import json


def start(env: dict[str, str]) -> bytes:
    """A start or a fork request: the rank's environment."""
    return json.dumps({"env": env}).encode()


def started_env(data: bytes | str) -> dict[str, str]:
    """The environment of a start or fork request; ValueError or KeyError when malformed."""
    env = json.loads(data)["env"]
    if not isinstance(env, dict):
        raise ValueError(f"a start's env is a {type(env).__name__}, not a mapping")
    return {str(k): str(v) for k, v in env.items()}


def forked(pid: int) -> bytes:
    """The zygote's answer: the forked standby's pid, 0 when none was forked."""
    return json.dumps({"pid": pid}).encode()


def forked_pid(data: bytes) -> int:
    """The pid of the zygote's answer (0: none, or no answer: the zygote is gone);
    ValueError or KeyError when malformed."""
    return int(json.loads(data or forked(0))["pid"])
