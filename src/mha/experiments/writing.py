"""Chapter 14's experiment: language models of Python's standard library, measured.

RUNS names the configurations `python -m mha.text.train` trains: the shipped character model
("char"), the shipped BPE model ("bpe"), the smaller run trained on five seeds ("seeds") and a
tiny one for the tests ("tiny"). `measure` computes a trained model's bits per character on the
test text; `induction_summary` finds its induction heads on repeated snippets of real code.
The stored results live in mha/text/trained/, read by `stored_model` and `stored_seeds`.
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mha.experiments.induction import induction_scores
from mha.text import BPETokenizer, CharTokenizer, bits_per_character, load_splits
from mha.text.training import TrainingConfig, load_model, text_nats

TRAINED = Path(__file__).resolve().parents[1] / "text" / "trained"

SHIPPED = TrainingConfig(d_model=128, n_layers=4, n_heads=4, d_ff=344, context=256, batch_size=32, steps=1600,
                         lr=3e-3, warmup_steps=100, eval_every=100, checkpoint_every=200)
RUNS = {
    "char": [SHIPPED],
    "bpe": [replace(SHIPPED, tokenizer="bpe", bpe_vocab_size=1024, steps=1200)],
    "seeds": [replace(SHIPPED, steps=400, eval_every=50, checkpoint_every=100)],
    "tiny": [TrainingConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, context=64, batch_size=8, steps=20,
                            lr=3e-3, warmup_steps=5, eval_every=5, eval_windows=8, checkpoint_every=5)],
}
REPEAT_LENGTH = 64  # tokens in each snippet of real code that is repeated to find the induction heads
INDUCTION_SNIPPETS = 32
PREFIX_TARGETS = 128  # scoring.json keeps the stride-1 nats of the test text's first context + 128 targets


def make_tokenizer(config, train_text):
    """The run's tokenizer, fitted to the training text."""
    if config.tokenizer == "char":
        return CharTokenizer.fit(train_text)
    return BPETokenizer.fit(train_text, config.bpe_vocab_size)


def encode_splits(tokenizer, splits):
    """{"train", "validation", "test"}: 1-D int64 tensors of token ids."""
    return {name: torch.as_tensor(np.asarray(tokenizer.encode(text)), dtype=torch.long)
            for name, text in splits.items()}


def scored_characters(tokenizer, ids, text):
    """The characters that the scored tokens (all but the first) cover."""
    return len(text) - len(tokenizer.decode([int(ids[0])]))


def measure(model, config, tokenizer, ids, splits):
    """Bits per character on the test text, each token predicted from at least context / 2 before it."""
    nats, tokens = text_nats(model, ids["test"], config.context)
    characters = scored_characters(tokenizer, ids["test"], splits["test"])
    return {"test_bpc": round(bits_per_character(nats, characters), 4), "test_nats": nats,
            "test_tokens_scored": tokens, "test_characters_scored": characters,
            "test_unknown_characters": tokenizer.count_unknown(splits["test"])}


def repeated_snippets(ids, n=INDUCTION_SNIPPETS, length=REPEAT_LENGTH):
    """n snippets of `length` tokens, evenly spaced over ids (N,), each followed by itself: (n, 2 length)."""
    starts = np.linspace(0, len(ids) - length, n).astype(int)
    snippets = torch.stack([torch.as_tensor(ids[s:s + length]) for s in starts])  # (n, length)
    return torch.cat([snippets, snippets], dim=1)  # (n, 2 length)


@torch.no_grad()
def induction_summary(model, tokenizer, text, length=REPEAT_LENGTH):
    """Chapter 11's induction score of every head, on snippets of real code (text) that repeat:
    the mean weight that position t of the repeat puts on t - L + 1, the token after the earlier
    copy of its own. Returns {"induction_scores" (n_layers x h), "best_head", "best_score",
    "first_copy_loss", "repeat_loss"} (mean losses in nats per token on each half: a model that
    copies predicts the repeat far better than the first copy)."""
    batch = repeated_snippets(tokenizer.encode(text), length=length)  # (n, 2L)
    logits, weights = model(batch, return_weights=True)  # (n, 2L, V), (n_layers, n, h, 2L, 2L)
    scores = induction_scores(weights.double().numpy(), length)  # (n_layers, h)
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), batch[:, 1:], reduction="none")
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    return {"induction_scores": np.round(scores, 4).tolist(), "best_head": [int(layer), int(head)],
            "best_score": round(float(scores[layer, head]), 4),
            "first_copy_loss": round(losses[:, :length - 1].mean().item(), 4),
            "repeat_loss": round(losses[:, length:].mean().item(), 4)}


