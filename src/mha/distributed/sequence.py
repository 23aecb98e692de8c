"""What the two sequence-split schemes (Ulysses, ring attention) share.

Each rank holds some positions of the sequence, whole: all of d_model for those tokens.
The projections W_Q, W_K, W_V and W_O are held whole on every rank (as in data
parallelism: their gradients are summed over ranks, `comm.all_reduce_gradients`), so a
rank projects its own tokens with no communication; only attention, which mixes
positions, needs the others' keys and values.

Layouts of the sequence over P ranks, in 2P chunks of T / (2P) positions:
- "contiguous": rank r holds chunks 2r and 2r + 1 (one block of T / P positions);
- "zigzag": rank r holds chunks r and 2P - 1 - r, one early and one late, so that under a
  causal mask every rank has the same work (Llama 3's context parallelism does this).
"""

import torch
import torch.distributed as dist

from mha.distributed.tensor import as_grouped, rank_and_world
from mha.torch.attention import MultiHeadAttention, merge_heads, split_heads

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f'layout must be "contiguous" or "zigzag", got {layout!r}')
    return layout


def chunk_indices(rank, world_size, layout):
    """The two chunks (of 2P) that `rank` holds."""
    check_layout(layout)
    return (2 * rank, 2 * rank + 1) if layout == "contiguous" else (rank, 2 * world_size - 1 - rank)


def check_sequence_length(T, world_size):
    if T % (2 * world_size):
        raise ValueError(f"sequence length T={T} must be divisible by 2 * world_size = {2 * world_size}: "
                         f"the sequence splits into 2P equal chunks")
    return T // (2 * world_size)


def positions_of(rank, world_size, T, layout, device=None):
    """The global positions (T / P,) that `rank` holds, its two chunks in order. The contiguous
    layout needs only T divisible by P; the zigzag one, by 2P."""
    if check_layout(layout) == "contiguous":
        if T % world_size:
            raise ValueError(f"sequence length T={T} must be divisible by world_size={world_size}")
        return torch.arange(rank * T // world_size, (rank + 1) * T // world_size, device=device)
    size = check_sequence_length(T, world_size)
    return torch.cat([torch.arange(c * size, (c + 1) * size, device=device)
                      for c in chunk_indices(rank, world_size, layout)])


def split_sequence(x, layout="contiguous", group=None, dim=-2):
    """This rank's positions of x (..., T, ...) along `dim`: (..., T / P, ...)."""
    rank, world_size = rank_and_world(group)
    positions = positions_of(rank, world_size, x.shape[dim], layout, device=x.device)
    return x.index_select(dim, positions)


def gather_sequence(x_local, layout="contiguous", group=None, dim=-2):
    """The whole sequence from every rank's part (an all-gather, not counted: a check, not the
    scheme): (..., T / P, ...) -> (..., T, ...) in position order, on every rank."""
    rank, world_size = rank_and_world(group)
    parts = [torch.empty_like(x_local) for _ in range(world_size)]
    dist.all_gather(parts, x_local.contiguous(), group=group)
    T = x_local.shape[dim] * world_size
    order = torch.cat([positions_of(r, world_size, T, layout) for r in range(world_size)])  # (T,)
    whole = torch.cat(parts, dim=dim)  # (..., T, ...) in rank order
    return whole.index_select(dim, torch.argsort(order).to(whole.device))  # in position order


def check_module(module, scheme):
    """(h, h_kv, d_head, options) of an attention module a sequence-split scheme can run."""
    n_heads, n_kv_heads, d_head, options = as_grouped(module)
    if options.get("sliding_window") is not None or options.get("logit_cap") is not None:
        raise ValueError(f"{scheme} here computes softmax attention with causal and padding masks: "
                         f"sliding_window and logit_cap are not computed")
    if (options.get("rope_scaling") or {}).get("rope_type") == "dynamic":
        raise ValueError(f"{scheme}: dynamic NTK scaling depends on the whole length, which no rank holds")
    return n_heads, n_kv_heads, d_head, options


def project(module, x, positions):
    """q (B.., h, L, d_head) and k, v (B.., h_kv, L, d_head) of this rank's tokens x (B.., L, d_model),
    turned by RoPE at their global `positions` (L,) if the module has RoPE."""
    if isinstance(module, MultiHeadAttention):
        return tuple(split_heads(layer(x), module.n_heads) for layer in (module.W_q, module.W_k, module.W_v))
    q, k, v = module.project(x)  # (..., h, L, d_head), (..., h_kv, L, d_head) twice
    if module.rotary is not None:
        q, k = module.rotary.rotate(q, k, 0, positions.expand(*x.shape[:-1]))
    return q, k, v


def output(module, heads):
    """W_O of the attention heads (..., h, L, d_head) -> (..., L, d_model)."""
    return module.W_o(merge_heads(heads))


def key_padding_as_mask(key_padding_mask, like):
    """A (B, T) key-padding mask (True = may attend) as (B, 1, 1, T), or None."""
    if key_padding_mask is None:
        return None
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise ValueError(f"key_padding_mask must be a boolean (B, T) tensor (True = may attend), got "
                         f"{key_padding_mask.dtype} of shape {tuple(key_padding_mask.shape)}")
    return key_padding_mask[:, None, None, :].to(like.device)
