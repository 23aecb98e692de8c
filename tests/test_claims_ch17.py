"""Chapter 17's sentences about what each attention costs in quality, asserted over the stored seeds.

The sweep "ch17_cache_quality" (mha.experiments.remembering, written by tools/data/seed_sweeps.py): small
models of chapter 14's shape trained with multi-head, grouped, multi-query and latent attention, sliding
windows of 32 and 8 tokens, and cross-layer KV sharing, six seeds each; bits per character on a fixed slice
of the test text against the bytes per token their caches hold. Each claim is asserted over every stored
seed with a margin the seeds' spread supports, and on a held-out seed trained here; one stored row is
trained again here.
"""

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt
from mha.experiments import remembering, seeds
from mha.experiments.induction import one_thread

QUALITY = "ch17_cache_quality"
SIZE = remembering.SIZE


def bpc(variant, rows=None):
    """The bits per character of every stored seed of `variant`, in seed order: (n_seeds,)."""
    rows = seeds.load(QUALITY)["rows"] if rows is None else rows
    group = sorted(remembering.rows_by_variant(rows)[variant], key=lambda row: row["training_seed"])
    return np.array([row["bits_per_character"] for row in group])


@pytest.fixture(scope="module")
def held_out():
    """The held-out model (trained here, never stored): its variant and its row."""
    with one_thread():
        row = seeds.held_out_rows(QUALITY)[0]
    return remembering.split_seed(row["seed"])[0], row


def test_a_stored_row_is_trained_again_within_its_tolerance():
    """Multi-query attention, seed 0: 400 steps of training on one thread (10 s under this CPU's own
    kernels, about 25 s under the generic ones). Measured on an AMD EPYC machine: 0 apart under the generic
    kernels, 1.5e-5 under its AVX2 kernels; the tolerance, 0.01 bits, leaves room for other CPUs and is
    below the smallest difference the chapter states (0.018)."""
    with one_thread():
        row, fresh, gap = seeds.rederive("ch17_cache_quality", remembering.variant_seed("MQA", 0))
    assert gap <= seeds.get_sweep(QUALITY).tolerance, f"{row} re-derived as {fresh}: {gap} apart"


def test_the_table_holds_six_seeds_of_every_variant_at_one_size():
    table = seeds.load(QUALITY)
    grouped = remembering.rows_by_variant(table["rows"])
    assert list(grouped) == ["MHA", "GQA", "MQA", "MLA", "window 32", "window 8", "shared"]
    for variant, rows in grouped.items():
        assert sorted(row["training_seed"] for row in rows) == list(range(6)), variant
    assert "OMP_NUM_THREADS=1" in table["kernels"]
    assert (SIZE.d_model, SIZE.n_layers, SIZE.n_heads, SIZE.context, SIZE.batch_size, SIZE.steps) == \
        (64, 2, 4, 128, 8, 400)


# The caches: bytes per token, measured from the library's caches and as the formulas ----------------------


def formula_bytes_per_token():
    """Each variant's cache in float32 (4 bytes a number) at T = 128, from the formulas of chapters 12 and 17."""
    T, L = SIZE.context, SIZE.n_layers
    kv = lambda n_layers, h_kv, T_held: mt.kv_cache_bytes(n_layers, h_kv, 16, T_held, bytes_per_value=4) / T
    return {"MHA": kv(L, 4, T), "GQA": kv(L, 2, T), "MQA": kv(L, 1, T),
            "MLA": mt.latent_cache_bytes(L, 32, 8, T, bytes_per_value=4) / T,
            "window 32": kv(L, 4, 31), "window 8": kv(L, 4, 7), "shared": kv(1, 4, T)}


def test_the_cache_bytes_per_token_are_the_formulas():
    expected = formula_bytes_per_token()
    assert expected == {"MHA": 1024, "GQA": 512, "MQA": 256, "MLA": 320, "window 32": 248, "window 8": 56,
                        "shared": 512}
    stored = {variant: rows[0]["cache_bytes_per_token"] for variant, rows in
              remembering.rows_by_variant(seeds.load(QUALITY)["rows"]).items()}
    assert stored == expected


@pytest.mark.parametrize("variant", list(remembering.VARIANTS))
def test_a_fresh_model_of_each_variant_holds_those_bytes(variant):
    """Untrained models: the bytes are a matter of shapes, read here from the caches themselves."""
    tokenizer, ids = remembering.token_ids()
    config = remembering.VariantConfig(variant=variant, d_model=64, n_layers=2, n_heads=4, d_ff=176)
    model = mt.TransformerLM(config.model_config(tokenizer.vocab_size))
    measured = remembering.cache_bytes_per_token(model, ids["test"][:SIZE.context])
    assert measured == formula_bytes_per_token()[variant]


