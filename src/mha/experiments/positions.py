"""Chapter 10: a task that depends on order, and one small model per way of adding positions.

- `LastAssignmentTask`: a sequence of assignments such as "b=5", then a question "b?";
  the answer is the value of the **last** assignment to that variable. Shuffle the
  assignments and the answer changes: the task depends on order.
- `RecallModel`: token embeddings, positions (none, learned, sinusoidal, ALiBi or RoPE), one
  `mha.torch.MultiHeadAttention` whose only query is the question, and a linear readout.
  "rope_dynamic" is RoPE read with dynamic NTK scaling beyond the training length
  (`stretched_rope` turns a trained "rope" model into one).
- `train_recall`: train one model with Adam and cross-entropy; `accuracy` measures it at
  any length, including lengths longer than those it was trained on.
- Two sweeps over seeds (`mha.experiments.seeds`), whose stored tables the chapter reads:
  `extrapolation` ("ch10_extrapolation", the five models trained at length 16, and the RoPE one
  stretched by dynamic NTK, tested at every length of TEST_LENGTHS) and `mixed_lengths`
  ("ch10_mixed_lengths", the three kinds of MIXED_KINDS trained on lengths 8 to 16, for the exercise).

Everything is seeded: the same arguments give the same model on the same machine.
Training amplifies rounding, so another CPU may print other last digits.
"""

import copy
import string
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt
from mha.experiments import seeds

