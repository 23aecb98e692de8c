"""Chapter 16: the heads of a real model, SmolLM2-135M-Instruct, read with chapter 11's tools.

- `load_model()`: the course's `TransformerLM` copy of the model and its tokenizer, loaded once
  per process (`share_model` hands it one already loaded).
- Repeated random tokens (`repeated_random_tokens`): a segment of L distinct ordinary token ids,
  written twice, after the document-start token <|endoftext|>. The scores of chapter 11
  (`previous_token_scores`, `induction_scores`) are read on the 2L positions after it.
- `head_scores(seed)`: both scores for all 30 x 9 = 270 heads on one draw; the sweep
  "ch16_head_scores" stores them over draws (`score_table`: mean and spread per head;
  `strongest_heads`).
- `knock_out_row(seed)`: the repeat's loss with the K strongest induction heads switched off,
  and with K random heads (drawn by `seed`); the sweep "ch16_knockouts"; `knock_out_summary` says
  what the chapter states of it. The losses on ordinary text (a fixed slice of chapter 14's test
  text, `text_loss`) with every head on and with the induction heads off are stored.
- `text_bits_per_character`: the model's bits per character on a text, in windows of `context`
  tokens, `stride` apart (`scoring_windows`, `text_nats`). tools/data/read_smollm2.py stores the
  whole test text's value in `smollm2_readings.json` (`stored_readings`), beside chapter 14's
  (`chapter_14_scores`, `compressor_baselines`).
- `first_token_weights(seed)`: how much weight each head parks on the first token.
"""

import functools
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mha.experiments import seeds
from mha.experiments.induction import induction_scores, previous_token_scores

N_LAYERS, N_HEADS = 30, 9
DOCUMENT_START = 0  # <|endoftext|>: in SmolLM2's training data it separates documents
FIRST_ORDINARY_ID = 17  # ids 0 .. 16 are special tokens (<|endoftext|>, <|im_start|>, <file_sep>, ...)
VOCAB_SIZE = 49152
REPEAT_LENGTH = 40  # L: the segment's length; a sequence is 1 + 2L tokens
K_KNOCKED = 12  # heads switched off at once: the induction heads (mean score above 0.3), or as many random ones
TEXT_TOKENS = 256  # the slice of ordinary text that the knock-outs are measured on
READINGS = Path(__file__).with_name("smollm2_readings.json")  # written by tools/data/read_smollm2.py


_LOADED = {}  # "model", "tokenizer": the model loaded (or shared) once per process


def load_model():
    """(model, tokenizer): SmolLM2-135M-Instruct as the course's `TransformerLM` (float32, eval;
    `mha.experiments.smollm2.load_smollm2`) and its tokenizer. Loaded once per process."""
    if not _LOADED:
        from mha.experiments.smollm2 import load_smollm2
        share_model(load_smollm2())
    return _LOADED["model"], _LOADED["tokenizer"]


def share_model(smollm2):
    """Use an already loaded `SmolLM2` (say a test session's) instead of loading another copy."""
    _LOADED.update(model=smollm2.model.eval(), tokenizer=smollm2.tokenizer)


def repeated_random_tokens(seed, batch_size=1, L=REPEAT_LENGTH):
    """(B, 1 + 2L) ids: <|endoftext|>, then L distinct ordinary ids drawn by `seed`, then the same L
    again. Without the first token, the first random id would be where idle heads park their weight
    (the "sink" of a Llama-family model), which disturbs the scores of the positions near it."""
    if L < 2:
        raise ValueError(f"the segment needs at least 2 tokens, got L={L}")
    rng = np.random.default_rng([16, seed])
    segment = np.stack([rng.choice(np.arange(FIRST_ORDINARY_ID, VOCAB_SIZE), L, replace=False)
                        for _ in range(batch_size)])  # (B, L)
    start = np.full((batch_size, 1), DOCUMENT_START)
    return torch.from_numpy(np.concatenate([start, segment, segment], axis=1))  # (B, 1 + 2L)


@torch.no_grad()
def repeat_weights(model, tokens):
    """Every head's weights on the 2L positions after the first token, as chapter 11 lays them out:
    numpy (n_layers, B, h, 2L, 2L), in float64."""
    _, weights = model(tokens, return_weights=True)  # (n_layers, B, h, 1 + 2L, 1 + 2L)
    return weights[..., 1:, 1:].double().numpy()


def head_scores(seed, L=REPEAT_LENGTH):
    """{"previous": (n_layers, h), "induction": (n_layers, h)}: chapter 11's scores of every head on
    one draw of repeated random tokens."""
    model, _ = load_model()
    weights = repeat_weights(model, repeated_random_tokens(seed, L=L))
    return {"previous": previous_token_scores(weights, L), "induction": induction_scores(weights, L)}


