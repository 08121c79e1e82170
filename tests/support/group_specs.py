"""A one-rank GroupSpec for tests that start ranks or standbys without a daemon."""

from __future__ import annotations

from pathlib import Path

from daemon.ranks.spec import GroupSpec


def one_rank_spec(
    run_dir: Path, config_path: Path, lighthouse: str, num_slots: int = 1, job: str = "itest"
) -> GroupSpec:
    """Slot 0 of `num_slots`, one rank, on loopback, no metrics."""
    return GroupSpec(
        nproc=1,
        slot=0,
        num_slots=num_slots,
        lighthouse=lighthouse,
        config_path=config_path,
        run_dir=run_dir,
        min_replicas=1,
        job=job,
        node="node-a",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        extra_env={},
        metrics_dir=None,
        python_path=[],
    )
