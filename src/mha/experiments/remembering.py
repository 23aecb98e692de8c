"""Chapter 17: what each way of remembering less costs in quality, measured.

Small language models of chapter 14's shape (`mha.text.training`: Llama's block, RoPE, SwiGLU,
AdamW on a warm-up and cosine schedule) trained on chapter 14's corpus with characters as tokens,
once per attention and seed, all at the same size and for the same steps (`SIZE`: d_model 64, two
layers, four query heads of width 16, windows of 128 tokens, 8 windows a step, 400 steps: 409 600
characters seen, a tenth of the training text once; 99 000 to 111 000 parameters):

- `VARIANTS`: each attention as the `LMConfig` fields it changes: multi-head (MHA), grouped (GQA,
  two key/value heads), multi-query (MQA, one), multi-head latent attention (MLA, DeepSeek-V2
  2024: a cached latent of 32 numbers and a rotary key of 8 per token and layer), a sliding window
  of 32 or of 8 tokens on every layer (Beltagy et al. 2020; Mistral 2023), and cross-layer KV sharing
  (Brandon et al. 2024: the second layer reuses the first layer's keys and values).
- `quality_run(variant, seed)`: train one model, then measure its bits per character on a fixed
  slice of the test text (`SCORED_CHARS` characters, every token after the first window predicted from
  at least 64 before it) and the bytes per token its cache holds after a forward of one window of `SIZE.context`
  tokens, read from the library's caches (`model.new_cache()`), in the float32 it trains in.
- `cache_quality_sweep`: the sweep "ch17_cache_quality". One row is one model: its seed number is
  100 x (the variant's index in VARIANTS) + the training seed, so that a row costs one training run
  (25-30 s on one quiet thread under the generic kernels, MLA's about 45 s; about 10 s under AVX2)
  and the claims test can train one again.
- `quality_table()`: the stored table by variant: bits per character (median, smallest, largest
  over the seeds) and cache bytes per token.

Every run is seeded (torch.manual_seed for the weights, the training seed for the batches); the
stored table is made under generic kernels and one thread (`tools/data/seed_sweeps.py`).
"""

import dataclasses
import statistics
from functools import cache

import numpy as np
import torch

import mha.torch as mt
from mha.experiments import seeds
from mha.text import corpus, training
from mha.text.tokenizer import CharTokenizer, bits_per_character

SIZE = training.TrainingConfig(
    d_model=64, n_layers=2, n_heads=4, d_ff=176, context=128, batch_size=8, steps=400, lr=3e-3,
    warmup_steps=40, eval_every=400, eval_windows=8, checkpoint_every=10 ** 6)
SCORED_CHARS = 40_000  # the first characters of the test text, scored by every model
SEEDS_PER_VARIANT = 6  # training seeds 0 .. 5 of every variant are stored
HELD_OUT_SEED = 6  # a training seed never stored: the claims test trains it

# Each variant: the LMConfig fields it changes from chapter 14's model (4 heads of width 16).
VARIANTS = {
    "MHA": dict(attention=dict(n_heads=4)),
    "GQA": dict(attention=dict(n_heads=4, n_kv_heads=2)),
    "MQA": dict(attention=dict(n_heads=4, n_kv_heads=1)),
    "MLA": dict(attention_type="latent", attention=dict(
        n_heads=4, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16)),
    "window 32": dict(attention=dict(n_heads=4, sliding_window=32)),
    "window 8": dict(attention=dict(n_heads=4, sliding_window=8)),
    "shared": dict(attention=dict(n_heads=4), kv_sharing=(0, 0)),
}


def variant_seed(variant, seed):
    """The sweep's number of one model: 100 x the variant's index in VARIANTS + its training seed."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    if not 0 <= seed < 100:
        raise ValueError(f"seed must be in [0, 100), got {seed!r}")
    return 100 * list(VARIANTS).index(variant) + seed


def split_seed(number):
    """The inverse of variant_seed: (variant, training seed)."""
    index, seed = divmod(int(number), 100)
    if not 0 <= index < len(VARIANTS):
        raise ValueError(f"sweep number {number} names variant {index}, but there are {len(VARIANTS)}")
    return list(VARIANTS)[index], seed


@dataclasses.dataclass(frozen=True)
class VariantConfig(training.TrainingConfig):
    """chapter 14's TrainingConfig, whose model has the attention of `variant` (a key of VARIANTS)."""

    variant: str = "MHA"

    def model_config(self, vocab_size):
        base = super().model_config(vocab_size)
        changes = dict(VARIANTS[self.variant])
        changes["attention"] = {"rope_base": self.rope_base, **changes["attention"]}
        return dataclasses.replace(base, **changes)


