"""Ring attention: the sequence split over ranks, key/value blocks passed around a ring.

Each rank keeps its queries and starts with its own keys and values. At each of P steps
it computes the attention of its queries on the key/value block it holds, merges that
partial result into its running one, and passes the block to the next rank on the ring
(0 -> 1 -> ... -> P - 1 -> 0) while receiving the previous rank's. After P steps every
query has seen every key, and no rank ever held more than two blocks.

The merge is chapter 8's online softmax. A partial result on some keys is (o, lse): the
softmax-weighted average o of their values and lse = log sum exp of their scores (-inf and
o = 0 for a query that may attend to none of them). Two partials on disjoint keys merge into

    lse = log(exp(lse_a) + exp(lse_b)),   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b.

Work. The ranks hold 2P chunks of T / (2P) positions (mha.distributed.sequence). Under a
causal mask, a (query chunk, key chunk) pair whose every key comes after every query is
skipped. With the contiguous split rank r computes 4r + 3 pairs, so the last rank does
(4P - 1) / 3 times the first one's work and the others wait for it; the zigzag split gives
every rank one early and one late chunk, and each computes 2P + 1 pairs.

Gradients. send/recv carry no gradient, so `RingAttentionFunction` has its own backward:
the key/value blocks go around the ring again, each with the gradients dK, dV accumulated
by the ranks it has visited, and a last step brings every block's gradients home.
"""

import torch
from torch import nn

import mha.distributed.comm as comm
from mha.distributed.sequence import (
    check_layout, check_module, check_sequence_length, chunk_indices, output, positions_of, project,
)
from mha.distributed.tensor import rank_and_world
from mha.torch.grouped import repeat_kv


class RingPlan:
    """What every step of one ring attention call needs: who holds which positions, the masks."""

    def __init__(self, rank, world_size, T, layout, causal, key_padding_mask, scale, d_head, group):
        self.rank, self.world_size, self.group = rank, world_size, group
        self.chunk = check_sequence_length(T, world_size)  # c = T / (2P) positions per chunk
        self.layout, self.causal, self.key_padding_mask = layout, causal, key_padding_mask
        self.scale = d_head ** -0.5 if scale is None else scale

    def positions(self, owner, device):
        """(2, c): the global positions of `owner`'s two chunks."""
        c = self.chunk
        return torch.stack([torch.arange(i * c, (i + 1) * c, device=device)
                            for i in chunk_indices(owner, self.world_size, self.layout)])

    def pairs(self, owner, device):
        """(a, b, allowed) for each pair of this rank's query chunk a and `owner`'s key chunk b that
        the mask does not rule out entirely; allowed: booleans broadcasting to (B, h, c, c), or None."""
        mine, theirs = self.positions(self.rank, device), self.positions(owner, device)
        for a in range(2):
            for b in range(2):
                q_pos, k_pos = mine[a], theirs[b]
                if self.causal and k_pos[0] > q_pos[-1]:
                    continue  # every key after every query: nothing to compute
                yield a, b, self.allowed(q_pos, k_pos)

    def allowed(self, q_pos, k_pos):
        allowed = None
        if self.causal:
            allowed = (k_pos[None, :] <= q_pos[:, None])[None, None]  # (1, 1, c, c)
        if self.key_padding_mask is not None:
            keys = self.key_padding_mask[:, k_pos][:, None, None, :]  # (B, 1, 1, c)
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def count(self, n_pairs, batch, heads, d_head, direction):
        comm.record_work("chunk_pairs", direction, n_pairs)
        comm.record_work("multiply_adds", direction, n_pairs * 2 * batch * heads * self.chunk ** 2 * d_head)


def chunk(x, i, c):
    """Chunk i (of 2) of x (..., 2c, d): (..., c, d), a view."""
    return x[..., i * c:(i + 1) * c, :]


def masked_scores(q, k, allowed, scale):
    """Scores (..., c_q, c_k), -inf where not allowed."""
    scores = (q @ k.transpose(-2, -1)) * scale
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


def finite_or_zero(x):
    return torch.where(x.isfinite(), x, torch.zeros_like(x))


# lse is kept in float64: a float32 lse of about 30 is off by up to 2e-6, and exp(s - lse) in the
# backward would carry that error into every gradient. (B, h, T / P) numbers cost nothing.
LSE_DTYPE = torch.float64


