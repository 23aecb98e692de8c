"""Chapter 18: what a fixed state cannot remember. Multi-query associative recall (MQAR, Arora et al.
2023, "Zoology"), learned by one small layer of each token mixer at the same state size, measured.

The task (`mqar_batch`): N key-value pairs, then every key once more in a random order, each a query
whose answer is its value: k1 v1 k2 v2 ... kN vN q1 q2 ... qN, T = 3N tokens. Keys are N distinct
tokens of N_KEYS (ids 0 .. 63), values any of N_VALUES (ids 64 .. 127); the model is scored on the
query positions alone (chance 1/64). PAIRS: N = 8, 16, 32, 64 (T = 24 .. 192).

The models (`mha.experiments.recall_model`, SIZE): d_model 64, one layer, two heads of d_k = d_v = 16,
the mixer softmax attention, linear attention (elu + 1), DeltaNet or Gated DeltaNet; the three linear
ones hold 2 x 16 x 16 = 512 numbers whatever T, softmax attention the keys and values of every token
(64 numbers a token: 12 288 at T = 192). Trained with AdamW (lr 3e-3, betas 0.9, 0.98, weight decay
0.1, 30 warm-up steps, a cosine to a tenth), 500 steps of 3072 tokens (1024 queries) whatever N, the
batches a function of (training seed, N) alone: every mixer sees the same batches. Scored on 4096
held-out queries (a generator seeded with EVAL_SEED + N).

- `recall_run(mixer, pairs, seed)`: train one model, measure it.
- `recall_sweep`: the sweep "ch18_recall", one row per (mixer, N, training seed), its number
  `run_number` = 1000 x mixer index + 100 x N's index + seed (15-50 s a row on one thread under the
  generic kernels).
- `recall_table()`: accuracy by mixer and N (median, smallest, largest over the seeds) from the stored table.

Every run is seeded (torch.manual_seed for the weights, the generator for the batches); the stored
table is made under generic kernels and one thread (`tools/data/seed_sweeps.py`).
"""

import dataclasses
import statistics

import numpy as np
import torch
import torch.nn.functional as F

import mha.numpy as mnp
from mha.experiments import seeds
from mha.experiments.recall_model import MIXERS, RecallModel

N_KEYS, N_VALUES = 64, 64
VOCAB_SIZE = N_KEYS + N_VALUES
PAIRS = (8, 16, 32, 64)
EVAL_SEED = 10 ** 6
EVAL_QUERIES = 4096
SEEDS_PER_CELL = 5  # training seeds 0 .. 4 of every (mixer, N) are stored
IGNORE = -100  # the target of a position that is not scored


@dataclasses.dataclass(frozen=True)
class RecallConfig:
    """The model's size and the training run of every row."""
    d_model: int = 64
    n_layers: int = 1
    n_heads: int = 2
    d_k: int = 16
    d_v: int = 16
    steps: int = 500
    tokens_per_step: int = 3072
    lr: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.98)
    clip: float = 1.0


SIZE = RecallConfig()


def mqar_batch(pairs, batch, generator):
    """`batch` sequences of `pairs` key-value pairs then their queries: (inputs, targets), each (batch, 3 pairs).
    targets hold the value at each query and IGNORE elsewhere."""
    if not 1 <= pairs <= N_KEYS:
        raise ValueError(f"pairs must be in [1, {N_KEYS}] (distinct keys), got {pairs}")
    keys = torch.rand(batch, N_KEYS, generator=generator).argsort(dim=-1)[:, :pairs]  # (B, N) distinct keys
    values = N_KEYS + torch.randint(N_VALUES, (batch, pairs), generator=generator)  # (B, N)
    order = torch.rand(batch, pairs, generator=generator).argsort(dim=-1)  # (B, N): the queries' order
    stored = torch.stack([keys, values], dim=-1).flatten(1)  # (B, 2N): k1 v1 k2 v2 ...
    inputs = torch.cat([stored, keys.gather(1, order)], dim=1)  # (B, 3N)
    targets = torch.cat([torch.full_like(stored, IGNORE), values.gather(1, order)], dim=1)  # (B, 3N)
    return inputs, targets


