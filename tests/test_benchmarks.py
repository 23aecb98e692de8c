"""The benchmark scripts run (on tiny sizes), measure the library's own code, and
produce the tables the book reads. Nothing here times anything: the ratios only
have to be positive numbers, whatever the machine's load. Here: speed and sweeps, memory,
the GPU tables on the CPU, the distributed step, the command line and the stored tables;
generation and decoding: tests/test_benchmarks_generation.py; training and sampling:
tests/test_benchmarks_training.py."""

import json
import subprocess
import sys

import pytest
import torch

from benchmark_tables import RESULTS, ROOT, check_ratio_columns, positive
from benchmarks import distributed, gpu, harness, memory, speed, sweeps

import mha.numpy as mnp
import mha.torch as mt
from mha import benchmark_results

STORED = ["mha_vs_pytorch", "encoder_vs_pytorch", "numpy_vs_pytorch", "causal", "sweep_T", "sweep_h",
          "loop_vs_fused", "memory", "generation", "kv_cache_memory", "gqa_vs_pytorch", "decoding_vs_transformers",
          "generate_vs_transformers", "training_vs_pytorch", "sampling_speed", "distributed_step",
          "smollm2_generate", "deepseek_v3_decode", "state_versus_cache", "chunked_prefill", "hybrid_decode"]


@pytest.fixture(scope="module")
def speed_tables():
    return {t.name: t for t in speed.run(tiny=True)}


@pytest.fixture(scope="module")
def sweep_tables():
    return {t.name: t for t in sweeps.run(tiny=True)}


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


def test_show_prints_a_stored_table_in_aligned_columns_then_its_settings(capsys):
    record = {"title": "a table", "columns": ["T", "ours (ms)"], "rows": [{"T": 64, "ours (ms)": 1.5},
              {"T": 1024, "ours (ms)": 12.25}], "settings": {"rounds": 3, "dtype": "float32"}}
    benchmark_results.show(record)
    assert capsys.readouterr().out.splitlines() == [
        "a table", "T     ours (ms)", "64    1.5      ", "1024  12.25    ", "settings: rounds=3, dtype=float32"]