def attend_block(q, k, v, allowed, scale):
    """One partial result: (o (..., c_q, d_head), lse (..., c_q), float64) of queries q on keys k, values v."""
    scores = masked_scores(q, k, allowed, scale)  # (..., c_q, c_k)
    row_max = finite_or_zero(scores.amax(dim=-1, keepdim=True))  # a row with no key: 0, not -inf
    p = torch.exp(scores - row_max)  # (..., c_q, c_k); 0 where masked
    total = p.sum(dim=-1, keepdim=True)  # (..., c_q, 1)
    o = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    lse = row_max.to(LSE_DTYPE) + torch.log(total.to(LSE_DTYPE))  # log 0 = -inf for a row with no key
    return o, lse.squeeze(-1)  # (..., c_q, d_head), (..., c_q)


def merge_partials(out_a, lse_a, out_b, lse_b):
    """The online-softmax merge of two partial results on disjoint keys: (out, lse).

    out_*: (..., T_q, d_v); lse_*: (..., T_q). A row that is -inf in both stays (0, -inf).
    The twin of mha.numpy.merge_partials."""
    lse = torch.logaddexp(lse_a, lse_b)  # (..., T_q)
    safe = finite_or_zero(lse)
    weight_a = torch.exp(lse_a - safe).to(out_a.dtype)[..., None]  # (..., T_q, 1)
    weight_b = torch.exp(lse_b - safe).to(out_b.dtype)[..., None]
    return weight_a * out_a + weight_b * out_b, lse


def fold_groups(x, n_kv_heads):
    """(B, h, c, d) gradients of repeated key/value heads -> (B, h_kv, c, d), summed over each group."""
    return x.unflatten(-3, (n_kv_heads, -1)).sum(dim=-3)  # (B, h_kv, n_rep, c, d) summed over n_rep


