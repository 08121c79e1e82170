"""A rank of a group that spans nodes, cut off from its group's store on another node,
exits as "peers late" (75), which its daemon waits out instead of counting a crash
(daemon/supervision/after_stop.py); within one node, or for any other error, a
failure (1)."""

from __future__ import annotations

import torch.distributed as dist

from trainer.__main__ import group_peers_unreachable
from trainer.config.env import RankEnv


def env(world: int, local: int) -> RankEnv:
    return RankEnv(world_size=world, local_world_size=local)


def test_a_store_timeout_in_a_spanning_group_is_the_peers() -> None:
    spanning = env(4, 2)
    assert group_peers_unreachable(dist.DistStoreError("wait timeout after 8000ms"), spanning)
    assert group_peers_unreachable(dist.DistNetworkError("connect() timed out"), spanning)
    try:  # wrapped, as a library re-raises it
        try:
            raise dist.DistStoreError("wait timeout after 8000ms")
        except dist.DistStoreError as e:
            raise RuntimeError("manager init failed") from e
    except RuntimeError as wrapped:
        assert group_peers_unreachable(wrapped, spanning)


def test_a_gloo_link_that_failed_in_a_spanning_group_is_the_peers() -> None:
    spanning = env(4, 2)
    for text in (
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out "
        "waiting 8000ms for send operation to complete",
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
    ):
        assert group_peers_unreachable(RuntimeError(text), spanning)
        assert not group_peers_unreachable(RuntimeError(text), env(2, 2))


def test_anything_else_or_a_group_on_one_node_is_a_failure() -> None:
    assert not group_peers_unreachable(dist.DistStoreError("wait timeout"), env(2, 2))
    assert not group_peers_unreachable(dist.DistStoreError("wait timeout"), env(1, 1))
    assert not group_peers_unreachable(RuntimeError("CUDA error: out of memory"), env(4, 2))
    assert not group_peers_unreachable(ValueError("bad batch"), env(4, 2))
