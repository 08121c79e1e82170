"""``python -m trainer --config FILE [--set section.key=value ...]``: run one rank.

The job file and the environment are validated before torch is imported, so bad
input exits with code 2 and one sentence in well under a second.
Exit codes (:mod:`trainer.exits`): 0 finished, 2 bad input, 75 no quorum in time (or,
in a group that spans nodes, its other nodes out of reach), 143 drained, 1 any other
failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from trainer import logs
from trainer.config import ConfigError, add_override_option, load_trainer_config
from trainer.config import env as env_vars
from trainer.config.env import RankEnv
from trainer.contracts import rank_events as events
from trainer.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_QUORUM, NoQuorum


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Run one rank of the Phalanx trainer under the torchrun/Phalanx env contract.",
    )
    default = os.environ.get(env_vars.CONFIG)
    parser.add_argument(
        "--config",
        required=default is None,
        default=default,
        help="job file (TOML, or the JSON a daemon writes); default $PHALANX_CONFIG",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="warm up, then wait for the start's environment as one JSON line on stdin "
        "(the daemon's hot spares)",
    )
    parser.add_argument(
        "--zygote",
        action="store_true",
        help="warm up once, then fork a standby per request on --control-fd (the daemon's)",
    )
    parser.add_argument("--control-fd", type=int, default=-1, help=argparse.SUPPRESS)
    add_override_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, prepare: Callable[[str, int], Any] | None = None) -> int:
    """Run one rank; `prepare` replaces a standby's warm-up (a standby forked warm)."""
    args = parse_args(argv)
    prepared = None
    if args.zygote:
        if args.control_fd < 0:
            print(
                "error: --zygote needs --control-fd (the daemon's socket); it is not "
                "started by hand",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        from trainer.spares.zygote import serve

        return serve(args.config, args.control_fd, main)
    if args.standby:
        from trainer.spares.standby import wait_for_start, warm

        started, prepared = wait_for_start(args.config, prepare or warm)
        if not started:
            return 0
    try:
        env = RankEnv.from_environ()
        cfg = load_trainer_config(args.config, args.overrides, env.world_size)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logs.configure()
    logs.bind(job=env.job, node=env.node, replica_group=env.replica_group, rank=env.rank)
    log = logs.get()
    try:
        from trainer.run import run

        # What the standby built from the same job file is used; anything else is rebuilt.
        work = prepared[1] if prepared is not None and prepared[0] == cfg else None
        return run(cfg, env, work)
    except ConfigError as e:  # problems only visible once data is opened
        log.error(events.BAD_INPUT, error=str(e))
        return EXIT_BAD_INPUT
    except NoQuorum as e:  # the peers were late, not this rank: the daemon waits for them
        log.error(events.RANK_FAILED, error=f"{type(e).__name__}: {e}", no_quorum=True)
        return EXIT_NO_QUORUM
    except Exception as e:
        if group_peers_unreachable(e, env):  # a split inside the group: waited out too
            log.error(events.RANK_FAILED, error=f"{type(e).__name__}: {e}", group_peers=True)
            return EXIT_NO_QUORUM
        log.exception(events.RANK_FAILED, error=f"{type(e).__name__}: {e}")
        return EXIT_FAILED


# What gloo's TCP transport says when a link to another rank failed (a send or receive
# timed out, the peer closed or reset the connection): raised as a plain RuntimeError.
GLOO_LINK = "gloo/transport/tcp/"


def group_peers_unreachable(error: BaseException, env: RankEnv) -> bool:
    """Whether `error` says this rank lost its group's other nodes: its store on another
    node out of reach (torch's DistStoreError or DistNetworkError) or a gloo link that
    failed, however wrapped. They are cut off, gone or still starting; nothing is wrong
    with this rank, so its daemon waits for them rather than counting a crash. A group
    within one node has no other node to wait for; a rank of this node that crashed
    still counts (its own exit code does, whatever its peers say)."""
    if env.world_size <= env.local_world_size:
        return False
    import torch.distributed as dist  # loaded already: the rank got as far as its group

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, dist.DistStoreError | dist.DistNetworkError):
            return True
        if isinstance(seen, RuntimeError) and GLOO_LINK in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: torchft's threads and a dead peer's sockets can stall it.
    os._exit(code)