# What each costs in bits per character -------------------------------------------------------------------


def test_the_table_as_the_chapter_prints_it():
    """Median and range over the six seeds, rounded as printed."""
    table = remembering.quality_table()
    printed = {variant: tuple(round(row[key], 2) for key in ("median", "low", "high"))
               for variant, row in table.items()}
    assert printed == {"MHA": (3.07, 3.03, 3.12), "GQA": (3.11, 3.08, 3.14), "MQA": (3.12, 3.04, 3.17),
                       "MLA": (3.28, 3.18, 3.31), "window 32": (3.04, 2.99, 3.07), "window 8": (3.03, 2.99, 3.06),
                       "shared": (3.10, 3.07, 3.13)}


def test_sharing_key_value_heads_costs_bits_on_every_seed():
    """"Grouped and multi-query attention cost bits on every one of the six seeds: 0.028 and 0.055 at the
    median" (from 0.018 to 0.093); the smallest cost is more than the sweep's tolerance."""
    gqa, mqa = remembering.paired_differences("GQA"), remembering.paired_differences("MQA")
    assert gqa.min() > 0.015 and mqa.min() > 0.015
    assert round(float(np.median(gqa)), 3) == 0.028 and round(float(np.median(mqa)), 3) == 0.055
    assert max(gqa.max(), mqa.max()) < 0.1


def test_the_seeds_spread_as_much_as_the_heads_cost():
    """"MHA's own seeds span 0.1 bits (3.03 to 3.12), more than GQA's or MQA's median cost: only the
    same seed, model against model, shows the cost"; MQA's best seed beats MHA's median."""
    mha, mqa = bpc("MHA"), bpc("MQA")
    assert mha.max() - mha.min() > np.median(remembering.paired_differences("MQA"))
    assert mqa.min() < np.median(mha)


def test_multi_head_latent_attention_costs_the_most_here():
    """"At this size and budget MLA costs the most, 0.2 bits at the median (0.12 to 0.25), worse than MHA
    on every seed: its best seed is worse than MHA's worst, and than every other variant's worst"."""
    mla = remembering.paired_differences("MLA")
    assert round(float(np.median(mla)), 1) == 0.2 and mla.min() > 0.1 and mla.max() < 0.26
    others = [bpc(v).max() for v in remembering.VARIANTS if v != "MLA"]
    assert bpc("MLA").min() > max(others) + 0.01


def test_the_windows_cost_nothing_here():
    """"Windows of 32 and of 8 tokens do no worse: better than MHA on five of the six seeds, their
    medians below MHA's": these models have learned little that reaches more than 8 characters back."""
    for variant in ("window 32", "window 8"):
        differences = remembering.paired_differences(variant)
        assert np.sum(differences < 0) == 5 and np.median(differences) < -0.03
        assert np.median(bpc(variant)) < np.median(bpc("MHA"))


def test_what_the_table_does_not_show():
    """Not claimed, because the seeds disagree: that MQA costs more than GQA (worse on 4 of 6 seeds), that
    sharing one layer's keys with the next costs anything (worse than MHA on 4 of 6, better on 2), or that
    it costs less than GQA at the same 512 bytes."""
    assert 0 < np.sum(remembering.paired_differences("MQA", "GQA") > 0) < 6
    shared = remembering.paired_differences("shared")
    assert shared.min() < 0 < shared.max() and np.sum(shared > 0) == 4
    assert 0 < np.sum(remembering.paired_differences("shared", "GQA") > 0) < 6


def test_every_model_beats_a_bigram_model_and_none_reaches_gzip():
    """On the same 40 000 characters: a bigram model of the training text 3.69 bits, gzip alone 2.20."""
    from mha.text import baselines, corpus
    splits = corpus.load_splits()
    scored = splits["test"][:remembering.SCORED_CHARS]
    assert round(baselines.bigram_bpc(splits["train"], scored), 2) == 3.69
    assert round(baselines.compressor_bpc(scored, "gzip"), 2) == 2.20
    everything = np.concatenate([bpc(v) for v in remembering.VARIANTS])
    assert everything.max() < 3.69 - 0.3 and everything.min() > 2.20 + 0.5


def test_a_held_out_seed_keeps_the_8_token_window_within_multi_head_attention_s_seeds(held_out):
    """The 8-token window on a seed never stored, trained here: 56 bytes a token (an eighteenth of MHA's
    cache at T = 128), and within the range of MHA's six seeds, as on the stored ones."""
    variant, row = held_out
    assert variant == "window 8" and row["cache_bytes_per_token"] == 56
    assert row["bits_per_character"] < bpc("MHA").max()


