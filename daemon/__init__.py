"""The per-node Phalanx supervisor. Never imports torch."""

import os
from importlib.metadata import PackageNotFoundError, version

# The daemon forks children (ranks, lighthouse, etcd) with a preexec_fn while the etcd
# client's gRPC threads run. With gRPC's fork support on, its at-fork handlers wake an
# event-engine poller in the forked child before exec; seen in the suite: a rank
# aborting at start with "epoll_wait error: Bad file descriptor" (SIGABRT). The daemon
# never uses gRPC in a child, so fork support is off (read when grpc is imported).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

try:
    __version__ = version("phalanx")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
