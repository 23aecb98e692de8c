"""Multi-head attention as a sum of heads, each owning its block of W_o: chapter 7's model.

- `HeadWithOutput`: one head with its block W_O,i of the output projection.
- `SumOfHeadsAttention`: multi-head attention as head_1 W_O,1 + ... + head_h W_O,h, so that equal
  heads stay equal bit for bit.
- `AttentionReadout`: one such layer and a linear readout, small enough to train on a CPU in seconds.
- `make_heads_identical`, `head_difference`: start every head from the same weights, and measure how
  far apart the heads are.
- `knock_out_mask`: a mask that silences chosen heads (a query that may attend to nothing gets a
  zero output, so the head contributes nothing).

Chapter 7's task and its sweeps over seeds are in `mha.experiments.heads`, which imports these too.
"""

import numpy as np
import torch
from torch import nn

import mha.torch as mt
from mha import validate


class HeadWithOutput(mt.HeadAttention):
    """One head that owns W_q, W_k, W_v and its block W_O,i of the output projection.

    forward returns head_i W_O,i, of shape (..., T_q, d_model): this head's term
    in the sum that makes multi-head attention.
    """

    def __init__(self, d_model, d_head, *, device=None, dtype=None):
        super().__init__(d_model, d_head, device=device, dtype=dtype)
        self.W_o = nn.Linear(d_head, d_model, bias=False, device=device, dtype=dtype)

    def forward(self, x, context=None, mask=None, return_weights=False):
        out, weights = super().forward(x, context, mask, return_weights=True)  # (..., T_q, d_head)
        out = self.W_o(out)  # (..., T_q, d_model)
        return (out, weights) if return_weights else out

    def numpy_params(self):
        return {**super().numpy_params(), "W_o": mt.linear_weight(self.W_o)}


class SumOfHeadsAttention(nn.Module):
    """Multi-head attention written as a sum: head_1 W_O,1 + ... + head_h W_O,h.

    The same function as chapter 4's `MultiHeadAttentionLoop` (concatenate, then
    W_o), and the same random start for the same seed, but every head owns its
    block of W_o. No matrix product ever holds two heads, so two heads with equal
    weights compute bit-for-bit equal outputs and gradients on any CPU or GPU,
    with any number of threads. d_head defaults to d_model // n_heads (narrow).
    """

    def __init__(self, d_model, n_heads, d_head=None, *, device=None, dtype=None):
        super().__init__()
        loop = mt.MultiHeadAttentionLoop(d_model, n_heads, d_head, device=device, dtype=dtype)  # the random start
        self.d_model, self.n_heads = loop.d_model, loop.n_heads
        d_head, device = loop.heads[0].W_q.out_features, loop.W_o.weight.device
        # Empty heads (made on `meta`, so no random draw), then filled with the loop's weights.
        self.heads = nn.ModuleList(HeadWithOutput(d_model, d_head, device="meta", dtype=dtype).to_empty(device=device)
                                   for _ in range(n_heads))
        self.copy_loop(loop)

    @classmethod
    def from_loop(cls, loop):
        """The same weights as a `mha.torch.MultiHeadAttentionLoop`, W_o cut into its heads' blocks."""
        if not isinstance(loop, mt.MultiHeadAttentionLoop):
            raise TypeError(f"expected a mha.torch.MultiHeadAttentionLoop, got {type(loop).__name__}")
        weight = loop.W_o.weight
        ours = cls(loop.d_model, loop.n_heads, loop.heads[0].W_q.out_features, device=weight.device, dtype=weight.dtype)
        return ours.copy_loop(loop)

    @torch.no_grad()
    def copy_loop(self, loop):
        blocks = loop.W_o.weight.chunk(self.n_heads, dim=1)  # W_O,i as nn.Linear stores it: (d_model, d_head)
        for head, source, block in zip(self.heads, loop.heads, blocks):
            head.load_state_dict({**source.state_dict(), "W_o.weight": block})  # copies: no storage shared
        return self

    def forward(self, x, context=None, mask=None, return_weights=False):
        source, batch = mt.check_x_and_context(self, x, context, self.d_model)
        shape = (*batch, self.n_heads, x.shape[-2], source.shape[-2])
        if mask is not None:
            mt.check_mask_tensor(mask, shape, like=x)
            mask = mask.expand(shape)  # (..., h, T_q, T_k)
        results = [head(x, context, None if mask is None else mask[..., i, :, :], return_weights=True)
                   for i, head in enumerate(self.heads)]
        terms = torch.stack([term for term, _ in results])  # (h, ..., T_q, d_model): head_i W_O,i
        weights = torch.stack([w for _, w in results], dim=-3)  # (..., h, T_q, T_k)
        out = terms.sum(dim=0)  # (..., T_q, d_model)
        return (out, weights) if return_weights else out

    def numpy_params(self):
        """{"heads": [(W_q, W_k, W_v), ...], "W_o": ...} for `mha.numpy.multihead_attention_loop`."""
        params = [head.numpy_params() for head in self.heads]
        heads = [(p["W_q"], p["W_k"], p["W_v"]) for p in params]
        return {"heads": heads, "W_o": np.concatenate([p["W_o"] for p in params])}  # (h * d_head, d_model)