@cache
def token_ids():
    """The char tokenizer of chapter 14 (fitted on the training text) and the ids of the three texts."""
    splits = corpus.load_splits()
    tokenizer = CharTokenizer.fit(splits["train"])
    return tokenizer, {name: torch.from_numpy(tokenizer.encode(text)) for name, text in splits.items()}


@torch.no_grad()
def cache_bytes_per_token(model, tokens):
    """The bytes the model's caches hold after a forward of `tokens` (T,) (`mha.torch.cache_bytes`), divided
    by T. A sliding window's cache holds only its last window - 1 positions, whatever T is."""
    caches = model.new_cache()
    model(tokens[None], cache=caches)  # (1, T, V), filling the caches
    return mt.cache_bytes(caches) / len(tokens)


def quality_run(variant, seed, *, size=SIZE):
    """Train the model of `variant` with training seed `seed` and measure it.

    Returns {"bits_per_character": on the first SCORED_CHARS characters of the test text, windows of
    size.context tokens size.context / 2 apart; "cache_bytes_per_token": held after a forward of the
    test text's first size.context tokens (float32); "parameters"; "final_train_loss": the mean
    training loss of the last 20 steps, in nats}.
    """
    tokenizer, ids = token_ids()
    config = VariantConfig(**{**dataclasses.asdict(size), "betas": tuple(size.betas), "seed": seed, "variant": variant})
    model, curve = training.train(config, ids["train"], ids["validation"], tokenizer.vocab_size, progress=False)
    scored = ids["test"][:SCORED_CHARS]
    nats, count = training.text_nats(model, scored, size.context, stride=size.context // 2)
    return {"bits_per_character": bits_per_character(nats, count),
            "cache_bytes_per_token": cache_bytes_per_token(model, scored[:size.context]),
            "parameters": sum(p.numel() for p in model.parameters()),
            "final_train_loss": float(np.mean([point["train_loss"] for point in curve[-20:]]))}


@seeds.sweep("ch17_cache_quality", seeds=[variant_seed(v, s) for v in VARIANTS for s in range(SEEDS_PER_VARIANT)],
             tolerance=0.01, held_out=(variant_seed("window 8", HELD_OUT_SEED),))
def cache_quality_sweep(number):
    """One model of the table: `number` = variant_seed(variant, seed). The row holds the variant's
    index in VARIANTS ("variant"), the training seed ("training_seed") and what quality_run measures."""
    variant, seed = split_seed(number)
    return {"variant": list(VARIANTS).index(variant), "training_seed": seed, **quality_run(variant, seed)}


def rows_by_variant(rows):
    """{variant name: [rows]} from a list of the sweep's rows."""
    grouped = {name: [] for name in VARIANTS}
    for row in rows:
        grouped[list(VARIANTS)[int(row["variant"])]].append(row)
    return grouped


def bits_by_seed(variant, rows=None):
    """{training seed: bits per character} of `variant`, from the stored table (or from `rows`)."""
    rows = seeds.load("ch17_cache_quality")["rows"] if rows is None else rows
    return {int(row["training_seed"]): row["bits_per_character"] for row in rows_by_variant(rows)[variant]}


def paired_differences(variant, reference="MHA", rows=None):
    """bits per character of `variant` minus those of `reference`, seed by seed (the same seed: the same
    batches in the same order), over the seeds both have: (n_seeds,), in seed order."""
    ours, theirs = bits_by_seed(variant, rows), bits_by_seed(reference, rows)
    return np.array([ours[s] - theirs[s] for s in sorted(set(ours) & set(theirs))])


def quality_table(rows=None):
    """{variant: {"median", "low", "high": bits per character over its seeds, "seeds", "cache_bytes_per_token",
    "parameters"}} from the stored table (or from `rows`)."""
    rows = seeds.load("ch17_cache_quality")["rows"] if rows is None else rows
    table = {}
    for name, group in rows_by_variant(rows).items():
        if not group:
            continue
        bpc = [row["bits_per_character"] for row in group]
        table[name] = {"median": statistics.median(bpc), "low": min(bpc), "high": max(bpc), "seeds": len(bpc),
                       "cache_bytes_per_token": statistics.median(r["cache_bytes_per_token"] for r in group),
                       "parameters": int(group[0]["parameters"])}
    return table
