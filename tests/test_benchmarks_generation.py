"""The benchmark scripts of generation and decoding run (on tiny sizes), time the library's own grouped
attention, cache and model against transformers' Llama, and their stored tables hold what the book reads.
Nothing here times anything: the ratios only have to be positive numbers, whatever the machine's load."""

import json

import pytest
import torch

from benchmark_tables import RESULTS, check_ratio_columns, positive
from benchmarks import decoding, generation

import mha.torch as mt


@pytest.fixture(scope="module")
def generation_tables():
    return {t.name: t for t in [*generation.run(tiny=True), *decoding.run(tiny=True)]}


def test_the_generation_tables_time_the_librarys_grouped_attention_and_cache(monkeypatch):
    """Counting calls: GroupedQueryAttention.forward and KVCache.append of mha.torch do the work."""
    calls = {"forward": 0, "cached forward": 0, "append": 0}
    forward, append = mt.GroupedQueryAttention.forward, mt.KVCache.append

    def counted_forward(self, *args, **kwargs):
        calls["forward"] += 1
        calls["cached forward"] += kwargs.get("cache") is not None
        return forward(self, *args, **kwargs)

    def counted_append(self, *args, **kwargs):
        calls["append"] += 1
        return append(self, *args, **kwargs)

    monkeypatch.setattr(mt.GroupedQueryAttention, "forward", counted_forward)
    monkeypatch.setattr(mt.KVCache, "append", counted_append)
    size = generation.TINY
    generation.generation_table(size)
    per_T = size["gen_layers"] * (size["gen_rounds"] + size["warmup"])
    assert calls["cached forward"] >= per_T * len(size["gen_Ts"])  # the timed steps, with the cache
    assert calls["forward"] >= 2 * per_T * len(size["gen_Ts"])  # and the full forwards without it
    assert calls["append"] >= calls["cached forward"]
    calls.update(forward=0)
    generation.gqa_table(size)
    rows = len(size["gqa_Ts"]) * len(size["gqa_kv"]) * 2 * 2
    assert calls["forward"] >= rows * (size["rounds"] + size["warmup"])


def test_the_decoding_table_times_our_layers_and_cache_against_llamas(monkeypatch):
    """Counting calls: every timed step runs GroupedQueryAttention.forward with a KVCache on our side,
    and LlamaAttention.forward with a DynamicCache or a StaticCache on the other."""
    from transformers import DynamicCache, StaticCache
    from transformers.models.llama import modeling_llama as llama

    calls = {"ours": 0, "DynamicCache": 0, "StaticCache": 0}
    ours, theirs = mt.GroupedQueryAttention.forward, llama.LlamaAttention.forward

    def counted_ours(self, *args, **kwargs):
        calls["ours"] += isinstance(kwargs.get("cache"), mt.KVCache)
        return ours(self, *args, **kwargs)

    def counted_theirs(self, *args, **kwargs):
        cache = kwargs.get("past_key_values")
        if isinstance(cache, (DynamicCache, StaticCache)):
            calls[type(cache).__name__] += 1
        return theirs(self, *args, **kwargs)

    monkeypatch.setattr(mt.GroupedQueryAttention, "forward", counted_ours)
    monkeypatch.setattr(llama.LlamaAttention, "forward", counted_theirs)
    size, threads = decoding.TINY, torch.get_num_threads()
    decoding.decoding_table(size)
    # per T: a prefill, the decode compared, the timed rounds and one decode after rewinding
    steps = size["dec_steps"] * (1 + size["dec_rounds"] + size["warmup"] + 1) + 1
    assert calls == {name: len(size["dec_Ts"]) * size["gen_layers"] * steps for name in calls}
    assert torch.get_num_threads() == threads  # one thread while timing, then as before