POSITIONS = ("none", "learned", "sinusoidal", "alibi", "rope", "rope_dynamic")
MIXED_KINDS = ("learned", "sinusoidal", "alibi")  # the kinds of the exercise's sweep, ch10_mixed_lengths
# RoPE's base: the slowest of the 4 pairs of a head (d_head = 8) turns at 100^(-3/4) = 0.032 radians per
# position, less than one full turn (2 pi) over the 128 positions of the longest test, so that no two
# distances up to 128 look alike. With Llama's 10000, the two slowest pairs would turn by less than 0.2
# and 0.02 radians over the 16 positions of training: almost nothing to learn from.
ROPE_BASE = 100.0


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
    a standard deviation of 0.1 like the embeddings), "sinusoidal" (`SinusoidalPositions`),
    "alibi" (`alibi_bias` on the scores, Press et al.'s slopes), "rope" (the query and the keys
    rotated by `rotary_embedding` with `rope_base`), or "rope_dynamic" (the same, with dynamic
    NTK scaling past max_len: `dynamic_ntk`). forward(tokens (B, T)) returns logits
    (B, n_values) for the answer to the question at the last position.
    """

    def __init__(self, task, positions, *, d_model=32, n_heads=4, max_len=16, rope_base=ROPE_BASE):
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        self.kind, self.max_len, self.rope_base = positions, max_len, float(rope_base)
        self.rope_scaling = dynamic_ntk(max_len) if positions == "rope_dynamic" else None
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
        if self.kind.startswith("rope"):
            out, weights = self.rotary_attention(x)  # (B, 1, d), (B, h, 1, T)
        else:
            bias = mt.alibi_bias(1, T, self.slopes) if self.kind == "alibi" else None  # (h, 1, T)
            out, weights = self.attention(x[..., -1:, :], context=x, bias=bias, return_weights=True)  # (B, 1, d)
        logits = self.readout(out[..., 0, :])  # (B, n_values)
        return (logits, weights[..., 0, :]) if return_weights else logits

    def rotary_attention(self, x):
        """The attention layer with RoPE: the question's query (position T - 1) and every key
        (positions 0 to T - 1) rotated by their positions; the values are left alone.
        x (B, T, d_model) -> out (B, 1, d_model), weights (B, h, 1, T)."""
        layer, h = self.attention, self.attention.n_heads
        cos, sin = mt.rotary_embedding(x.shape[-2], x.shape[-1] // h, self.rope_base, dtype=x.dtype,
                                       device=x.device, scaling=self.rope_scaling)  # (T, d_head) each
        q = mt.apply_rotary(mt.split_heads(layer.W_q(x[..., -1:, :]), h), cos[-1:], sin[-1:])  # (B, h, 1, d_head)
        k = mt.apply_rotary(mt.split_heads(layer.W_k(x), h), cos, sin)  # (B, h, T, d_head)
        v = mt.split_heads(layer.W_v(x), h)  # (B, h, T, d_head)
        out, weights = mt.scaled_dot_product_attention(q, k, v)  # (B, h, 1, d_head), (B, h, 1, T)
        return layer.W_o(mt.merge_heads(out)), weights  # (B, 1, d_model)


def dynamic_ntk(max_len):
    """Dynamic NTK scaling (transformers' rope_parameters) for a model trained at length max_len.

    Up to max_len it changes nothing. At a length T beyond, it raises the base so that the
    slowest pair turns over T positions as far as it turned over max_len (factor 1), while the
    fastest pair keeps its speed; the pairs between are slowed by less and less."""
    return {"rope_type": "dynamic", "factor": 1.0, "max_position_embeddings": max_len}


def stretched_rope(model):
    """A trained "rope" `RecallModel`, read with dynamic NTK scaling: the same weights, kind "rope_dynamic"."""
    if not isinstance(model, RecallModel):
        raise TypeError(f"expected a RecallModel with positions 'rope', got a {type(model).__name__}")
    if model.kind != "rope":
        raise ValueError(f"expected a RecallModel with positions 'rope', got {model.kind!r}")
    stretched = copy.deepcopy(model)
    stretched.kind, stretched.rope_scaling = "rope_dynamic", dynamic_ntk(model.max_len)
    return stretched


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


def weight_beyond(model, task, T, distance=15):
    """The question's weight on the keys more than `distance` positions before it, averaged over
    the heads and the chapter's test set at length T. Trained at length 16, a model saw distances
    up to 15 only."""
    tokens, _ = held_out(task, T)  # (1000, T)
    with torch.no_grad():
        _, weights = model(tokens, return_weights=True)  # (1000, h, T)
    return weights[..., :max(T - 1 - distance, 0)].sum(-1).mean().item()  # key j is T - 1 - j back


TEST_LENGTHS = (8, 16, 32, 64, 128)  # where chapter 10 tests models trained at length 16
MIXED_LENGTHS = (8, 12, 16, 32, 64)  # where its exercise tests models trained on lengths 8 to 16


def lengths_for(kind, lengths, max_len=16):
    """The lengths of `lengths` that a model of this kind can read: a learned table stops at max_len."""
    return tuple(n for n in lengths if kind != "learned" or n <= max_len)


@seeds.sweep("ch10_extrapolation", seeds=range(10), tolerance=0.05, held_out=(100,))
def extrapolation(seed):
    """Chapter 10's five models, trained by `train_recall` at length 16 from `seed`, and the RoPE
    one read with dynamic NTK scaling ("rope_dynamic", `stretched_rope`: no training of its own).

    Each kind of POSITIONS gives its accuracy (`accuracy`, 1000 held-out sequences) at each of
    `lengths_for(kind, TEST_LENGTHS)`, under the kind's name. On the first held-out sequence
    of length 16 (the one in the chapter's figure), `last_weight_<kind>` is the question's weight
    on the last assignment to its key, averaged over the heads, and `other_weight_<kind>` the
    largest weight on any other token; `alibi_heads_on_last` is that weight in each ALiBi head
    (slopes 1/4 to 1/256). `none_shuffle_gap` is the largest change of the logits of the model
    without positions when the assignments of all 1000 sequences are shuffled. `far_weight_rope`
    and `far_weight_rope_dynamic` are `weight_beyond` at length 128: the weight on distances
    never seen in training.
    """
    task = LastAssignmentTask()
    tokens, _ = held_out(task, 16)  # (1000, 16)
    last = task.last_assignment(tokens[:1]).item()
    shuffle = torch.randperm(15, generator=torch.Generator().manual_seed(0))  # the assignments only
    shuffled = torch.cat([tokens[:, :-1][:, shuffle], tokens[:, -1:]], dim=-1)
    row = {}
    for kind in POSITIONS:
        if kind == "rope_dynamic":  # the "rope" model just trained (POSITIONS lists it first), stretched
            model = stretched_rope(model)
        else:
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
        if kind.startswith("rope"):
            row[f"far_weight_{kind}"] = weight_beyond(model, task, max(TEST_LENGTHS))
    return row


@seeds.sweep("ch10_mixed_lengths", seeds=range(10), tolerance=0.05, held_out=(100,))
def mixed_lengths(seed):
    """The three kinds of MIXED_KINDS, trained by `train_recall` on the lengths 8 to 16 in turn.

    For each kind, its accuracy at each of `lengths_for(kind, MIXED_LENGTHS)`, under its name.
    """
    task = LastAssignmentTask()
    row = {}
    for kind in MIXED_KINDS:
        model = train_recall(task, kind, T=tuple(range(8, 17)), seed=seed).model
        row[kind] = [accuracy(model, task, n) for n in lengths_for(kind, MIXED_LENGTHS)]
    return row
