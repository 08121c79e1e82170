"""One rank of the rendezvous test: configure torchft's Gloo process group and all-reduce.

Usage: rendezvous_rank.py PORT RANK SCOPED(0|1) REPLICA_ID,REPLICA_ID
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
from torch.distributed import AllreduceOptions
from torchft.process_group import ProcessGroupGloo

from trainer.ft.torchft_adapter import scoped_process_group
from trainer.ft.torchft_group import membership_token


def main() -> None:
    port, rank, scoped, ids = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        sys.argv[3] == "1",
        sys.argv[4].split(","),
    )
    pg = (scoped_process_group(ProcessGroupGloo) if scoped else ProcessGroupGloo)(
        timeout=timedelta(seconds=5)
    )
    if scoped:
        pg.membership = lambda: membership_token(ids, step=0)
    try:
        # The prefix torchft builds for quorum 2, group rank 0, on this store.
        pg.configure(f"127.0.0.1:{port}/torchft/2/0", ids[rank], rank, 2)
        t = torch.ones(3) * (rank + 1)
        pg.allreduce([t], AllreduceOptions()).wait()
        print("ok" if t.tolist() == [3.0, 3.0, 3.0] else f"wrong {t.tolist()}", flush=True)
    except Exception as e:
        print(f"failed: {type(e).__name__}", flush=True)


if __name__ == "__main__":
    main()
