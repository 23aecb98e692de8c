"""The benchmark scripts run (on tiny sizes), measure the library's own code, and
produce the tables the book reads. Nothing here times anything: the ratios only
have to be positive numbers, whatever the machine's load."""

import json
import math
import subprocess
import sys

import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt
from conftest import ROOT
from mha import benchmark_results

sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the repository, not an installed package
from benchmarks import decoding, generation, gpu, harness, memory, speed, sweeps  # noqa: E402
from benchmarks import distributed, training  # noqa: E402

RESULTS = ROOT / "src" / "mha" / "benchmark_results"
STORED = ["mha_vs_pytorch", "encoder_vs_pytorch", "numpy_vs_pytorch", "causal", "sweep_T", "sweep_h",
          "loop_vs_fused", "memory", "generation", "kv_cache_memory", "gqa_vs_pytorch", "decoding_vs_transformers",
          "generate_vs_transformers", "training_vs_pytorch", "sampling_speed", "distributed_step"]


def positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def speed_tables():
    return {t.name: t for t in speed.run(tiny=True)}


@pytest.fixture(scope="module")
def sweep_tables():
    return {t.name: t for t in sweeps.run(tiny=True)}


@pytest.fixture(scope="module")
def generation_tables():
    return {t.name: t for t in [*generation.run(tiny=True), *decoding.run(tiny=True)]}


def test_speed_tables_have_their_rows_and_sane_ratios(speed_tables):
    expected = {
        "mha_vs_pytorch": ["forward, no weights", "forward, per-head weights", "forward + backward"],
        "encoder_vs_pytorch": ["forward", "forward + backward"],
        "numpy_vs_pytorch": ["forward vs PyTorch without weights", "forward vs PyTorch with per-head weights",
                             "forward vs PyTorch called by default (training mode)"],
        "causal": ["ours causal=True vs nn.MultiheadAttention with a boolean causal mask",
                   "ours causal=True vs ours with mask=causal_mask(T)"],
    }
    assert list(speed_tables) == list(expected)
    for name, comparisons in expected.items():
        table = speed_tables[name]
        assert [row["comparison"] for row in table.rows] == comparisons
        for row in table.rows:
            assert positive(row["ratio"]) and row["ratio"] < 1000
            assert all(positive(v) for k, v in row.items() if k.endswith("(ms)"))
    targets = {row["target"] for name in ("mha_vs_pytorch", "encoder_vs_pytorch", "numpy_vs_pytorch")
               for row in speed_tables[name].rows}
    assert targets == {"<= 1.05", "<= 1.1", "<= 1.5"}
    for name in ("mha_vs_pytorch", "encoder_vs_pytorch", "numpy_vs_pytorch"):
        for row in speed_tables[name].rows:
            assert row["met"] == ("yes" if row["ratio"] <= float(row["target"][3:]) else "NO")


def test_sweep_tables_cover_every_setting(sweep_tables):
    assert [row["T"] for row in sweep_tables["sweep_T"].rows] == list(sweeps.TINY["Ts"])
    assert [row["h"] for row in sweep_tables["sweep_h"].rows] == list(sweeps.TINY["heads"])
    loop = sweep_tables["loop_vs_fused"].rows
    assert [(row["T"], row["backend"], row["h"]) for row in loop] == [
        (T, backend, h) for T in sweeps.TINY["loop_Ts"] for h in sweeps.TINY["loop_heads"]
        for backend in ("mha.torch", "mha.numpy")]
    for row in sweep_tables["sweep_T"].rows:
        assert row["B"] * row["T"] == sweeps.TINY["tokens"]
        assert 0 < row["attention share of multiply-adds"] < 1
    shares = [row["attention share of multiply-adds"] for row in sweep_tables["sweep_T"].rows]
    assert shares == sorted(shares), "attention's share grows with T"
    for table in sweep_tables.values():
        for row in table.rows:
            assert positive(row.get("ratio", row.get("speed-up")))


