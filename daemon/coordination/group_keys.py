"""The keys of replica groups that span nodes (``job.nodes_per_group`` > 1).

* ``seats/<gid>/<node rank>``: each node's seat, on its session lease (``slots.py``);
* ``generation/<gid>``: ``{"generation": n}``, persistent. Any node of the group moves
  it on by compare-and-swap, from the generation it saw: the first node to start a
  generation, any node to end one (its ranks failed, or a member was lost). A
  generation is started once, so no start ever meets a failed attempt's store;
* ``stores/<gid>``: ``{"generation", "addr", "port", "replica_uuid"}``, on the group's
  first node's lease: where that generation's store is. The group's other nodes start
  their ranks only once it names the current generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyetcd import transactions as txn

from daemon.coordination.job_view import dump, json_dict

Txn = Callable[[list[Any], list[Any], list[Any]], tuple[bool, list[Any]]]


def generation_key(gid: int) -> str:
    return f"generation/{gid}"


def store_key(gid: int) -> str:
    return f"stores/{gid}"


def bump_generation(do_txn: Txn, key: str, seen: int) -> int:
    """Move the generation at `key` from `seen` (0: none yet) to the next one, unless
    another node moved it first; returns the generation now (the next one, or theirs)."""
    after = seen + 1
    compare = (
        [txn.Create(key) == 0] if seen == 0 else [txn.Value(key) == dump({"generation": seen})]
    )
    ok, responses = do_txn(compare, [txn.Put(key, dump({"generation": after}))], [txn.Get(key)])
    if ok:
        return after
    found = responses[0] if responses else []
    current = json_dict(bytes(found[0][0])).get("generation") if found else None
    return current if isinstance(current, int) else seen
