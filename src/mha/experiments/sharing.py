"""Chapter 12: what sharing keys and values costs, on chapter 7's two-relation task.

- `GroupedReadout`: one grouped-query attention layer (`mha.torch.GroupedQueryAttention`:
  n_heads query heads sharing n_kv_heads key/value heads) and a linear readout, the
  grouped twin of chapter 7's `AttentionReadout`.
- `train_shared`: train one such model on a `TwoRelationTask` with chapter 7's loop
  (`mha.experiments.tasks.train`) and measure its errors on test sequences.
- `sharing_sweep`: the chapter's experiment on one seed (4, 2 and 1 key/value heads), registered
  as the sweep "ch12_sharing" over 45 seeds; the chapter reads its stored table.
- `median_ratio_interval`: the ratio of two medians over seeds, with a bootstrap interval.

Everything is seeded: the same arguments give the same model on the same machine.
Training amplifies rounding, so another CPU may print other last digits.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import mha.numpy as mnp
import mha.torch as mt
from mha.experiments import seeds
from mha.experiments.heads import TwoRelationTask
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


KV_HEADS = (4, 2, 1)  # key/value heads under four query heads: multi-head, grouped, multi-query
LOSS_WINDOW = 10  # the sweep stores the mean training loss of every 10 steps


@seeds.sweep("ch12_sharing", seeds=range(45), tolerance=1e-3, held_out=(100,))
def sharing_sweep(seed):
    """Chapter 12's experiment on one seed: four query heads of width 5 over 4, 2 and 1 key/value heads.

    Each model is trained by `train_shared` (400 steps, seed `seed`) on chapter 7's task and
    tested on the same 512 sequences (seed 123). For each h_kv in KV_HEADS the row holds
    `previous_error_{h_kv}` and `partner_error_{h_kv}` (test mean squared errors),
    `losses_{h_kv}` (the mean training loss of every LOSS_WINDOW steps), and per query head
    the average weight on the previous token and on the partner (`previous_attention_{h_kv}`,
    `partner_attention_{h_kv}`, 4 numbers each).
    """
    task = TwoRelationTask(T=8, n_symbols=8, d_value=4)
    X_test, Y_test, symbols = task.batch(512, torch.Generator().manual_seed(123))
    row = {}
    for h_kv in KV_HEADS:
        run = train_shared(task, n_heads=4, n_kv_heads=h_kv, d_head=5, seed=seed, test=(X_test, Y_test))
        row[f"previous_error_{h_kv}"], row[f"partner_error_{h_kv}"] = run.errors
        row[f"losses_{h_kv}"] = np.reshape(run.losses, (-1, LOSS_WINDOW)).mean(axis=1)  # (steps / 10,)
        with torch.no_grad():
            _, weights = run.model.attention(X_test, return_weights=True)  # (B, h, T, T)
        row[f"previous_attention_{h_kv}"] = mnp.attention_at_offset(weights.numpy(), -1).mean(axis=0)  # (h,)
        row[f"partner_attention_{h_kv}"] = task.partner_attention(weights, symbols).numpy()  # (h,)
    return row


def median_ratio_interval(errors, reference, *, resamples=4000, level=0.95, seed=0):
    """median(errors) / median(reference) over seeds, with a percentile bootstrap interval.

    `errors` and `reference` hold one number per seed, the same seeds in the same order. Each of
    `resamples` draws picks len(errors) seeds with replacement (the same seeds for both), and the
    interval holds the central `level` of the draws' ratios. Returns (ratio, low, high).
    """
    errors, reference = np.asarray(errors, dtype=float), np.asarray(reference, dtype=float)
    picks = np.random.default_rng(seed).integers(len(errors), size=(resamples, len(errors)))  # (resamples, n)
    ratios = np.median(errors[picks], axis=1) / np.median(reference[picks], axis=1)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(errors) / np.median(reference)), float(low), float(high)
