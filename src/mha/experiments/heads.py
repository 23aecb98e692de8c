"""Chapter 7: experiments on why the heads of one layer end up different.

- `TwoRelationTask`: random sequences whose targets need two relations at once,
  one set by position (the previous token) and one by content (the other token
  with the same symbol).
- The model, from `mha.experiments.summed_heads` and importable from here too:
  `SumOfHeadsAttention` (multi-head attention as a sum of heads, each owning its
  block of W_o, `HeadWithOutput`, so that equal heads stay equal bit for bit),
  `AttentionReadout` (one such layer and a linear readout), `make_heads_identical`,
  `head_difference` and `knock_out_mask`.
- Sweeps over seeds (`mha.experiments.seeds`), whose stored tables the chapters read:
  chapter 7's trainings ("ch07_two_heads", "ch07_layouts", "ch07_almost_identical",
  "ch07_conv_filters", "ch07_perturbation"), with the small functions they use.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mha.numpy as mnp
from mha import validate
from mha.experiments import seeds, tasks
from mha.experiments.summed_heads import (  # noqa: F401 (chapter 7 and the tests import the model from here)
    AttentionReadout, HeadWithOutput, SumOfHeadsAttention, head_difference, knock_out_mask, make_heads_identical,
    sum_of_heads,
)


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
        """A function generator -> (inputs, targets), as `mha.experiments.tasks.train` wants."""
        return lambda generator: self.batch(batch_size, generator)[:2]

    def labels(self, symbols):
        """Token labels for one sequence of symbols, e.g. ['0 C', '1 A', ...]."""
        return [f"{t} {'ABCDEFGHIJKLMNOPQRSTUVWXYZ'[s]}" for t, s in enumerate(symbols.tolist())]


# Claims over seeds (CONTRIBUTING.md). Each sweep is a function seed -> {name: number or list};
# tools/data/seed_sweeps.py stores its table in seed_tables/, the chapters read it, and
# tests/test_claims_ch06.py and tests/test_claims_ch07.py re-derive one row of each.

TASK = TwoRelationTask(T=8, n_symbols=8, d_value=4)  # chapter 7's task
LAYOUTS = ((1, 20), (2, 10), (4, 5), (1, 40), (2, 20), (4, 10))  # chapter 7's (h, d_head): budgets 20 and 40


def held_out(task=TASK):
    """Chapter 7's test sequences: 512 drawn with seed 123, as (inputs, targets, symbols)."""
    return task.batch(512, torch.Generator().manual_seed(123))


def trained_readout(seed, n_heads=2, d_head=None, *, identical=False, steps=400, task=TASK):
    """An AttentionReadout as chapter 7 trains it: torch.manual_seed(seed) for its start (every
    head a copy of head 0 if `identical`), Adam at lr 0.01 on batches of 64 drawn with `seed`."""
    torch.manual_seed(seed)
    model = AttentionReadout(task.d_in, n_heads, task.d_out, d_head)
    if identical:
        make_heads_identical(model)
    tasks.train(model, task.make_batch(64), steps=steps, lr=0.01, seed=seed)
    return model


@torch.no_grad()
def relation_scores(model, inputs, symbols, task=TASK):
    """(previous, partner): each head's average weight on the previous token and on the partner."""
    _, weights = model(inputs, return_weights=True)  # (B, h, T, T)
    previous = mnp.attention_at_offset(weights.numpy(), -1).mean(axis=0)  # (h,)
    return previous, task.partner_attention(weights, symbols).numpy()