@torch.no_grad()
def first_token_weights(seed, L=REPEAT_LENGTH):
    """The mean weight that each head gives to the first token, <|endoftext|>, over the 2L queries after it,
    on draw `seed`: (n_layers, h). Heads with nothing to do park their weight there (an "attention sink")."""
    model, _ = load_model()
    _, weights = model(repeated_random_tokens(seed, L=L), return_weights=True)  # (n_layers, 1, h, T, T)
    return weights[:, 0, :, 1:, 0].mean(dim=-1).double().numpy()  # (n_layers, h)


@seeds.sweep("ch16_head_scores", seeds=range(10), tolerance=0.01, held_out=(100, 101))
def head_scores_row(seed):
    """One row of chapter 16's head scores: both scores of all 270 heads on draw `seed`."""
    return head_scores(seed)


def score_table(name="previous", rows=None):
    """(mean, smallest, largest) per head over the stored draws (or over `rows`), each (n_layers, h)."""
    values = seeds.column("ch16_head_scores", name) if rows is None else np.array([r[name] for r in rows])
    return values.mean(axis=0), values.min(axis=0), values.max(axis=0)  # each (n_layers, h)


def strongest_heads(name="induction", k=K_KNOCKED, rows=None):
    """The k heads with the largest mean score over the stored draws (or over `rows`), strongest first:
    a list of (layer, head) pairs, both counted from 0."""
    if not 1 <= k <= N_LAYERS * N_HEADS:
        raise ValueError(f"k must be in [1, {N_LAYERS * N_HEADS}], got {k}")
    mean, _, _ = score_table(name, rows)
    order = np.argsort(-mean, axis=None, kind="stable")[:k]
    return [tuple(int(i) for i in np.unravel_index(j, mean.shape)) for j in order]


def heads_off(heads):
    """A head_mask (n_layers, h) of booleans with the given (layer, head) pairs switched off (False)."""
    keep = torch.ones(N_LAYERS, N_HEADS, dtype=torch.bool)
    for layer, head in heads:
        keep[layer, head] = False
    return keep


def random_heads(seed, k=K_KNOCKED, avoid=()):
    """k distinct (layer, head) pairs drawn by `seed` among the heads not in `avoid`."""
    pool = [(layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS) if (layer, head) not in set(avoid)]
    picked = np.random.default_rng([16, 1, seed]).choice(len(pool), k, replace=False)
    return [pool[i] for i in sorted(picked)]


@torch.no_grad()
def next_token_losses(model, tokens, head_mask=None):
    """The loss in nats of predicting token t + 1 at every position t: (B, T - 1), float64."""
    logits = model(tokens, head_mask=head_mask)  # (B, T, V)
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none").double()


def repeat_loss(model, tokens, head_mask=None):
    """The mean loss over the repeat of (B, 1 + 2L) sequences: its 2nd .. L-th tokens, which can be
    copied from the first segment (chapter 11's `repeat_loss`, one position later for the first token)."""
    L = (tokens.shape[1] - 1) // 2
    return float(next_token_losses(model, tokens, head_mask)[:, L + 1:].mean())


@functools.cache
def text_slice(n_tokens=TEXT_TOKENS):
    """(1, 1 + n_tokens) ids: <|endoftext|>, then the first n_tokens tokens of chapter 14's test text."""
    from mha.text import load_splits
    _, tokenizer = load_model()
    ids = tokenizer(load_splits()["test"])["input_ids"][:n_tokens]
    return torch.tensor([[DOCUMENT_START, *ids]])


def text_loss(model, head_mask=None, n_tokens=TEXT_TOKENS):
    """The mean loss in nats on the fixed slice of ordinary text (`text_slice`)."""
    return float(next_token_losses(model, text_slice(n_tokens), head_mask).mean())


def knock_out_row(seed, k=K_KNOCKED, L=REPEAT_LENGTH):
    """The repeat's loss on draw `seed` of repeated random tokens: with every head on, with the k
    strongest induction heads off, and with k random other heads off (drawn by `seed`); and the
    loss on ordinary text with those random heads off."""
    model, _ = load_model()
    tokens, strongest = repeated_random_tokens(1000 + seed, L=L), strongest_heads("induction", k)
    chance = random_heads(seed, k, avoid=strongest)
    return {"repeat": repeat_loss(model, tokens), "repeat_induction_off": repeat_loss(model, tokens, heads_off(strongest)),
            "repeat_random_off": repeat_loss(model, tokens, heads_off(chance)),
            "text_random_off": text_loss(model, heads_off(chance)),
            "random_heads": [layer * N_HEADS + head for layer, head in chance]}