def test_the_benchmarked_code_is_the_librarys_own(monkeypatch):
    """Counting calls: the tables time mha.torch and mha.numpy, not copies of them."""
    calls = {"torch": 0, "numpy": 0}
    forward, reference = mt.MultiHeadAttention.forward, mnp.multihead_attention

    def counted_forward(self, *args, **kwargs):
        calls["torch"] += 1
        return forward(self, *args, **kwargs)

    def counted_numpy(*args, **kwargs):
        calls["numpy"] += 1
        return reference(*args, **kwargs)

    monkeypatch.setattr(mt.MultiHeadAttention, "forward", counted_forward)
    monkeypatch.setattr(mnp, "multihead_attention", counted_numpy)
    speed.mha_table(speed.TINY)
    speed.numpy_table(speed.TINY)
    rounds = speed.TINY["rounds"] + speed.TINY["warmup"]
    assert calls["torch"] >= 3 * rounds and calls["numpy"] >= 3 * rounds


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


def check_ratio_columns(row, ratio, low, high):
    """A median ratio of rounds lies between their smallest and largest, all positive."""
    assert positive(row[low]) and row[low] <= row[ratio] <= row[high], row


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


@pytest.fixture(scope="module")
def training_tables():
    return {t.name: t for t in training.run(tiny=True)}


def test_training_tables_run_at_tiny_size(training_tables):
    assert list(training_tables) == ["training_vs_pytorch", "sampling_speed"]
    table = training_tables["training_vs_pytorch"]
    assert [row["threads"] for row in table.rows] == [1] and table.settings["rounds"] == training.TINY["rounds"]
    for row in table.rows:
        assert positive(row["ours (ms/step)"]) and positive(row["PlainLM (ms/step)"])
        check_ratio_columns(row, "ratio", "min", "max")
        assert row["target"] == "<= 1.10" and row["met"] == ("yes" if row["ratio"] <= 1.10 else "NO")
        assert 0 <= row["logits gap"] <= training.LOGITS_TOLERANCE
        assert 0 <= row["gradients gap"] <= training.GRADIENT_TOLERANCE
    sampling = training_tables["sampling_speed"]
    assert [(row["prompt T"], row["new tokens"]) for row in sampling.rows] == \
        [(T, n) for T in training.TINY["prompts"] for n in training.TINY["new_tokens"]]
    assert sampling.settings["threads"] == 1 and sampling.settings["model"].startswith("untrained")
    for row in sampling.rows:
        assert positive(row["cached (tokens/s)"]) and positive(row["uncached (tokens/s)"])
        check_ratio_columns(row, "speed-up", "min", "max")


def test_the_training_table_times_a_step_of_the_course_model_and_of_the_plain_one(monkeypatch):
    """Counting calls: each timed step runs TransformerLM.forward on our side, PlainLM.forward on
    the other, and an AdamW step on each."""
    calls = {"ours": 0, "plain": 0, "AdamW": 0}
    ours, plain, step = mt.TransformerLM.forward, training.PlainLM.forward, torch.optim.AdamW.step

    def counted(name, forward):
        def call(self, *args, **kwargs):
            calls[name] += 1
            return forward(self, *args, **kwargs)
        return call

    monkeypatch.setattr(mt.TransformerLM, "forward", counted("ours", ours))
    monkeypatch.setattr(training.PlainLM, "forward", counted("plain", plain))
    monkeypatch.setattr(torch.optim.AdamW, "step", counted("AdamW", step))
    size, threads = training.TINY, torch.get_num_threads()
    training.training_table(size)
    steps = size["rounds"] + size["warmup"]
    assert calls == {"ours": 1 + steps, "plain": 1 + steps, "AdamW": 2 * steps}  # 1: the comparison first
    assert torch.get_num_threads() == threads


def tiny_pair():
    config = training.RUNS["tiny"][0]
    course = training.new_model(config, training.char_vocab_size())
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(training.char_vocab_size(), (2, config.context + 1), generator=generator)  # (B, T + 1)
    return course, training.plain_copy(course, config), batch


