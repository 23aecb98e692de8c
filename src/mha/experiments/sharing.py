"""Chapter 12: what sharing keys and values costs, on chapter 7's two-relation task.

- `GroupedReadout`: one grouped-query attention layer (`mha.torch.GroupedQueryAttention`:
  n_heads query heads sharing n_kv_heads key/value heads) and a linear readout, the
  grouped twin of chapter 7's `AttentionReadout`.
- `train_shared`: train one such model on a `TwoRelationTask` with chapter 7's loop
  (`mha.experiments.tasks.train`) and measure its errors on test sequences.

Everything is seeded: the same arguments give the same model on the same machine.
Training amplifies rounding, so another CPU may print other last digits.
"""

from dataclasses import dataclass

import torch
from torch import nn

import mha.torch as mt
from mha.experiments.tasks import train


class GroupedReadout(nn.Module):
    """Grouped-query attention, then a linear readout: (..., T, d_model) -> (..., T, d_out).

    No positions are added and no causal mask is used: chapter 7's task carries its
    positions in the input, and every token may read every other one.
    """

    def __init__(self, d_model, n_heads, n_kv_heads, d_out, d_head=None):
        super().__init__()
        self.attention = mt.GroupedQueryAttention(d_model, n_heads, n_kv_heads, d_head=d_head)
        self.readout = nn.Linear(d_model, d_out)

    def forward(self, x):
        out, _ = self.attention(x)  # (..., T, d_model)
        return self.readout(out)  # (..., T, d_out)


@dataclass(frozen=True)
class SharingResult:
    """One trained model: its shape, what its keys and values cost, and how well it learned."""

    model: GroupedReadout  # the trained model
    n_heads: int
    n_kv_heads: int
    d_head: int
    kv_parameters: int  # the numbers in W_k and W_v
    cache_width: int  # numbers cached per token: keys and values, 2 * n_kv_heads * d_head
    losses: list  # the training loss of every step
    errors: tuple  # test mean squared errors: (previous token's value, partner's value)


def train_shared(task, n_heads, n_kv_heads, d_head, *, steps=400, lr=0.01, batch_size=64, seed=0, test=None):
    """Train a `GroupedReadout` on `task` (a TwoRelationTask) and measure it on `test`.

    The model's random start comes from torch.manual_seed(seed), its batches from a
    generator seeded with `seed`. `test` is (inputs, targets); by default 512 fresh
    sequences drawn with seed 123, as in chapter 7. Returns a `SharingResult`.
    """
    torch.manual_seed(seed)
    model = GroupedReadout(task.d_in, n_heads, n_kv_heads, task.d_out, d_head=d_head)
    losses = train(model, task.make_batch(batch_size), steps=steps, lr=lr, seed=seed)
    if test is None:
        test = task.batch(512, torch.Generator().manual_seed(123))[:2]
    with torch.no_grad():
        errors = task.part_losses(model(test[0]), test[1])
    layer = model.attention
    kv_parameters = layer.W_k.weight.numel() + layer.W_v.weight.numel()
    return SharingResult(model, n_heads, n_kv_heads, layer.d_head, kv_parameters, 2 * n_kv_heads * layer.d_head,
                         losses, errors)
