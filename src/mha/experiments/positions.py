"""Chapter 10: a task that depends on order, and one small model per way of adding positions.

- `LastAssignmentTask`: a sequence of assignments such as "b=5", then a question "b?";
  the answer is the value of the **last** assignment to that variable. Shuffle the
  assignments and the answer changes: the task depends on order.
- `RecallModel`: token embeddings, positions (none, learned, sinusoidal or ALiBi), one
  `mha.torch.MultiHeadAttention` whose only query is the question, and a linear readout.
- `train_recall`: train one model with Adam and cross-entropy; `accuracy` measures it at
  any length, including lengths longer than those it was trained on.
- Two sweeps over seeds (`mha.experiments.seeds`), whose stored tables the chapter reads:
  `extrapolation` ("ch10_extrapolation", the four models trained at length 16 and tested at
  every length of TEST_LENGTHS) and `mixed_lengths` ("ch10_mixed_lengths", the three kinds with
  positions trained on lengths 8 to 16, for the exercise).

Everything is seeded: the same arguments give the same model on the same machine.
Training amplifies rounding, so another CPU may print other last digits.
"""

import string
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt
from mha.experiments import seeds

POSITIONS = ("none", "learned", "sinusoidal", "alibi")


@dataclass(frozen=True)
class LastAssignmentTask:
    """Assignments "key=value", then the question "key?": answer the value last assigned to key.

    Token ids: assignment (k, v) is k * n_values + v; the question about key k is
    n_keys * n_values + k. A sequence of length T holds T - 1 assignments and ends with
    the question, which always asks about a key that was assigned at least once.
    """

    n_keys: int = 4
    n_values: int = 8

    @property
    def vocab_size(self):
        return self.n_keys * self.n_values + self.n_keys  # assignments, then questions

    def batch(self, batch_size, T, generator=None):
        """Token ids (B, T) and answers (B,): the value of the last assignment to the asked key."""
        shape = (batch_size, T - 1)
        keys = torch.randint(self.n_keys, shape, generator=generator)  # (B, T - 1)
        values = torch.randint(self.n_values, shape, generator=generator)  # (B, T - 1)
        asked_at = torch.randint(T - 1, (batch_size,), generator=generator)  # an assignment of the asked key
        asked = keys[torch.arange(batch_size), asked_at]  # (B,)
        question = self.n_keys * self.n_values + asked  # (B,)
        tokens = torch.cat([keys * self.n_values + values, question[:, None]], dim=-1)  # (B, T)
        return tokens, self.answer(tokens)

    def last_assignment(self, tokens):
        """The position of the last assignment to the key that the question asks about: (B, T) -> (B,)."""
        assignments, asked = tokens[:, :-1], tokens[:, -1] - self.n_keys * self.n_values  # (B, T - 1), (B,)
        position = torch.arange(assignments.shape[-1]).expand(assignments.shape)  # (B, T - 1)
        matches = assignments // self.n_values == asked[:, None]  # (B, T - 1)
        return torch.where(matches, position, -1).amax(dim=-1)  # (B,)

    def answer(self, tokens):
        """The value last assigned to the key that the question asks about: tokens (B, T) -> (B,)."""
        return tokens[torch.arange(len(tokens)), self.last_assignment(tokens)] % self.n_values  # (B,)

    def words(self, tokens):
        """The tokens of one sequence as text: "b=5" for an assignment, "b?" for the question."""
        names, n_assignments = string.ascii_lowercase, self.n_keys * self.n_values
        return [f"{names[t - n_assignments]}?" if t >= n_assignments
                else f"{names[t // self.n_values]}={t % self.n_values}" for t in np.asarray(tokens).tolist()]

    def order_blind_accuracy(self, tokens):
        """The best accuracy any model blind to order can reach on these sequences, tokens (B, T).

        Such a model sees only which assignments there are. Every one of the asked key's n
        assignments is equally likely to be the last, so its best guess is the most frequent
        value among them, right with probability (its count) / n.
        """
        tokens, n_assignments = np.asarray(tokens), self.n_keys * self.n_values
        asked = tokens[:, -1] - n_assignments  # (B,)
        keys, values = tokens[:, :-1] // self.n_values, tokens[:, :-1] % self.n_values  # (B, T - 1)
        match = keys == asked[:, None]  # (B, T - 1)
        counts = np.stack([(match & (values == v)).sum(-1) for v in range(self.n_values)], -1)  # (B, n_values)
        return float((counts.max(-1) / match.sum(-1)).mean())


class RecallModel(nn.Module):
    """Embeddings, positions, one attention layer read at the question, a linear readout.

    positions: "none", "learned" (a `LearnedPositions` table of max_len rows, scaled to
    a standard deviation of 0.1 like the embeddings), "sinusoidal" (`SinusoidalPositions`)
    or "alibi" (`alibi_bias` on the scores, Press et al.'s slopes). forward(tokens (B, T))
    returns logits (B, n_values) for the answer to the question at the last position.
    """

    def __init__(self, task, positions, *, d_model=32, n_heads=4, max_len=16):
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        self.kind = positions
        self.embed = nn.Embedding(task.vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=0.1)
        self.positions = None
        if positions == "learned":
            self.positions = mt.LearnedPositions(max_len, d_model)
            nn.init.normal_(self.positions.table, std=0.1)
        elif positions == "sinusoidal":
            self.positions = mt.SinusoidalPositions(d_model)
        self.attention = mt.MultiHeadAttention(d_model, n_heads)
        self.readout = nn.Linear(d_model, task.n_values)
        self.register_buffer("slopes", mt.alibi_slopes(n_heads), persistent=False)

    def forward(self, tokens, return_weights=False):
        x = self.embed(tokens)  # (B, T, d_model)
        if self.positions is not None:
            x = self.positions(x)
        T = x.shape[-2]
        bias = mt.alibi_bias(1, T, self.slopes) if self.kind == "alibi" else None  # (h, 1, T)
        out, weights = self.attention(x[..., -1:, :], context=x, bias=bias, return_weights=True)  # (B, 1, d)
        logits = self.readout(out[..., 0, :])  # (B, n_values)
        return (logits, weights[..., 0, :]) if return_weights else logits