def test_plain_lm_computes_the_course_models_logits_and_gradients():
    course, plain, batch = tiny_pair()
    logit_gap, gradient_gap = training.check_same_model(course, plain, batch)
    assert logit_gap <= training.LOGITS_TOLERANCE and gradient_gap <= training.GRADIENT_TOLERANCE
    with torch.no_grad():
        torch.testing.assert_close(plain(batch[:, :-1]), course(batch[:, :-1]), rtol=1e-5, atol=1e-5)  # (B, T, V)
    assert all(p.grad is None for model in (course, plain) for p in model.parameters())  # left clean for timing


def test_the_comparison_refuses_a_wrong_copy():
    course, plain, batch = tiny_pair()
    with torch.no_grad():
        plain.layers[0].attention.q_proj.weight[0, 0] += 0.5
    with pytest.raises(AssertionError, match="logits differ by"):
        training.check_same_model(course, plain, batch)
    course, plain, batch = tiny_pair()  # untied: the same logits, but the embedding misses the output's gradient
    plain.lm_head.weight = torch.nn.Parameter(plain.embedding.weight.detach().clone())
    with pytest.raises(AssertionError, match="gradients of embedding.weight differ"):
        training.check_same_model(course, plain, batch)


def test_the_sampling_table_samples_with_and_without_the_cache(monkeypatch):
    """Counting calls: mt.generate feeds the TransformerLM one token at a time with its cache
    (cached), and every token again without one (uncached)."""
    calls = {"with cache": 0, "one new token": 0, "without cache": 0}
    forward = mt.TransformerLM.forward

    def counted(self, tokens, *args, **kwargs):
        cached = kwargs.get("cache") is not None
        calls["with cache" if cached else "without cache"] += 1
        calls["one new token"] += cached and tokens.shape[-1] == 1
        return forward(self, tokens, *args, **kwargs)

    monkeypatch.setattr(mt.TransformerLM, "forward", counted)
    size = dict(training.TINY, prompts=(5,), new_tokens=(4,))
    table = training.sampling_table(size)
    calls_made = 1 + size["sample_rounds"] + size["warmup"]  # the tokens compared, then the rounds
    assert calls == {"with cache": 4 * calls_made, "one new token": 3 * calls_made, "without cache": 4 * calls_made}
    assert [(row["prompt T"], row["new tokens"]) for row in table.rows] == [(5, 4)]


def test_stored_training_table_meets_its_target_on_the_chapters_model():
    record = json.loads((RESULTS / "training_vs_pytorch.json").read_text())
    config = training.RUNS["char"][0]
    assert {k: record["settings"][k] for k in ("run", "vocab", "d_model", "n_layers", "n_heads", "d_ff", "context",
                                               "batch", "dtype")} == \
        {"run": "char", "vocab": training.char_vocab_size(), "d_model": config.d_model, "n_layers": config.n_layers,
         "n_heads": config.n_heads, "d_ff": config.d_ff, "context": config.context, "batch": config.batch_size,
         "dtype": "float32"}
    assert record["settings"]["rounds"] >= 7 and [row["threads"] for row in record["rows"]][-1] == 1
    assert len(record["rows"]) == len(training.FULL["threads"])
    for row in record["rows"]:
        check_ratio_columns(row, "ratio", "min", "max")
        assert row["met"] == ("yes" if row["ratio"] <= 1.10 else "NO")
        assert row["ratio"] <= 1.10, row  # the target, measured
        assert row["logits gap"] <= training.LOGITS_TOLERANCE and row["gradients gap"] <= training.GRADIENT_TOLERANCE
    assert "target: ours / PlainLM <= 1.10" in record["notes"]


def test_stored_sampling_table_measures_the_stored_char_model():
    record = json.loads((RESULTS / "sampling_speed.json").read_text())
    assert record["settings"]["model"].startswith("the stored char model")
    assert {k: record["settings"][k] for k in ("vocab", "d_model", "n_layers", "batch", "threads", "dtype")} == \
        {"vocab": training.char_vocab_size(), "d_model": 128, "n_layers": 4, "batch": 1, "threads": 1,
         "dtype": "float32"}
    assert [(row["prompt T"], row["new tokens"]) for row in record["rows"]] == \
        [(T, n) for T in training.FULL["prompts"] for n in training.FULL["new_tokens"]]
    assert record["settings"]["rounds"] >= 7
    for row in record["rows"]:
        assert positive(row["cached (tokens/s)"]) and positive(row["uncached (tokens/s)"])
        check_ratio_columns(row, "speed-up", "min", "max")
    speedups = [row["speed-up"] for row in record["rows"]]
    assert speedups[-1] > 1 and speedups[-1] == max(speedups), speedups  # the cache pays most on a long prompt