# The Experiments' solutions: what the chapter says of one draw holds on five more ----------------------------


def balanced_loads(seed, rounds=200, step=0.01):
    """Chapter 17's "Balancing without a loss", drawn with `seed`: 4096 tokens of width 32 routed to 2 of 16
    experts by sigmoid scores, experts 0-3 favoured (their router columns 3 times larger); the loads (shares of
    the slots) without the bias and after `rounds` updates of the bias, and whether the weights stayed the scores."""
    rng = np.random.default_rng(seed)
    tokens = rng.normal(size=(4096, 32))
    W_router = rng.normal(size=(32, 16)) / np.sqrt(32)
    W_router[:, :4] *= 3.0
    logits = tokens @ W_router  # (tokens, experts)
    bias, loads = np.zeros(16), []
    for round_number in range(rounds + 1):
        weights, chosen = mnp.route_tokens(logits, 2, scoring="sigmoid", bias=bias)
        loads.append(np.bincount(chosen.ravel(), minlength=16) / chosen.size)
        bias -= step * np.sign(loads[-1] - 1 / 16)
    scores = np.take_along_axis(1 / (1 + np.exp(-logits)), chosen, axis=-1)
    return loads[0], loads[-1], np.allclose(weights, scores, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(170, 176))
def test_the_bias_alone_balances_the_experts(seed):
    """Seed 170 is the chapter's: "the four favoured experts take about three fifths of the slots, the busiest
    expert more than twice the average load ... the busiest at about 1.1 times it"; and the range it gives."""
    before, after, weights_are_scores = balanced_loads(seed)
    assert 0.55 <= before[:4].sum() <= 0.62
    assert 2.35 <= before.max() * 16 <= 2.85 and before.max() * 16 > 2 * after.max() * 16
    assert after.max() * 16 <= 1.16 and weights_are_scores


def sparse_model(seed):
    """The tiny DeepSeek-V3.2 of chapter 17's sparse attention section, its weights drawn with `seed` (7 is the
    chapter's), copied into a TransformerLM."""
    import transformers

    latent = dict(kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    config = transformers.DeepseekV32Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, bos_token_id=None, eos_token_id=None, pad_token_id=None, first_k_dense_replace=2,
        index_n_heads=8, index_head_dim=16, index_topk=4, **latent)
    config._attn_implementation = "eager"
    model = transformers.DeepseekV32ForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=gen)
            parameter.add_(0.1 * noise) if "norm" in name else parameter.copy_(0.3 * noise)
    return mt.from_transformers(model.eval())


def dropped_weight(model, k, probe, dense, dense_weights):
    """With every indexer keeping k keys: layer 0's full-attention weight on the dropped keys (mean and largest
    over the rows) and how far the logits moved, over the largest dense logit."""
    indexers = [block.attention.indexer for block in model.blocks]
    scores = []
    hook = indexers[0].register_forward_hook(lambda module, inputs, out: scores.append(out))
    for indexer in indexers:
        indexer.top_k = k
    moved = float((model(probe) - dense).abs().max() / dense.abs().max())
    hook.remove()
    causal = torch.ones(12, 12, dtype=torch.bool).tril()  # (T, T)
    left_out = causal & ~mt.select_top_k_keys(scores[0], k, causal)  # (B, T, T)
    lost = (dense_weights[0] * left_out[:, None]).sum(dim=-1)  # (B, h, T)
    return float(lost.mean()), float(lost.max()), moved


@pytest.mark.parametrize("seed", range(7, 13))
def test_how_few_keys_on_six_random_models(seed):
    """Seed 7 is the chapter's model: "at top_k = 4 the dropped keys hold 0.29 to 0.36 of the weight on average,
    and some row loses at least 98 % of it; at top_k = 1, 0.66 to 0.78; from top_k = 4 down, the logits move by
    more than 0.9 of the largest"; nothing moves at top_k = 12, something at 11."""
    model = sparse_model(seed)
    probe = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), one_thread():
        for block in model.blocks:
            block.attention.indexer.top_k = 12
        dense, dense_weights = model(probe, return_weights=True)
        found = {k: dropped_weight(model, k, probe, dense, dense_weights) for k in (12, 11, 4, 3, 2, 1)}
    assert found[12][:2] == (0.0, 0.0) and found[12][2] < 1e-5 < 1e-2 < found[11][2]  # rounding only, then a move
    assert 0.28 <= found[4][0] <= 0.37 and found[4][1] >= 0.98 and 0.65 <= found[1][0] <= 0.79
    assert found[4][0] < found[3][0] < found[2][0] < found[1][0]
    assert min(found[k][2] for k in (4, 3, 2, 1)) > 0.9