def test_the_generate_table_times_our_model_against_generate(monkeypatch):
    calls = {"ours": 0, "theirs": 0}
    ours = mt.TransformerLM.generate
    from transformers import LlamaForCausalLM
    theirs = LlamaForCausalLM.generate

    def counted_ours(self, *args, **kwargs):
        calls["ours"] += 1
        return ours(self, *args, **kwargs)

    def counted_theirs(self, *args, **kwargs):
        calls["theirs"] += 1
        return theirs(self, *args, **kwargs)

    monkeypatch.setattr(mt.TransformerLM, "generate", counted_ours)
    monkeypatch.setattr(LlamaForCausalLM, "generate", counted_theirs)
    size = decoding.TINY
    decoding.generate_table(size)
    per_T = 1 + size["lm_rounds"] + size["warmup"]  # the call compared, then the rounds
    assert calls == {"ours": len(size["lm_Ts"]) * per_T, "theirs": 2 * len(size["lm_Ts"]) * per_T}


def test_generation_tables_run_at_tiny_size(generation_tables):
    assert list(generation_tables) == ["generation", "kv_cache_memory", "gqa_vs_pytorch", "decoding_vs_transformers",
                                       "generate_vs_transformers"]
    table = generation_tables["decoding_vs_transformers"]
    assert [row["T"] for row in table.rows] == list(decoding.TINY["dec_Ts"])
    assert table.settings["threads"] == 1 and table.settings["rounds"] == decoding.TINY["dec_rounds"]
    for row in table.rows:
        assert all(positive(row[c]) for c in table.columns if c.endswith("(ms/token)"))
        check_ratio_columns(row, "ours / DynamicCache", "min", "max")
        check_ratio_columns(row, "ours / StaticCache", "min (static)", "max (static)")
        assert row["target"] == "<= 1.00" and row["met"] == ("yes" if row["ours / DynamicCache"] <= 1 else "NO")
    whole = generation_tables["generate_vs_transformers"]
    assert [(row["prompt T"], row["new tokens"]) for row in whole.rows] == \
        [(T, decoding.TINY["lm_new"]) for T in decoding.TINY["lm_Ts"]]
    for row in whole.rows:
        assert all(positive(row[c]) for c in whole.columns if c.endswith("(ms/token)"))
        check_ratio_columns(row, "ours / generate()", "min", "max")
        check_ratio_columns(row, "ours / generate(static)", "min (static)", "max (static)")
    rows = generation_tables["generation"].rows
    assert [row["T"] for row in rows] == list(generation.TINY["gen_Ts"])
    for row in rows:
        assert all(positive(v) for v in row.values())
    kv = generation_tables["kv_cache_memory"].rows
    assert [(row["attention"], row["n_kv_heads"]) for row in kv] == [("MHA", 32), ("GQA", 8), ("MQA", 1)]
    for row in kv:
        assert row["measured (bytes)"] == row["formula (bytes)"] > 0
        assert row["measured at"] == f"{generation.TINY['mem_layers']} layers, T={generation.TINY['mem_T']}"
    gqa = generation_tables["gqa_vs_pytorch"].rows
    assert len(gqa) == len(generation.TINY["gqa_Ts"]) * len(generation.TINY["gqa_kv"]) * 2 * 2
    for row in gqa:
        assert positive(row["ratio"]) and positive(row["ours (ms)"]) and positive(row["baseline (ms)"])
        assert row["target"] == "<= 1.1" and row["met"] == ("yes" if row["ratio"] <= 1.1 else "NO")


def test_stored_generation_table_shows_the_cache_winning_more_as_T_grows():
    record = json.loads((RESULTS / "generation.json").read_text())
    assert [row["T"] for row in record["rows"]] == list(generation.FULL["gen_Ts"])
    speedups = [row["speedup"] for row in record["rows"]]
    assert all(s > 1 for s in speedups), speedups
    assert speedups == sorted(speedups) and speedups[-1] > 10 * speedups[0], speedups
    for row in record["rows"]:
        assert positive(row["without cache (ms/token)"]) and positive(row["with cache (ms/token)"])
    assert {k: record["settings"][k] for k in ("layers", "n_heads", "n_kv_heads", "batch")} == \
        {"layers": 4, "n_heads": 8, "n_kv_heads": 2, "batch": 1}