class AttentionReadout(nn.Module):
    """Multi-head attention as a sum of heads (`SumOfHeadsAttention`), then a linear readout.

    d_head defaults to d_model // n_heads (narrow heads); d_head=d_model is wide.
    """

    def __init__(self, d_model, n_heads, d_out, d_head=None):
        super().__init__()
        self.attention = SumOfHeadsAttention(d_model, n_heads, d_head)
        self.readout = nn.Linear(d_model, d_out)

    def forward(self, x, mask=None, return_weights=False):
        out, weights = self.attention(x, mask=mask, return_weights=True)
        out = self.readout(out)  # (..., T, d_out)
        return (out, weights) if return_weights else out


def sum_of_heads(module):
    """`module` if it is a SumOfHeadsAttention, else its `.attention` (e.g. an AttentionReadout)."""
    attention = getattr(module, "attention", module)
    if not isinstance(attention, SumOfHeadsAttention):
        raise TypeError("expected a mha.experiments.summed_heads.SumOfHeadsAttention or a model whose .attention is one, "
                        f"got {type(module).__name__}")
    return attention


def head_difference(module):
    """The largest |difference| between any head's parameters (W_q, W_k, W_v, W_o) and head 0's."""
    heads = sum_of_heads(module).heads
    with torch.no_grad():
        return max(float((p - p0).abs().max()) for head in heads
                   for p, p0 in zip(head.parameters(), heads[0].parameters()))


@torch.no_grad()
def make_heads_identical(module):
    """Copy head 0, its block of W_o included, into every other head; returns `module`.

    `module` is a SumOfHeadsAttention or a model whose `.attention` is one. Then
    every head computes the same output and, in training, gets the same
    gradient: the heads stay identical, bit for bit.
    """
    heads = sum_of_heads(module).heads
    for head in heads[1:]:
        head.load_state_dict(heads[0].state_dict())
    return module


def knock_out_mask(n_heads, heads):
    """(h, 1, 1) boolean mask: False for the heads in `heads`, True for the others.

    It broadcasts to (..., h, T_q, T_k). A knocked-out head's queries may attend
    to nothing, so they get zero weights and a zero output.
    """
    validate.check_int("n_heads", n_heads)
    heads = [heads] if isinstance(heads, int) else list(heads)
    for head in heads:
        if not 0 <= head < n_heads:
            raise ValueError(f"head {head} does not exist: there are {n_heads} heads (0 to {n_heads - 1})")
    keep = torch.ones(n_heads, 1, 1, dtype=torch.bool)
    keep[heads] = False
    return keep
