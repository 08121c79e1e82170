"""The job spec in etcd (``daemon.coordination.job_spec``), against a real etcd: written by
the first node, accepted when equal, refused with one sentence naming what differs
(sections, or node.nproc where groups span nodes), replaced once no node is registered."""

from __future__ import annotations

import pytest

from daemon.coordination.coordinator import SpecMismatch
from tests.support.coordinators import MakeCoordinator

pytestmark = pytest.mark.integration

SPEC = {"model": "m1", "train": "t1", "data": "d1"}


@pytest.fixture
def make(make_coordinator: MakeCoordinator) -> MakeCoordinator:
    return make_coordinator


def test_spec_written_then_equal_accepted(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    a.check_spec(SPEC)
    b.check_spec(dict(SPEC))
    spec = a.snapshot().spec
    assert spec is not None and spec["sections"] == SPEC and len(spec["hash"]) == 64


def test_spec_mismatch_names_differing_sections(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    a.check_spec(SPEC)
    a.register({"host": "h1"})
    with pytest.raises(SpecMismatch) as info:
        b.check_spec({**SPEC, "model": "m2", "train": "t2"})
    assert str(info.value) == (
        "job 'demo' is running with a different job file: sections model, train differ; "
        "use the same file on every node or another job.name."
    )
    assert a.snapshot().spec == b.snapshot().spec and b.snapshot().spec is not None


def test_a_node_with_another_nproc_is_refused_where_groups_span_nodes(
    make: MakeCoordinator,
) -> None:
    """Where groups span nodes the spec carries node.nproc (DaemonConfig.spec): a node
    with another value is refused, naming both values and the field."""
    a, b = make("a"), make("b")
    spanning = {**SPEC, "node.nproc": "2", "job.nodes_per_group": "2"}
    a.check_spec(spanning)
    a.register({"host": "h1"})
    with pytest.raises(SpecMismatch) as info:
        b.check_spec({**spanning, "node.nproc": "4"})
    assert str(info.value) == (
        "job 'demo' spans each replica group over several nodes with node.nproc = 2 and "
        "this node has node.nproc = 4: every node of such a job needs the same node.nproc; "
        "set it here or use another job.name."
    )


def test_spec_replaced_when_no_node_is_registered(make: MakeCoordinator) -> None:
    a = make("a")
    a.check_spec(SPEC)
    a.set_state("completed", 100)
    a.publish_checkpoint({"step": 100, "path": "/ckpt/step-100"})
    new = {**SPEC, "data": "d2"}
    make("b").check_spec(new)  # no node record: the old run is over
    view = a.snapshot()
    assert view.spec is not None and view.spec["sections"] == new
    assert view.state is None
    # A new run of the job: the old run's checkpoint record goes with its state.
    assert view.checkpoint is None
