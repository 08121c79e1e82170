"""The job spec in etcd: the first node writes it, every later one must match it.

``spec`` holds the hash of a job file's shared sections and the hash of each one,
so a node with another job file is refused naming the sections that differ. A spec
is replaced (a new run: ``state``, ``checkpoints/latest`` and the job's reached step go
with it) only while no node is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyetcd
from pyetcd import transactions as txn

from daemon.coordination.etcd_client import CoordinationError, SpecMismatch
from daemon.coordination.job_view import (
    differing_sections,
    dump,
    json_dict,
    mismatch_message,
    overall_spec_hash,
)
from daemon.coordination.progress import reached_key
from trainer import logs

log = logs.get()
Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]


def put_spec(job: str, sections: dict[str, str], do_txn: Txn, key_of: Callable[[str], str]) -> None:
    """Write the spec, or check ours equals it; raises SpecMismatch when it differs while
    nodes are registered. `do_txn` and `key_of` are the coordinator's."""
    key, nodes = key_of("spec"), key_of("nodes/")
    all_nodes = (nodes, pyetcd.utils.prefix_range_end(nodes.encode()))
    overall = overall_spec_hash(sections)
    value = dump({"hash": overall, "sections": sections})
    for _ in range(5):
        ok, responses = do_txn([txn.Create(key) == 0], [txn.Put(key, value)], [txn.Get(key)])
        if ok:
            log.info("job_spec_written", job=job, hash=overall)
            return
        if not responses[0]:
            continue  # deleted in between: try to create it again
        existing, meta = responses[0][0]
        current = json_dict(existing)
        if current.get("hash") == overall:
            return
        differ = differing_sections(current.get("sections") or {}, sections) or sorted(sections)
        ok, responses = do_txn(
            [txn.Mod(key) == meta.mod_revision, txn.Create(*all_nodes) == 0],
            [
                txn.Put(key, value),
                txn.Delete(key_of("state")),
                txn.Delete(key_of("checkpoints/latest")),
                txn.Delete(reached_key(job)),
            ],
            [txn.Get(*all_nodes)],
        )
        if ok:
            log.info("job_spec_replaced", job=job, hash=overall, sections=differ)
            return
        if responses[0]:
            theirs = current.get("sections") or {}
            devices = None
            if "device" in theirs and "device" in sections:
                devices = (str(theirs["device"]), str(sections["device"]))
            if differ == ["node.nproc"]:
                raise SpecMismatch(
                    f"job '{job}' spans each replica group over several nodes with node.nproc "
                    f"= {theirs['node.nproc']} and this node has node.nproc = "
                    f"{sections['node.nproc']}: every node of such a job needs the same "
                    "node.nproc; set it here or use another job.name."
                )
            raise SpecMismatch(mismatch_message(job, differ, devices))
    raise CoordinationError(f"the spec of job '{job}' keeps changing; try again.")
