"""Chapter 14's experiment: language models of Python's standard library, measured.

RUNS names the configurations `tools/data/train_lm.py` trains: the shipped character model
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
    """The seeds run's stored table (tools/data/train_lm.py --run seeds)."""
    return json.loads((TRAINED / "seeds.json").read_text())


def nats_to_bits(nats):
    return nats / math.log(2)
