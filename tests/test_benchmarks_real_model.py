"""The benchmark of a real model (chapter 16) runs on a tiny random Llama, times the library's TransformerLM.generate
against transformers' generate with both caches, and its stored table, measured on SmolLM2-135M-Instruct, holds
every row the chapter prints with the course's copy at most as slow as transformers in both phases. The tiny run
times nothing that a test reads: its ratios only have to be positive numbers, whatever the machine's load."""

import json
import statistics

import pytest
import torch

from benchmark_tables import RESULTS, check_ratio_columns, positive
from benchmarks import real_model

import mha.torch as mt


@pytest.fixture(scope="module")
def tiny_table():
    tables = real_model.run(tiny=True)
    assert [table.name for table in tables] == ["smollm2_generate"]
    return tables[0]


def expected_rows(size):
    return [(n, T, phase) for n in size["threads"] for T in size["Ts"] for phase in real_model.PHASES]


def check_rows(record_rows, columns, size):
    assert [(row["threads"], row["prompt T"], row["phase"]) for row in record_rows] == expected_rows(size)
    for row in record_rows:
        assert row["new tokens"] == size["new"]
        assert all(positive(row[c]) for c in columns if c.endswith("(ms)"))
        check_ratio_columns(row, "ours / generate()", "min", "max")
        check_ratio_columns(row, "ours / generate(static)", "min (static)", "max (static)")
        met = max(row["ours / generate()"], row["ours / generate(static)"]) <= real_model.TARGET
        assert row["target"] == "<= 1.00" and row["met"] == ("yes" if met else "NO")


def test_the_tiny_table_has_every_row_and_sane_ratios(tiny_table):
    assert tiny_table.columns == real_model.COLUMNS
    check_rows(tiny_table.rows, tiny_table.columns, real_model.TINY)
    assert tiny_table.settings["rounds"] == real_model.TINY["rounds"]


def test_the_table_times_our_generate_against_transformers_with_both_caches(monkeypatch):
    """Counting calls: every round calls TransformerLM.generate once, and LlamaForCausalLM.generate once
    with its default cache and once with cache_implementation="static"; the thread count comes back."""
    from transformers import LlamaForCausalLM

    calls = {"ours": 0, "dynamic": 0, "static": 0}
    ours, theirs = mt.TransformerLM.generate, LlamaForCausalLM.generate

    def counted_ours(self, *args, **kwargs):
        calls["ours"] += 1
        return ours(self, *args, **kwargs)

    def counted_theirs(self, *args, **kwargs):
        calls["static" if kwargs.get("cache_implementation") == "static" else "dynamic"] += 1
        return theirs(self, *args, **kwargs)

    monkeypatch.setattr(mt.TransformerLM, "generate", counted_ours)
    monkeypatch.setattr(LlamaForCausalLM, "generate", counted_theirs)
    size, before = real_model.TINY, torch.get_num_threads()
    real_model.generate_table(size)
    per_row = 1 + size["warmup"] + size["rounds"]  # the call compared, then the rounds
    rows = len(size["threads"]) * len(size["Ts"])
    assert calls == {name: rows * per_row for name in calls}
    assert torch.get_num_threads() == before


def test_the_first_forward_hook_stamps_the_prefill_only():
    model = torch.nn.Linear(2, 2)
    hook = real_model.FirstForward(model)
    model(torch.zeros(2))
    first = hook.first
    model(torch.zeros(2))
    assert hook.first == first  # a later forward moves nothing
    hook.reset()
    assert hook.first is None
    hook.remove()
    model(torch.zeros(2))
    assert hook.first is None  # removed: no stamp


def test_the_stored_table_has_every_row_and_the_course_is_as_fast_as_transformers():
    record = json.loads((RESULTS / "smollm2_generate.json").read_text())
    assert record["columns"] == real_model.COLUMNS
    check_rows(record["rows"], record["columns"], real_model.FULL)
    assert record["settings"]["model"] == "SmolLM2-135M-Instruct" and record["settings"]["dtype"] == "float32"
    assert record["settings"]["rounds"] >= 11 and record["settings"]["threads"] == [1, 2]
    ratios = [row[column] for row in record["rows"] for column in ("ours / generate()", "ours / generate(static)")]
    # The two programs run the same matrix products on the same weights: the course's copy is as fast as
    # transformers' generate over the table (median <= 1.00) and no row is slower beyond one machine's noise.
    assert statistics.median(ratios) <= 1.00, ratios
    assert max(ratios) <= 1.05, ratios
    for row in record["rows"]:
        met = max(row["ours / generate()"], row["ours / generate(static)"]) <= real_model.TARGET
        assert row["met"] == ("yes" if met else "NO"), row
    assert "target: both ratios <= 1.00" in record["notes"]
