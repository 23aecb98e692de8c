"""Chapter 7: experiments on why the heads of one layer end up different.

- `TwoRelationTask`: random sequences whose targets need two relations at once,
  one set by position (the previous token) and one by content (the other token
  with the same symbol).
- `AttentionReadout`: one multi-head attention layer and a linear readout, small
  enough to train on a CPU in seconds.
- `make_heads_identical`, `head_difference`: start every head from the same
  weights, and measure how far apart the heads are.
- `knock_out_mask`: a mask that silences chosen heads (a query that may attend to
  nothing gets a zero output, so the head contributes nothing).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt
from mha import validate


@dataclass(frozen=True)
class TwoRelationTask:
    """Sequences of T tokens; each of T // 2 symbols appears exactly twice.

    Token t carries a one-hot symbol (n_symbols wide), a random value vector
    (d_value wide) and a one-hot position (T wide), in that order. Its target is
    two values side by side: the value of the previous token (token T - 1 for
    t = 0) and the value of its partner, the other token with the same symbol.
    """

    T: int = 8
    n_symbols: int = 8
    d_value: int = 4

    def __post_init__(self):
        validate.check_int("T", self.T, minimum=2)
        if self.T % 2 or self.n_symbols < self.T // 2:
            raise ValueError(f"T must be even and n_symbols >= T // 2, got T={self.T}, "
                             f"n_symbols={self.n_symbols}")

    @property
    def d_in(self):
        return self.n_symbols + self.d_value + self.T

    @property
    def d_out(self):
        return 2 * self.d_value

    def symbols(self, batch_size, generator=None):
        """(B, T) symbols: T // 2 distinct ones per sequence, each twice, shuffled."""
        chosen = torch.rand(batch_size, self.n_symbols, generator=generator).argsort(-1)
        pairs = chosen[:, : self.T // 2].repeat(1, 2)  # (B, T), each symbol twice
        order = torch.rand(batch_size, self.T, generator=generator).argsort(-1)
        return pairs.gather(1, order)  # (B, T)

    def batch(self, batch_size, generator=None):
        """Inputs (B, T, d_in), targets (B, T, d_out) and the symbols (B, T)."""
        symbols = self.symbols(batch_size, generator)
        values = torch.randn(batch_size, self.T, self.d_value, generator=generator)
        positions = torch.eye(self.T).expand(batch_size, self.T, self.T)
        X = torch.cat([F.one_hot(symbols, self.n_symbols).float(), values, positions], dim=-1)
        previous = values.roll(1, dims=1)  # previous[:, t] = values[:, t - 1]
        partner = self.partners(symbols)  # (B, T)
        matched = values.gather(1, partner[..., None].expand(-1, -1, self.d_value))
        return X, torch.cat([previous, matched], dim=-1), symbols

    def partners(self, symbols):
        """(B, T): the position of the other token with the same symbol."""
        same = symbols[:, :, None] == symbols[:, None, :]  # (B, T, T)
        same &= ~torch.eye(self.T, dtype=torch.bool)
        return same.float().argmax(-1)

    def partner_attention(self, weights, symbols):
        """Average weight a query gives to its partner: weights (B, h, T, T) -> (h,)."""
        partner = self.partners(symbols)[:, None, :, None]  # (B, 1, T, 1)
        picked = weights.gather(-1, partner.expand(*weights.shape[:-1], 1))  # (B, h, T, 1)
        return picked.mean(dim=(0, 2, 3))

    def part_losses(self, prediction, targets):
        """Mean squared errors of the two halves of the target: (previous, partner), as floats."""
        errors = ((prediction - targets) ** 2).detach()
        return (float(errors[..., : self.d_value].mean()), float(errors[..., self.d_value:].mean()))

    def make_batch(self, batch_size):
        """A function generator -> (inputs, targets), as `mha.tasks.train` wants."""
        return lambda generator: self.batch(batch_size, generator)[:2]

    def labels(self, symbols):
        """Token labels for one sequence of symbols, e.g. ['0 C', '1 A', ...]."""
        return [f"{t} {'ABCDEFGHIJKLMNOPQRSTUVWXYZ'[s]}" for t, s in enumerate(symbols.tolist())]


class AttentionReadout(nn.Module):
    """Multi-head attention (the loop of chapter 4), then a linear readout.

    d_head defaults to d_model // n_heads (narrow heads); d_head=d_model is wide.
    """

    def __init__(self, d_model, n_heads, d_out, d_head=None):
        super().__init__()
        self.attention = mt.MultiHeadAttentionLoop(d_model, n_heads, d_head)
        self.readout = nn.Linear(d_model, d_out)

    def forward(self, x, mask=None, return_weights=False):
        out, weights = self.attention(x, mask=mask, return_weights=True)
        out = self.readout(out)  # (..., T, d_out)
        return (out, weights) if return_weights else out


def loop_attention(module):
    """`module` if it is a MultiHeadAttentionLoop, else its `.attention` (e.g. an AttentionReadout)."""
    attention = getattr(module, "attention", module)
    if not isinstance(attention, mt.MultiHeadAttentionLoop):
        raise TypeError("expected a mha.torch.MultiHeadAttentionLoop or a model whose .attention is one, "
                        f"got {type(module).__name__}")
    return attention


def head_blocks(module):
    """Per head, its parameters as one flat tensor: W_q, W_k, W_v and its W_o columns."""
    attention = loop_attention(module)
    columns = attention.W_o.weight.detach().chunk(attention.n_heads, dim=1)  # W_o's columns, per head
    return [torch.cat([p.detach().reshape(-1) for p in head.parameters()] + [c.reshape(-1)])
            for head, c in zip(attention.heads, columns)]


def head_difference(module):
    """The largest |difference| between any head's parameters and head 0's."""
    blocks = head_blocks(module)
    return max(float((b - blocks[0]).abs().max()) for b in blocks)


@torch.no_grad()
def make_heads_identical(module):
    """Copy head 0 into every other head, W_o's columns included; returns `module`.

    `module` is a MultiHeadAttentionLoop or a model whose `.attention` is one.
    Then every head computes the same output and, in training, gets the same
    gradient: the heads stay identical.
    """
    attention = loop_attention(module)
    columns = attention.W_o.weight.chunk(attention.n_heads, dim=1)  # views into W_o
    for head, block in zip(attention.heads[1:], columns[1:]):
        head.load_state_dict(attention.heads[0].state_dict())
        block.copy_(columns[0])
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