class RingAttentionFunction(torch.autograd.Function):
    """Ring attention's forward (blocks around the ring, merged online) and backward (blocks around
    again with their gradients, which a last step brings home)."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        c, n_rep = plan.chunk, q.shape[-3] // k.shape[-3]
        outs = [torch.zeros_like(chunk(q, a, c)) for a in range(2)]  # (B, h, c, d_head) each
        lses = [torch.full((*q.shape[:-2], c), float("-inf"), dtype=LSE_DTYPE, device=q.device)
                for _ in range(2)]  # (B, h, c) each
        block, n_pairs = (k, v), 0
        for step in range(plan.world_size):
            owner = (plan.rank - step) % plan.world_size
            passing = comm.RingPass(block, "forward", plan.group) if step < plan.world_size - 1 else None
            k_held, v_held = block
            for a, b, allowed in plan.pairs(owner, q.device):
                o, lse = attend_block(chunk(q, a, c), repeat_kv(chunk(k_held, b, c), n_rep),
                                      repeat_kv(chunk(v_held, b, c), n_rep), allowed, plan.scale)
                outs[a], lses[a] = merge_partials(outs[a], lses[a], o, lse)
                n_pairs += 1
            if passing is not None:
                block = tuple(passing.wait())  # the previous rank's block, sent during the computation
        plan.count(n_pairs, q.shape[0], q.shape[-3], q.shape[-1], "forward")
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)[..., None]  # (B, h, 2c, d_head), (B, h, 2c, 1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        c, h_kv = plan.chunk, k.shape[-3]
        n_rep = q.shape[-3] // h_kv
        delta = (d_out * out).sum(dim=-1, keepdim=True)  # (B, h, 2c, 1): rowsum(dO * O)
        lse = finite_or_zero(lse)  # a row with no key has p = 0 everywhere: any finite value will do
        d_q = torch.zeros_like(q)
        block, n_pairs = [k, v, torch.zeros_like(k), torch.zeros_like(v)], 0
        for step in range(plan.world_size):
            owner = (plan.rank - step) % plan.world_size
            k_held, v_held, dk_held, dv_held = block
            for a, b, allowed in plan.pairs(owner, q.device):
                q_a, dout_a = chunk(q, a, c), chunk(d_out, a, c)  # (B, h, c, d_head)
                k_b, v_b = repeat_kv(chunk(k_held, b, c), n_rep), repeat_kv(chunk(v_held, b, c), n_rep)
                scores = masked_scores(q_a, k_b, allowed, plan.scale)  # (B, h, c, c)
                p = torch.exp((scores.to(LSE_DTYPE) - chunk(lse, a, c)).to(q.dtype))  # the softmax's weights
                d_scores = p * (dout_a @ v_b.transpose(-2, -1) - chunk(delta, a, c))  # (B, h, c, c)
                chunk(d_q, a, c).add_(d_scores @ k_b, alpha=plan.scale)
                chunk(dk_held, b, c).add_(fold_groups(d_scores.transpose(-2, -1) @ q_a, h_kv), alpha=plan.scale)
                chunk(dv_held, b, c).add_(fold_groups(p.transpose(-2, -1) @ dout_a, h_kv))
                n_pairs += 1
            if plan.world_size == 1:
                break
            if step < plan.world_size - 1:
                block = comm.ring_pass(block, "backward", plan.group)  # the block with its gradients so far
            else:
                block = [None, None, *comm.ring_pass([dk_held, dv_held], "backward", plan.group)]  # home
        plan.count(n_pairs, q.shape[0], q.shape[-3], q.shape[-1], "backward")
        return d_q, block[2], block[3], None


def check_ring_inputs(q, k, v, key_padding_mask, world_size):
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(f"q, k, v must be tensors, got {', '.join(type(t).__name__ for t in (q, k, v))}")
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[0] != k.shape[0] \
            or q.shape[2:] != k.shape[2:] or q.shape[1] % k.shape[1]:
        raise ValueError(f"ring attention takes q (B, h, T/P, d_head) and k, v (B, h_kv, T/P, d_head) with h_kv "
                         f"dividing h; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    T = q.shape[-2] * world_size
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool
                                         or tuple(key_padding_mask.shape) != (q.shape[0], T)):
        raise ValueError(f"key_padding_mask must be boolean of shape (B, T) = ({q.shape[0]}, {T}), True = may "
                         f"attend; got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
    return T


def ring_attention(q, k, v, *, layout="zigzag", causal=False, key_padding_mask=None, scale=None, group=None):
    """Attention of a sequence split over ranks, key/value blocks passed around the ring.

    q: (B, h, T / P, d_head), k, v: (B, h_kv, T / P, d_head): this rank's positions in `layout`
    order (mha.distributed.split_sequence(x, layout)); key_padding_mask: (B, T), the whole
    sequence, True = may attend. Returns (B, h, T / P, d_head), this rank's positions of the
    attention output; differentiable in q, k and v."""
    rank, world_size = rank_and_world(group)
    check_layout(layout)
    T = check_ring_inputs(q, k, v, key_padding_mask, world_size)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(q.device)
    plan = RingPlan(rank, world_size, T, layout, causal, key_padding_mask, scale, q.shape[-1], group)
    return RingAttentionFunction.apply(q, k, v, plan)


class RingAttention(nn.Module):
    """A MultiHeadAttention or GroupedQueryAttention run by ring attention over `group`'s ranks.

    Built on every rank from the same module, whose weights it shares (gradients land in the
    module's parameters: sum them over ranks with comm.all_reduce_gradients). forward(x,
    key_padding_mask=None, *, causal=False): x (B, T / P, d_model), this rank's positions in the
    layout's order (split_sequence(x, layout)); key_padding_mask (B, T), the whole sequence.
    Returns (B, T / P, d_model)."""

    def __init__(self, module, layout="zigzag", group=None):
        super().__init__()
        self.rank, self.world_size = rank_and_world(group)
        _, _, _, options = check_module(module, "ring attention")
        self.module, self.layout, self.group = module, check_layout(layout), group
        self.scale = options.get("scale")

    def forward(self, x, key_padding_mask=None, *, causal=False):
        positions = positions_of(self.rank, self.world_size, x.shape[-2] * self.world_size, self.layout,
                                 device=x.device)  # (T / P,)
        q, k, v = project(self.module, x, positions)  # (B, h, T / P, d_head), (B, h_kv, T / P, d_head)
        heads = ring_attention(q, k, v, layout=self.layout, causal=causal, key_padding_mask=key_padding_mask,
                               scale=self.scale, group=self.group)  # (B, h, T / P, d_head)
        return output(self.module, heads)  # (B, T / P, d_model)