def new_model(mixer, seed, size=SIZE):
    """The RecallModel of `mixer`, its weights drawn from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return RecallModel(mixer, vocab_size=VOCAB_SIZE, d_model=size.d_model, n_heads=size.n_heads, d_k=size.d_k,
                       d_v=size.d_v, n_layers=size.n_layers)


def recall_loss(model, inputs, targets):
    """The mean cross-entropy (nats) over the query positions."""
    logits = model(inputs)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def train(model, pairs, seed, size=SIZE):
    """Train `model` on MQAR with `pairs` pairs; returns the losses of every step."""
    batch = size.tokens_per_step // (3 * pairs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=size.lr, betas=size.betas, weight_decay=size.weight_decay)
    generator = torch.Generator().manual_seed(seed * 7919 + pairs)
    losses = []
    for step in range(1, size.steps + 1):
        lr = mnp.warmup_cosine(step, peak=size.lr, warmup_steps=size.warmup_steps, total_steps=size.steps,
                               final=size.min_lr_ratio * size.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = recall_loss(model, *mqar_batch(pairs, batch, generator))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), size.clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def accuracy(model, pairs):
    """The share of EVAL_QUERIES held-out queries whose value is the model's most likely token."""
    inputs, targets = mqar_batch(pairs, EVAL_QUERIES // pairs, torch.Generator().manual_seed(EVAL_SEED + pairs))
    scored = targets != IGNORE  # (B, T)
    return float((model(inputs).argmax(dim=-1)[scored] == targets[scored]).float().mean())


def recall_run(mixer, pairs, seed, size=SIZE):
    """Train the model of `mixer` on `pairs` pairs with training seed `seed` and measure it: {"accuracy",
    "final_train_loss": the mean of the last 20 steps' losses (nats), "state_numbers": what its layer holds
    after the 3 pairs tokens of a sequence, "parameters"}."""
    model = new_model(mixer, seed, size)
    losses = train(model, pairs, seed, size)
    return {"accuracy": accuracy(model, pairs), "final_train_loss": float(np.mean(losses[-20:])),
            "state_numbers": model.state_numbers(3 * pairs), "parameters": sum(p.numel() for p in model.parameters())}


def run_number(mixer, pairs, seed):
    """The sweep's number of one model: 1000 x the mixer's index in MIXERS + 100 x N's index in PAIRS + seed."""
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
    if pairs not in PAIRS:
        raise ValueError(f"pairs must be one of {PAIRS}, got {pairs!r}")
    if not 0 <= seed < 100:
        raise ValueError(f"seed must be in [0, 100), got {seed!r}")
    return 1000 * MIXERS.index(mixer) + 100 * PAIRS.index(pairs) + seed


def split_number(number):
    """The inverse of run_number: (mixer, pairs, training seed)."""
    mixer, rest = divmod(int(number), 1000)
    index, seed = divmod(rest, 100)
    if not (0 <= mixer < len(MIXERS) and 0 <= index < len(PAIRS)):
        raise ValueError(f"sweep number {number} names mixer {mixer} and pairs index {index}: out of range")
    return MIXERS[mixer], PAIRS[index], seed


HELD_OUT = (run_number("delta", 32, 5),)  # a DeltaNet seed never stored: the claims test trains it


@seeds.sweep("ch18_recall", seeds=[run_number(m, n, s) for m in MIXERS for n in PAIRS for s in range(SEEDS_PER_CELL)],
             tolerance=0.02, held_out=HELD_OUT)
def recall_sweep(number):
    """One model of the table: `number` = run_number(mixer, pairs, seed). The row holds the mixer's index in
    MIXERS ("mixer"), "pairs", "training_seed" and what recall_run measures."""
    mixer, pairs, seed = split_number(number)
    return {"mixer": MIXERS.index(mixer), "pairs": pairs, "training_seed": seed, **recall_run(mixer, pairs, seed)}


def rows_by_cell(rows=None):
    """{(mixer name, pairs): [rows in seed order]} from the stored table (or from `rows`)."""
    rows = seeds.load("ch18_recall")["rows"] if rows is None else rows
    cells = {}
    for row in sorted(rows, key=lambda r: r["training_seed"]):
        cells.setdefault((MIXERS[int(row["mixer"])], int(row["pairs"])), []).append(row)
    return cells


def accuracies(mixer, pairs, rows=None):
    """The accuracy of every stored seed of (mixer, pairs), in seed order: (n_seeds,)."""
    return np.array([row["accuracy"] for row in rows_by_cell(rows)[(mixer, pairs)]])


def recall_table(rows=None):
    """{mixer: {pairs: {"median", "low", "high": accuracy over the seeds, "seeds", "state_numbers"}}}."""
    table = {}
    for (mixer, pairs), group in rows_by_cell(rows).items():
        values = [row["accuracy"] for row in group]
        table.setdefault(mixer, {})[pairs] = {
            "median": statistics.median(values), "low": min(values), "high": max(values), "seeds": len(values),
            "state_numbers": int(group[0]["state_numbers"])}
    return table