def test_stored_decoding_table_compares_every_context_length_over_enough_rounds():
    record = json.loads((RESULTS / "decoding_vs_transformers.json").read_text())
    assert [row["T"] for row in record["rows"]] == list(decoding.FULL["dec_Ts"]) == [64, 512, 2048]
    assert {k: record["settings"][k] for k in ("layers", "d_model", "n_heads", "n_kv_heads", "batch", "threads")} == \
        {"layers": 4, "d_model": 256, "n_heads": 8, "n_kv_heads": 2, "batch": 1, "threads": 1}
    assert record["settings"]["rounds"] >= 7 and record["settings"]["dtype"] == "float32"
    for row in record["rows"]:
        assert all(positive(row[c]) for c in record["columns"] if c.endswith("(ms/token)"))
        check_ratio_columns(row, "ours / DynamicCache", "min", "max")
        check_ratio_columns(row, "ours / StaticCache", "min (static)", "max (static)")
        assert row["met"] == ("yes" if row["ours / DynamicCache"] <= 1.0 else "NO")
    assert "target: ours / DynamicCache <= 1.00" in record["notes"]
    whole = json.loads((RESULTS / "generate_vs_transformers.json").read_text())
    assert [row["prompt T"] for row in whole["rows"]] == list(decoding.FULL["lm_Ts"])
    assert whole["settings"]["rounds"] >= 7 and whole["settings"]["threads"] == 1
    for row in whole["rows"]:
        check_ratio_columns(row, "ours / generate()", "min", "max")


def test_stored_kv_cache_memory_measures_exactly_the_formula():
    record = json.loads((RESULTS / "kv_cache_memory.json").read_text())
    rows = {row["attention"]: row for row in record["rows"]}
    assert [(r["attention"], r["n_kv_heads"]) for r in record["rows"]] == [("MHA", 32), ("GQA", 8), ("MQA", 1)]
    assert rows["MHA"]["GiB at 8K tokens (formula)"] == 4.0  # Llama 2 7B at 8K tokens, float16
    L, T = record["settings"]["measured layers"], record["settings"]["measured T"]
    assert (L, T) == (generation.FULL["mem_layers"], generation.FULL["mem_T"])
    for row in rows.values():
        assert row["measured at"] == f"{L} layers, T={T}"
        assert row["measured (bytes)"] == row["formula (bytes)"] == mt.kv_cache_bytes(L, row["n_kv_heads"], 128, T)
        assert row["measured scaled to 8K (GiB)"] == row["GiB at 8K tokens (formula)"]
    for column in ("GiB at 8K tokens (formula)", "measured (bytes)"):
        assert rows["MHA"][column] == 4 * rows["GQA"][column] == 32 * rows["MQA"][column]


def test_stored_gqa_vs_pytorch_has_every_configuration():
    record = json.loads((RESULTS / "gqa_vs_pytorch.json").read_text())
    size = generation.FULL
    assert [(r["T"], r["n_kv_heads"], r["RoPE"], r["causal"]) for r in record["rows"]] == [
        (T, h_kv, rope, causal) for T in size["gqa_Ts"] for h_kv in size["gqa_kv"]
        for rope in ("yes", "no") for causal in ("yes", "no")]
    for row in record["rows"]:
        assert positive(row["ours (ms)"]) and positive(row["baseline (ms)"]) and positive(row["ratio"])
        assert row["met"] == ("yes" if row["ratio"] <= 1.1 else "NO")
    assert "target <= 1.1" in record["notes"]
    assert {k: record["settings"][k] for k in ("B", "d_model", "n_heads")} == {"B": 4, "d_model": 512, "n_heads": 8}
