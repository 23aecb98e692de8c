"""Sequence parallelism by all-to-all (DeepSpeed-Ulysses): split by positions outside
attention, by heads inside it.

Each rank holds T / P positions of every head. Attention mixes positions, not heads, so
one all-to-all trades the split: rank s sends rank r its positions of r's heads, and
afterwards every rank holds h / P heads over all T positions,

    (B, h, T / P, d_head) on each rank  --all-to-all-->  (B, h / P, T, d_head) on each rank,

computes those heads' attention over the whole sequence, and a second all-to-all brings
the output back to (B, h, T / P, d_head). Four tensors move per layer (q, k, v and the
output), each rank handing its whole q, k, v and output: B (T / P) d_head (2h + 2h_kv)
elements, of which (P - 1) / P leave the rank.
"""

from torch import nn

import mha.distributed.comm as comm
from mha.distributed.sequence import check_module, key_padding_as_mask, output, positions_of, project
from mha.distributed.tensor import rank_and_world
from mha.torch.grouped import grouped_attention, repeat_kv


def heads_to_ranks(x, group=None):
    """(B, heads, T / P, d_head) on each rank -> (B, heads / P, T, d_head): the all-to-all that
    trades a split by positions for a split by heads."""
    return comm.all_to_all(x, scatter_dim=-3, gather_dim=-2, group=group)


def positions_to_ranks(x, group=None):
    """(B, heads / P, T, d_head) -> (B, heads, T / P, d_head): the inverse all-to-all."""
    return comm.all_to_all(x, scatter_dim=-2, gather_dim=-3, group=group)


def ulysses_attention(q, k, v, *, causal=False, key_padding_mask=None, scale=None, group=None):
    """Attention of a sequence split contiguously over ranks, through two all-to-alls.

    q: (B, h, T / P, d_head) and k, v: (B, h_kv, T / P, d_head), this rank's positions
    (mha.distributed.split_sequence, layout "contiguous"); key_padding_mask: (B, T) for the whole
    sequence, True = may attend. Returns (B, h, T / P, d_head): this rank's positions of the
    attention output. P must divide h. Key/value heads that P does not divide are repeated first:
    to P heads, one per rank, when P is a multiple of h_kv, else to h (more payload, the same result)."""
    _, world_size = rank_and_world(group)
    h, h_kv = q.shape[-3], k.shape[-3]
    if h % world_size:
        raise ValueError(f"n_heads={h} is not divisible by world_size={world_size}: Ulysses gives each rank "
                         f"h / P whole heads")
    if h_kv % world_size:
        copies = world_size // h_kv if world_size % h_kv == 0 else h // h_kv
        k, v = repeat_kv(k, copies), repeat_kv(v, copies)  # (B, h_kv * copies, T / P, d_head): replicated
    q, k, v = (heads_to_ranks(t, group) for t in (q, k, v))  # (B, h / P, T, d_head), (B, h_kv / P, T, d_head)
    mask = key_padding_as_mask(key_padding_mask, q)  # (B, 1, 1, T) or None
    out, _ = grouped_attention(q, k, v, 0, causal=causal, mask=mask, scale=scale)  # (B, h / P, T, d_head)
    return positions_to_ranks(out, group)  # (B, h, T / P, d_head)


class UlyssesAttention(nn.Module):
    """A MultiHeadAttention or GroupedQueryAttention run by Ulysses over the ranks of `group`.

    Built on every rank from the same module, whose weights it shares (not copied: the
    gradients land in `module`'s parameters; sum them over ranks with
    comm.all_reduce_gradients(module)). forward(x, key_padding_mask=None, *, causal=False):
    x (B, T / P, d_model), this rank's contiguous positions; key_padding_mask (B, T) for the
    whole sequence. Returns (B, T / P, d_model)."""

    def __init__(self, module, group=None):
        super().__init__()
        self.rank, self.world_size = rank_and_world(group)
        n_heads, _, _, options = check_module(module, "Ulysses")
        if n_heads % self.world_size:
            raise ValueError(f"n_heads={n_heads} is not divisible by world_size={self.world_size}: Ulysses "
                             f"gives each rank h / P whole heads")
        self.module, self.group, self.scale = module, group, options.get("scale")

    def forward(self, x, key_padding_mask=None, *, causal=False):
        positions = positions_of(self.rank, self.world_size, x.shape[-2] * self.world_size, "contiguous",
                                 device=x.device)  # (T / P,)
        q, k, v = project(self.module, x, positions)  # (B, h, T / P, d_head), (B, h_kv, T / P, d_head)
        heads = ulysses_attention(q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=self.scale,
                                  group=self.group)  # (B, h, T / P, d_head)
        return output(self.module, heads)  # (B, T / P, d_model)