@seeds.sweep("ch07_two_heads", seeds=range(10), tolerance=0.05, held_out=(100, 101))
def two_heads(seed):
    """Chapter 7's first experiment from `seed`: two random heads and two identical heads, 400 steps.

    The heads' largest difference (`difference`, `twin_difference`) and the test errors on the
    (previous, partner) halves (`errors`, `twin_errors`); for the random heads, each head's
    average weight on the previous token and on the partner (`previous_scores`, `partner_scores`),
    which head is which (`previous_head`, `partner_head`), the weight of token 0 on the last token
    in the previous-token head (`wrap`), and the errors with one of the two heads knocked out.
    """
    X, Y, symbols = held_out()
    model, twin = trained_readout(seed), trained_readout(seed, identical=True)
    previous, partner = relation_scores(model, X, symbols)
    previous_head, partner_head = int(previous.argmax()), int(partner.argmax())
    with torch.no_grad():
        _, weights = model(X, return_weights=True)  # (B, h, T, T)
        return {"difference": head_difference(model), "twin_difference": head_difference(twin),
                "errors": TASK.part_losses(model(X), Y), "twin_errors": TASK.part_losses(twin(X), Y),
                "previous_scores": previous, "partner_scores": partner,
                "previous_head": previous_head, "partner_head": partner_head,
                "wrap": weights[:, previous_head, 0, -1].mean().item(),
                "without_previous_head": TASK.part_losses(model(X, mask=knock_out_mask(2, previous_head)), Y),
                "without_partner_head": TASK.part_losses(model(X, mask=knock_out_mask(2, partner_head)), Y)}


@seeds.sweep("ch07_layouts", seeds=range(10), tolerance=0.05, held_out=(100,))
def layouts(seed, steps=250):
    """Chapter 7's six layouts at two budgets (LAYOUTS), each trained `steps` steps from `seed`.

    For layout h x d_head: `errors_hxd` (previous, partner) on the test sequences and
    `partner_weights_hxd`, each head's average weight on the partner.
    """
    X, Y, symbols = held_out()
    row = {}
    for n_heads, d_head in LAYOUTS:
        model = trained_readout(seed, n_heads, d_head, steps=steps)
        with torch.no_grad():
            row[f"errors_{n_heads}x{d_head}"] = TASK.part_losses(model(X), Y)
        row[f"partner_weights_{n_heads}x{d_head}"] = relation_scores(model, X, symbols)[1]
    return row


def fit(model, optimizer, seed, steps, after_step=None):
    """`steps` steps of `optimizer` on batches of 64 of TASK drawn with `seed`, mean squared error,
    as `tasks.train` takes them; returns after_step(model) after each step, as a list."""
    generator, record = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        inputs, targets = TASK.make_batch(64)(generator)
        loss = F.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record.append(after_step(model) if after_step else None)
    return record


@seeds.sweep("ch07_almost_identical", seeds=range(10), tolerance=1e-3, held_out=(100, 101))
def almost_identical(seed, steps=50):
    """Two identical heads from `seed`, then `steps` steps on batches drawn with `seed`.

    The largest difference between the two heads' W_Q, W_K and W_V at the end, after Adam with
    head 1's block of W_O doubled at the start (`adam_w_o_doubled`), and after plain SGD at
    lr 0.1 with nothing changed (`sgd`).
    """
    row = {}
    for name in ("adam_w_o_doubled", "sgd"):
        torch.manual_seed(seed)
        model = make_heads_identical(AttentionReadout(TASK.d_in, 2, TASK.d_out))
        if name == "sgd":
            fit(model, torch.optim.SGD(model.parameters(), lr=0.1), seed, steps)
        else:
            with torch.no_grad():
                model.attention.heads[1].W_o.weight.mul_(2.0)
            tasks.train(model, TASK.make_batch(64), steps=steps, lr=0.01, seed=seed)
        heads = model.attention.heads
        row[name] = max(float((getattr(heads[0], w).weight - getattr(heads[1], w).weight).detach().abs().max())
                        for w in ("W_q", "W_k", "W_v"))
    return row


class SlopeNetwork(nn.Module):
    """Chapter 7's exercise network: branches side by side, each a filter of width 3, a ReLU and
    a weight with a bias (a convolution of width 1); their outputs are added. (B, 1, T) -> (B, 1, T)."""

    def __init__(self, n_branches=2):
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Conv1d(1, 1, 3, padding=1), nn.ReLU(), nn.Conv1d(1, 1, 1))
                                      for _ in range(n_branches))

    def forward(self, x):
        out = self.branches[0](x)
        for branch in self.branches[1:]:
            out = out + branch(x)
        return out