def seed_summary(config, rows):
    """The seeds run's table: its config and one row per seed, with the median and range of each figure."""
    figures = ("test_bpc", "best_score", "repeat_loss", "first_copy_loss")
    summary = {name: {"median": float(np.median([row[name] for row in rows])),
                      "min": min(row[name] for row in rows), "max": max(row[name] for row in rows)}
               for name in figures if all(name in row for row in rows)}
    return {"config": {key: value for key, value in vars(config).items() if key != "seed"}, "rows": rows,
            "summary": summary}


def stored_model(run="char", *, dtype=torch.float32):
    """(model, config, run record, tokenizer) of a shipped model: run "char" or "bpe"."""
    folder = TRAINED / run
    model, config, record = load_model(folder, dtype=dtype)
    text = (folder / "tokenizer.json").read_text()
    tokenizer = (CharTokenizer if config.tokenizer == "char" else BPETokenizer).from_json(text)
    return model, config, record, tokenizer


def stored_seeds():
    """The seeds run's stored table (python -m mha.text.train --preset seeds)."""
    return json.loads((TRAINED / "seeds.json").read_text())


def nucleus_positions(model, tokenizer, text, window=256):
    """The model's float64 logits at every position of `text`, read in windows of `window` characters (the
    last partial window left out): (logits (n, V), the character before each position (n,), the token that
    came next (n,)), n = a multiple of window."""
    n = (len(text) - 1) // window * window
    ids = torch.as_tensor(tokenizer.encode(text[:n + 1]))  # (n + 1,)
    with torch.inference_mode():
        rows = ids[:-1].reshape(-1, window)  # (n / window, window)
        logits = torch.cat([model(rows[i:i + 64]) for i in range(0, len(rows), 64)])  # (n / window, window, V)
    return logits.reshape(n, -1).double().numpy(), np.array(list(text[:n])), ids[1:].numpy()


def nucleus_summary(logits, before, came_next, p=0.9, k=5):
    """What top-p keeps, and how honest the model is, at every position: logits (n, V), before (n,) the
    character before each position, came_next (n,) the token that followed. The groups: after a space that
    follows a word (between words), after a space that follows a space or a newline (indentation), inside a
    name, after a newline, after anything else."""
    import mha.numpy as mnp

    probs = mnp.softmax(logits)  # (n, V)
    kept = np.isfinite(mnp.filter_logits(logits, top_p=p))  # (n, V): the nucleus of every position
    sizes = kept.sum(axis=-1)  # (n,)
    earlier = np.concatenate([["\n"], before[:-1]])  # the character two before each position
    space = before == " "
    groups = {"between words": space & ~np.isin(earlier, [" ", "\n"]), "indentation": space & np.isin(earlier, [" ", "\n"]),
              "inside a name": np.char.isalnum(before) | (before == "_"), "after a newline": before == "\n"}
    groups["after anything else"] = ~(space | groups["inside a name"] | groups["after a newline"])
    inside = kept[np.arange(len(came_next)), came_next]
    return {"positions": int(len(sizes)), "median": float(np.median(sizes)), "largest": int(sizes.max()),
            "one_alone": float(np.mean(sizes == 1)),
            "groups": {name: {"positions": int(where.sum()), "median": float(np.median(sizes[where]))}
                       for name, where in groups.items()},
            "top_k_drops_a_tenth": float(np.mean(np.sort(probs, axis=-1)[:, -k:].sum(axis=-1) < 0.9)),
            "top_k_keeps_more": float(np.mean(sizes < k)),
            "inside": float(inside.mean()), "nucleus_mass": float(np.where(kept, probs, 0).sum(axis=-1).mean()),
            "top_1_right": float(np.mean(probs.argmax(axis=-1) == came_next)), "top_1_mass": float(probs.max(axis=-1).mean()),
            "histogram": np.bincount(sizes).tolist()}


def stored_nucleus():
    """nucleus_summary of the character model on the whole test text, and on each fifth of it (nucleus.json)."""
    return json.loads((TRAINED / "nucleus.json").read_text())


def stored_scoring():
    """The two models' bits per character under each scoring stride (tools/data/score_protocols.py):
    {"runs": {"char" | "bpe": {"context", "rows": [{"stride", "min_context", "test_bpc", ...}], ...}}}."""
    return json.loads((TRAINED / "scoring.json").read_text())


def nats_to_bits(nats):
    return nats / math.log(2)