@seeds.sweep("ch16_knockouts", seeds=range(20), tolerance=0.02, held_out=(100,))
def knock_out_sweep(seed):
    """One row of chapter 16's knock-outs (`knock_out_row`)."""
    return knock_out_row(seed)


def spread_of(values):
    """(median, smallest, largest) of a list of numbers, as plain floats."""
    values = np.asarray(values, dtype=float)
    return float(np.median(values)), float(values.min()), float(values.max())


def knock_out_summary(rows=None):
    """What chapter 16 says of the knock-outs, over the stored draws (or over `rows`): the rise of the repeat's
    loss with the induction heads off and with random heads off, each (median, smallest, largest), on how many
    draws the random heads' rise stays below 1 nat and the induction heads' rise is the larger; on ordinary
    text, the loss with every head on, the induction heads' cost and the random heads' (median, ...)."""
    rows = seeds.load("ch16_knockouts")["rows"] if rows is None else rows
    text = stored_readings()["text"]
    base = np.array([row["repeat"] for row in rows])
    induction = np.array([row["repeat_induction_off"] for row in rows]) - base
    random = np.array([row["repeat_random_off"] for row in rows]) - base
    text_random = np.array([row["text_random_off"] for row in rows]) - text["loss"]
    text_induction = text["loss_induction_off"] - text["loss"]
    return {"draws": len(rows), "repeat": spread_of(base), "induction_rise": spread_of(induction),
            "random_rise": spread_of(random), "random_below_1": int((random < 1).sum()),
            "induction_larger": int((induction > random).sum()), "text_loss": text["loss"],
            "text_induction_cost": text_induction, "text_random_cost": spread_of(text_random),
            "text_random_costlier": int((text_random > text_induction).sum())}


def scoring_windows(n, context, stride):
    """How `text_nats` reads ids (n,): a list of (start, first, stop), one per window. The window feeds
    ids[start : stop - 1] to the model and scores the targets first .. stop - 1, each target once, from at
    least context - stride tokens before it (or all there are); the last window ends at the last id."""
    if not 1 <= stride <= context:
        raise ValueError(f"stride must be in [1, context = {context}], got {stride}")
    windows, first, start = [], 1, 0
    while first < n:
        start = min(start, max(0, n - 1 - context))
        stop = min(start + context, n - 1) + 1
        windows.append((start, first, stop))
        first, start = stop, start + stride
    return windows


@torch.no_grad()
def window_nats(model, ids, start, first, stop):
    """The nats of predicting ids[first:stop] (a LongTensor (n,)) from ids[start : stop - 1]: a float."""
    logits = model(ids[None, start:stop - 1])[0]  # (stop - 1 - start, V)
    losses = F.cross_entropy(logits, ids[start + 1:stop], reduction="none")  # (stop - 1 - start,)
    return float(losses[first - start - 1:].double().sum())


def text_nats(model, ids, context, stride, done=None, on_window=None):
    """(total nats, targets scored) of predicting ids[1:] in `scoring_windows`. done: {start: nats} of
    windows already scored (skipped); on_window(start, nats, i, n_windows), if given, after each new one."""
    ids, done = torch.as_tensor(ids), dict(done or {})
    windows = scoring_windows(len(ids), context, stride)
    for i, (start, first, stop) in enumerate(windows):
        if start not in done:
            done[start] = window_nats(model, ids, start, first, stop)
            if on_window is not None:
                on_window(start, done[start], i, len(windows))
    return sum(done[start] for start, _, _ in windows), len(ids) - 1


def text_bits_per_character(text, context=1024, stride=768, done=None, on_window=None):
    """Bits per character of the model on `text`: <|endoftext|> first, then every token of the text
    scored once (`text_nats`), so every character is paid for. Returns (bpc, total nats, tokens)."""
    from mha.text import bits_per_character
    model, tokenizer = load_model()
    ids = [DOCUMENT_START, *tokenizer(text)["input_ids"]]
    nats, scored = text_nats(model, ids, context, stride, done, on_window)
    return bits_per_character(nats, len(text)), nats, scored


def chapter_14_scores():
    """Chapter 14's stored bits per character of its two models under every stride (trained/scoring.json)."""
    from mha.experiments.writing import TRAINED
    return json.loads((TRAINED / "scoring.json").read_text())


def compressor_baselines():
    """Chapter 14's stored compressor and n-gram baselines on the same test text (data/baselines.json)."""
    from mha.text.baselines import STORED_TABLE
    return json.loads(STORED_TABLE.read_text())


def stored_readings():
    """What tools/data/read_smollm2.py stored: the bits per character of the test text and the
    knock-outs' losses on ordinary text with every head on and with the strongest induction heads off."""
    if not READINGS.exists():
        raise ValueError(f"no stored readings at {READINGS}: run python -m tools.data.read_smollm2")
    return json.loads(READINGS.read_text())
