"""The benchmark scripts of training and sampling run (on tiny sizes), time a step of the course's model
against a plain PyTorch copy (checked to compute the same logits and gradients) and sampling with and without
the cache, and their stored tables hold what the book reads. Nothing here times anything: the ratios only
have to be positive numbers, whatever the machine's load."""

import json

import pytest
import torch

from benchmark_tables import RESULTS, check_ratio_columns, positive
from benchmarks import training

import mha.torch as mt


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
