"""Attention across the cp ranks by gathering K and V (context.py's ``all_gather``).

Each rank keeps its own queries and all-gathers the keys and values of the whole
sequence over the cp group, puts them back in sequence order, and attends under the
causal mask of its own queries' positions. The all-gather's backward sums each rank's
gradients of the gathered K and V and keeps this rank's part (a reduce-scatter; gloo
has none, so there it is an all-reduce and a slice). K and V are the small tensors of
grouped-query attention, and the gather is one collective per layer, which is why
Llama 3 chose it over a ring for its long-context training.

It stands in for ``torch.nn.functional.scaled_dot_product_attention`` with the same
signature, so any model that calls SDPA through ``F`` (the built-in Llama, Hugging Face
models with ``attn_implementation="sdpa"``) is context-parallel unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

SEQ = -2  # SDPA's layout: [batch, heads, sequence, head_dim]


def chunk_positions(
    seq_len: int, cp: int, rank: int, device: torch.device | None = None
) -> torch.Tensor:
    """The positions cp rank `rank` holds, in order: chunks rank and 2*cp-1-rank of the
    2*cp equal chunks of a sequence (context.py says why); made on `device`, so no copy
    from the host."""
    size = seq_len // (2 * cp)
    head = torch.arange(rank * size, (rank + 1) * size, device=device)
    tail = torch.arange((2 * cp - 1 - rank) * size, (2 * cp - rank) * size, device=device)
    return torch.cat([head, tail])


class GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dimension; backward: each rank's part of the summed
    gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        world = dist.get_world_size(group)
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.world, ctx.rank = group, world, dist.get_rank(group)
        return torch.cat(parts, dim=SEQ)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if dist.get_backend(ctx.group) == "nccl":
            stacked = torch.stack(grad.chunk(ctx.world, dim=SEQ)).contiguous()
            out = torch.empty_like(stacked[0])
            dist.reduce_scatter_tensor(out, stacked, group=ctx.group)
            return out, None
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed.chunk(ctx.world, dim=SEQ)[ctx.rank].contiguous(), None


def _gather(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out: torch.Tensor = GatherSequence.apply(x, group)  # type: ignore[no-untyped-call]
    return out


@functools.lru_cache(maxsize=8)
def gathered_sdpa(
    group: dist.ProcessGroup, seq_len: int, original: Callable[..., torch.Tensor]
) -> Callable[..., Any]:
    """SDPA over this rank's queries and the whole sequence's keys and values of the cp
    ranks of `group`; made once per group (its position tables kept per device)."""
    degree, rank = dist.get_world_size(group), dist.get_rank(group)
    cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The order that sorts gathered positions, and the causal mask of this rank's
        queries (True: may attend), made once per device."""
        if device not in cache:
            every = [chunk_positions(seq_len, degree, r, device) for r in range(degree)]
            order = torch.argsort(torch.cat(every))
            mine = every[rank]
            mask = mine[:, None] >= torch.arange(seq_len, device=device)[None, :]
            cache[device] = order, mask
        return cache[device]

    def sdpa(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if attn_mask is not None:
            raise ValueError(
                "parallel.cp > 1 supports scaled_dot_product_attention with is_causal or no "
                "mask, not an attn_mask; pass is_causal=True, or set parallel.cp = 1."
            )
        local = seq_len // degree
        if query.shape[SEQ] != local or key.shape[SEQ] != local:
            raise ValueError(
                f"parallel.cp = {degree} gives each rank {local} of train.seq_len's "
                f"{seq_len} positions, but attention got {query.shape[SEQ]} queries and "
                f"{key.shape[SEQ]} keys; the model must attend over the sequence it is given."
            )
        order, causal = tables(query.device)
        k = _gather(key, group).index_select(SEQ, order)
        v = _gather(value, group).index_select(SEQ, order)
        extra = {"enable_gqa": True} if enable_gqa else {}
        return original(
            query,
            k,
            v,
            attn_mask=causal if is_causal else None,
            dropout_p=dropout_p,
            scale=scale,
            **extra,
        )

    return sdpa
