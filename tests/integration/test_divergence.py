"""Replica divergence is caught and healed: the groups compare parameter digests every
``ft.digest_every`` steps, and a group whose parameters drifted is restarted and healed.

Three daemons train one job. The ranks of one group add 1e-3 to a parameter right
after step 23 commits (``PHALANX_CHAOS=optimizer@23:perturb``): nothing else would
notice, because the averaged gradients keep all groups moving alike. The comparison
at step 30 finds it; that group (a minority of one) restarts and heals from the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import (
    start_daemon,
)
from tests.support.pair_runs import (
    heal_divergence_to_end,
    kill_pair_after_checkpoint,
    run_pair_again,
)

pytestmark = pytest.mark.integration


def test_a_perturbed_group_is_found_within_digest_every_steps_and_healed(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    job = [
        "train.steps=150",  # the others still train when the restarted group comes back
        "job.max_replicas=3",
        "job.min_replicas=2",  # the majority goes on while the minority restarts
        "ft.digest_every=10",
    ]
    daemons = [
        start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("node-a", "node-b")
    ]
    daemons.append(
        start_daemon(
            tmp_path,
            "node-c",
            [etcd_endpoint],
            overrides=job,
            env={"PHALANX_CHAOS": "optimizer@23:perturb"},
        )
    )
    a, b, c = daemons
    heal_divergence_to_end(daemons, c)
    found = c.events("replicas_diverged")
    assert found and found[0]["group"].startswith("minority"), found
    assert 23 < int(found[0]["step"]) <= 33  # within digest_every steps of the perturbation
    assert len(found) == 1
    failed = c.events("rank_failed")
    assert failed and "ReplicasDiverged" in failed[0]["error"], failed
    assert c.events("group_restarted") and c.events("heal_done")
    step = int(found[0]["step"])
    assert [int(e["step"]) for e in c.events("heal_done")][-1] > step  # healed after it
    for d in (a, b):  # the majority saw it, went on, and was never restarted or healed
        assert [e["group"] for e in d.events("replicas_diverged")] == ["majority"]
        assert not d.events("group_restarted")
        # (a group that joined after the others' first steps healed once, at its start)
        assert all(int(e["step"]) < step for e in d.events("heal_done"))
    assert len({d.events("train_done")[0]["params_sha256"] for d in daemons}) == 1


def test_a_group_that_restored_other_parameters_heals_before_the_first_commit(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """Both groups die with a step-10 checkpoint on disk. On the cold start the other
    group's ranks change a parameter right after loading it (PHALANX_CHAOS
    restored@0:perturb): the groups' digests differ before the first commit, the
    writer wins the tie, the other group stops, restarts and heals from the writer,
    and both end equal; no step was committed with the different parameters."""
    ckpt = tmp_path / "ckpt"
    job = [
        "train.steps=60",
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=10",
        "job.min_replicas=2",  # both groups restore from disk, and the writer waits for the other
    ]
    writer, other = kill_pair_after_checkpoint(tmp_path, etcd_endpoint, job, ckpt, 10)
    second, _ = run_pair_again(
        tmp_path, etcd_endpoint, job, {other: {"PHALANX_CHAOS": "restored@0:perturb"}}
    )
    by_node = {d.node_id: d for d in second}
    w, o = by_node[writer], by_node[other]
    restored = int(w.events("checkpoint_loaded")[0]["step"])
    assert restored >= 10 and o.events("checkpoint_loaded")[0]["step"] == restored
    assert [e["group"] for e in w.events("checkpoint_digests_differ")] == ["majority"]
    assert [e["group"] for e in o.events("checkpoint_digests_differ")] == [
        "minority: restarting to heal"
    ]
    failed = o.events("rank_failed")
    assert failed and "RestoreMismatch" in failed[0]["error"], failed
    assert o.events("group_restarted") and not w.events("group_restarted")
    assert next(int(e["step"]) for e in o.events("heal_done")) >= restored
    # The first committed step after the restore came after the heal, on both groups.
    assert min(int(e["step"]) for e in w.events("train_step")) == restored + 1
    assert len({d.events("train_done")[0]["params_sha256"] for d in second}) == 1