@dataclass
class RecallResult:
    """One trained model and its training losses."""

    model: RecallModel
    losses: list


def train_recall(task, positions, *, T=16, steps=300, lr=0.01, batch_size=64, seed=0, **model_options):
    """Train a `RecallModel` on sequences of length T with Adam and cross-entropy.

    T is one length, or a tuple of lengths taken in turn, one per step (a learned table
    then has max(T) rows). The model's random start comes from torch.manual_seed(seed),
    its batches from a generator seeded with `seed`. Returns a `RecallResult`.
    """
    lengths = (T,) if isinstance(T, int) else tuple(T)
    torch.manual_seed(seed)
    model = RecallModel(task, positions, max_len=max(lengths), **model_options)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        tokens, answers = task.batch(batch_size, lengths[step % len(lengths)], generator)
        loss = F.cross_entropy(model(tokens), answers)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return RecallResult(model, losses)


def held_out(task, T, n=1000, seed=123):
    """The chapter's test set at length T: n sequences (n, T) and their answers (n,), never trained on."""
    return task.batch(n, T, torch.Generator().manual_seed(seed))


def accuracy(model, task, T, n=1000, seed=123):
    """The share of n fresh sequences of length T whose answer the model gets right."""
    tokens, answers = held_out(task, T, n, seed)
    with torch.no_grad():
        return (model(tokens).argmax(-1) == answers).float().mean().item()


TEST_LENGTHS = (8, 16, 32, 64, 128)  # where chapter 10 tests models trained at length 16
MIXED_LENGTHS = (8, 12, 16, 32, 64)  # where its exercise tests models trained on lengths 8 to 16


def lengths_for(kind, lengths, max_len=16):
    """The lengths of `lengths` that a model of this kind can read: a learned table stops at max_len."""
    return tuple(n for n in lengths if kind != "learned" or n <= max_len)


@seeds.sweep("ch10_extrapolation", seeds=range(10), tolerance=0.05)
def extrapolation(seed):
    """Chapter 10's four models, trained by `train_recall` at length 16 from `seed`.

    Each kind of POSITIONS gives its accuracy (`accuracy`, 1000 held-out sequences) at each of
    `lengths_for(kind, TEST_LENGTHS)`, under the kind's name. On the first held-out sequence
    of length 16 (the one in the chapter's figure), `last_weight_<kind>` is the question's weight
    on the last assignment to its key, averaged over the heads, and `other_weight_<kind>` the
    largest weight on any other token; `alibi_heads_on_last` is that weight in each ALiBi head
    (slopes 1/4 to 1/256). `none_shuffle_gap` is the largest change of the logits of the model
    without positions when the assignments of all 1000 sequences are shuffled.
    """
    task = LastAssignmentTask()
    tokens, _ = held_out(task, 16)  # (1000, 16)
    last = task.last_assignment(tokens[:1]).item()
    shuffle = torch.randperm(15, generator=torch.Generator().manual_seed(0))  # the assignments only
    shuffled = torch.cat([tokens[:, :-1][:, shuffle], tokens[:, -1:]], dim=-1)
    row = {}
    for kind in POSITIONS:
        model = train_recall(task, kind, T=16, seed=seed).model
        row[kind] = [accuracy(model, task, n) for n in lengths_for(kind, TEST_LENGTHS)]
        with torch.no_grad():
            _, weights = model(tokens[:1], return_weights=True)  # (1, h, T)
            if kind == "none":
                row["none_shuffle_gap"] = (model(shuffled) - model(tokens)).abs().max().item()
        averaged = weights[0].mean(0)  # (T,)
        row[f"last_weight_{kind}"] = averaged[last].item()
        row[f"other_weight_{kind}"] = torch.cat([averaged[:last], averaged[last + 1:]]).max().item()
        if kind == "alibi":
            row["alibi_heads_on_last"] = weights[0, :, last].tolist()  # (h,)
    return row


@seeds.sweep("ch10_mixed_lengths", seeds=range(10), tolerance=0.05)
def mixed_lengths(seed):
    """The three kinds with positions, trained by `train_recall` on the lengths 8 to 16 in turn.

    For each kind, its accuracy at each of `lengths_for(kind, MIXED_LENGTHS)`, under its name.
    """
    task = LastAssignmentTask()
    row = {}
    for kind in POSITIONS[1:]:
        model = train_recall(task, kind, T=tuple(range(8, 17)), seed=seed).model
        row[kind] = [accuracy(model, task, n) for n in lengths_for(kind, MIXED_LENGTHS)]
    return row