def test_memory_table_measures_each_form_in_its_own_process():
    table = memory.run(tiny=True)[0]
    forms = list(memory.FORMS.values())
    assert [(row["T"], row["form"]) for row in table.rows] == [(T, f) for T in memory.TINY["Ts"] for f in forms]
    for row in table.rows:
        assert row["note"] == ""
        assert 0 < row["at start (GiB)"] <= row["peak (GiB)"] < 2


def test_memory_table_skips_what_would_not_fit():
    size = dict(memory.TINY, Ts=(64,), budget_gib=1e-9)
    rows = memory.memory_table(size).rows
    assert rows[0]["note"].startswith("not run: would need about") and rows[0]["peak (GiB)"] == ""
    assert positive(rows[1]["peak (GiB)"])


def test_one_command_prints_every_table_and_saves_csv_and_json(tmp_path):
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--tiny", "--save", str(tmp_path),
                             "--only", "mha,causal,sweep_T,kv_cache_memory"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("machine: cpu ")
    for title in ("mha.torch.MultiHeadAttention vs torch.nn.MultiheadAttention", "Causal self-attention",
                  "Forward time across T", "KV cache memory of MHA, GQA and MQA"):
        assert title in result.stdout
    for name in ("mha_vs_pytorch", "causal", "sweep_T", "kv_cache_memory"):
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert record["name"] == name and record["rows"] and record["machine"]["cores"] >= 1
        header = (tmp_path / f"{name}.csv").read_text().splitlines()[0]
        assert header.split(",") == record["columns"]
    assert "encoder_vs_pytorch" not in result.stdout


def test_unknown_table_names_are_refused(capsys):
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--only", "nope"])
    assert info.value.code == 2 and "unknown tables ['nope']" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed without a GPU")