def slope_signals(generator, batch_size=32, length=16):
    """Random signals x (B, 1, T) and their targets |x[t + 1] - x[t - 1]| (the ends wrap around)."""
    x = torch.randn(batch_size, 1, length, generator=generator)
    return x, (x.roll(-1, dims=-1) - x.roll(1, dims=-1)).abs()


@seeds.sweep("ch07_conv_filters", seeds=range(20), tolerance=0.05, held_out=(100, 101))
def conv_filters(seed, steps=300):
    """The exercise's network from `seed`, trained `steps` steps (lr 0.01, batches drawn with `seed`),
    from random filters and with branch 1 a copy of branch 0 (`identical_...`).

    `..._gap`: the largest difference between the two filters; `..._loss`: the mean training loss
    of the last 30 steps; `random_filters`: the two filters (2, 3); `random_active`: for each
    branch, the share of 256 held-out signals' positions where its ReLU passes something.
    """
    probe, _ = slope_signals(torch.Generator().manual_seed(1000), batch_size=256)
    row = {}
    for start in ("random", "identical"):
        torch.manual_seed(seed)
        network = SlopeNetwork()
        if start == "identical":
            network.branches[1].load_state_dict(network.branches[0].state_dict())
        losses = tasks.train(network, slope_signals, steps=steps, lr=0.01, seed=seed)
        filters = torch.stack([branch[0].weight.detach()[0, 0] for branch in network.branches])  # (2, 3)
        row[f"{start}_gap"] = float((filters[0] - filters[1]).abs().max())
        row[f"{start}_loss"] = float(np.mean(losses[-30:]))
        if start == "random":
            row["random_filters"] = filters
            with torch.no_grad():
                row["random_active"] = [float((branch[:2](probe) > 0).float().mean()) for branch in network.branches]
    return row


def split_step(gaps, threshold=0.1):
    """The first step at which the heads' difference exceeds `threshold` (len(gaps) if never)."""
    above = np.flatnonzero(np.asarray(gaps) > threshold)
    return int(above[0]) if len(above) else len(gaps)


@seeds.sweep("ch07_perturbation", seeds=range(12), tolerance=0.5, held_out=(100,))
def perturbation(seed, steps=600, epsilons=(1e-9, 1e-3)):
    """Two identical heads from `seed`, head 1 nudged by eps times normal noise (drawn with seed 5),
    then `steps` steps of Adam (lr 0.01) on batches drawn with `seed`; for each eps, e.g. 1e-09:

    `start_gap_1e-09` and `end_gap_1e-09`, the heads' largest difference before and after training;
    `split_1e-09`, the first step at which it exceeds 0.1, in hundreds of steps (steps / 100 + 0.01
    if never); `errors_1e-09`, the test errors (previous, partner) at the end.
    """
    X, Y, _ = held_out()
    row = {}
    for eps in epsilons:
        torch.manual_seed(seed)
        model = make_heads_identical(AttentionReadout(TASK.d_in, 2, TASK.d_out))
        draws = torch.Generator().manual_seed(5)  # the same noise for every seed
        with torch.no_grad():
            for p in model.attention.heads[1].parameters():
                p.add_(eps * torch.randn(p.shape, generator=draws))
        gaps = [head_difference(model)]
        gaps += fit(model, torch.optim.Adam(model.parameters(), lr=0.01), seed, steps, after_step=head_difference)
        with torch.no_grad():
            errors = TASK.part_losses(model(X), Y)
        tag = f"{eps:.0e}"
        row.update({f"start_gap_{tag}": gaps[0], f"end_gap_{tag}": gaps[-1],
                    f"split_{tag}": split_step(gaps) / 100, f"errors_{tag}": errors})
    return row