def test_gpu_script_says_there_is_no_gpu_and_exits_0():
    result = subprocess.run([sys.executable, "-m", "benchmarks.gpu"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0
    assert "No CUDA GPU found" in result.stdout


def test_gpu_tables_run_on_the_cpu_at_tiny_size():
    tables = gpu.run("cpu", tiny=True)
    assert [t.name for t in tables] == ["gpu_mha", "gpu_encoder", "gpu_attention", "gpu_gqa"]
    assert {row["dtype"] for row in tables[0].rows} == {"float32", "bfloat16"}
    forms = [row["form"] for row in tables[2].rows]
    assert forms.count("fused kernel") == forms.count("explicit") == forms.count("chunked") == 4
    for table in (tables[0], tables[1], tables[3]):
        assert all(positive(row["ratio"]) for row in table.rows)
    gqa = tables[3].rows
    assert len(gqa) == 2 * len(gpu.TINY["gqa_Ts"]) * len(gpu.TINY["gqa_kv"]) * 2 * 2
    assert {row["dtype"] for row in gqa} == {"float32", "bfloat16"}


def test_table_refuses_a_row_without_every_column():
    table = harness.Table("t", "title", ["a", "b"])
    table.add(a=1, b=2.5)
    with pytest.raises(ValueError, match=r"lacks columns \['b'\]"):
        table.add(a=1)
    assert "2.5" in table.text()


def test_stored_results_are_complete_and_say_where_they_came_from():
    """The book reads these files: every table, the full-size settings, the machine."""
    for name in STORED:
        record = json.loads((RESULTS / f"{name}.json").read_text())
        assert record["rows"], name
        assert {"cpu", "cores", "numpy", "torch", "date"} <= set(record["machine"]), name
        assert (RESULTS / f"{name}.csv").exists()
    mha_table = json.loads((RESULTS / "mha_vs_pytorch.json").read_text())
    assert {k: mha_table["settings"][k] for k in ("B", "T", "d", "h")} == {"B": 8, "T": 512, "d": 512, "h": 8}
    rows = json.loads((RESULTS / "memory.json").read_text())["rows"]
    chunked = [r for r in rows if r["form"] == "chunked (NumPy)"]
    assert max(r["T"] for r in chunked) == 16384


def test_the_library_loads_its_stored_tables():
    assert benchmark_results.names() == sorted(STORED)
    for name in STORED:
        assert benchmark_results.load(name) == json.loads((RESULTS / f"{name}.json").read_text())
    with pytest.raises(ValueError, match=r"no stored benchmark table named 'memroy'; stored: causal, "):
        benchmark_results.load("memroy")
    with pytest.raises(TypeError, match="name must be a table name"):
        benchmark_results.load(3)


def test_distributed_table_runs_at_tiny_size_and_counts_the_formulas_payload():
    """One launch per P (1 and 2): every scheme checked against one process, timed (positive times,
    no timing asserted), and the payload per rank equal to mnp.payload_per_layer."""
    table = distributed.run(tiny=True)[0]
    size = distributed.TINY
    B, T, d, h = size["batch"], size["seq_len"], size["d_model"], size["n_heads"]
    assert table.name == "distributed_step" and size["world_sizes"] == (1, 2)
    assert [(row["P"], row["scheme"]) for row in table.rows] == \
        [(P, name) for P in (1, 2) for name in ("one process", "tensor", "ulysses", "ring zigzag", "ring contiguous")]
    assert table.settings["threads per rank"] == 1 and table.settings["rounds"] == size["rounds"]
    assert table.notes.startswith("a 2-core machine measures the overhead of splitting (processes, gloo over "
                                  "loopback), not speed-up: 4 processes share 2 cores")
    for row in table.rows:
        P = row["P"]
        assert positive(row["fastest rank (ms)"]) and row["fastest rank (ms)"] <= row["ms/step (slowest rank)"]
        check_ratio_columns(row, "ratio to one process", "min", "max")
        assert 0 <= row["output gap"] <= 1e-5 and 0 <= row["gradient gap"] <= 1e-4
        if row["scheme"] == "one process":
            assert row["ratio to one process"] == 1.0 and row["collective"] == "" and row["wire (bytes/step)"] == 0
            continue
        scheme, op = distributed.SCHEMES[row["scheme"]][0], row["collective"]
        assert op == {"tensor": "all_reduce", "ulysses": "all_to_all", "ring": "send"}[scheme]
        formula = mnp.payload_per_layer(scheme, world_size=P, batch=B, seq_len=T, d_model=d, n_heads=h,
                                        n_kv_heads=h, d_head=d // h)
        expected = {direction: formula[direction][op] for direction in ("forward", "backward")}
        if scheme == "ring" and P == 1:  # a lone rank passes nothing on: its gradients are already home
            assert expected == {"forward": 0, "backward": 0}
        assert (row["fwd (elements)"], row["bwd (elements)"]) == (expected["forward"], expected["backward"]), row
        assert (row["fwd (bytes)"], row["bwd (bytes)"]) == (4 * expected["forward"], 4 * expected["backward"])
        share = {"all_reduce": 2 * (P - 1) / P, "all_to_all": (P - 1) / P, "send": 1}[op]
        assert row["wire (bytes/step)"] == round(share * 4 * (expected["forward"] + expected["backward"]))
    rows = {(row["P"], row["scheme"]): row for row in table.rows}
    assert rows[2, "tensor"]["fwd (elements)"] == B * T * d  # the whole output, summed over ranks
    assert rows[2, "tensor"]["wire (bytes/step)"] == 2 * 4 * B * T * d  # 2(P - 1)/P = 1 payload, each pass
    assert rows[2, "ulysses"]["fwd (elements)"] == 4 * B * (T // 2) * d  # q, k, v and out of T/2 positions
    assert rows[2, "ring zigzag"]["bwd (elements)"] == 3 * rows[2, "ring zigzag"]["fwd (elements)"] == 3 * B * T * d
