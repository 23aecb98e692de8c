"""Sequence parallelism by all-to-all (Ulysses) equals one process; its payload is the formula.

One launch per world size (P = 2 and 4, gloo on the CPU) runs every case.
"""

import pytest

import mha.numpy as mnp
from distributed_cases import WORLD_SIZES, assert_equal_to_one_process, launch_cases
from mha.distributed.equivalence import full_case

CASES = [
    ("mha", dict(scheme="ulysses", module="mha", seed=31)),
    ("mha causal, padded", dict(scheme="ulysses", module="mha", seed=32, causal=True, padding=True)),
    ("gqa with RoPE h=8 h_kv=4, causal, padded", dict(scheme="ulysses", module="gqa", seed=33, n_heads=8,
                                                      n_kv_heads=4, causal=True, padding=True)),
    ("gqa h_kv=2 < P=4 (repeated), padded", dict(scheme="ulysses", module="gqa", seed=34, n_heads=8, n_kv_heads=2,
                                                 padding=True)),
    ("gqa h_kv=1 (multi-query), causal", dict(scheme="ulysses", module="gqa", seed=36, n_heads=8, n_kv_heads=1,
                                              causal=True)),
    ("float64 causal, padded", dict(scheme="ulysses", module="mha", seed=35, causal=True, padding=True,
                                    dtype="float64")),
]


@pytest.fixture(scope="module")
def results():
    """{P: [per case: [per rank: result]]}: one launch per world size."""
    return launch_cases(CASES)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_equal_to_one_process(results, world_size, index):
    assert_equal_to_one_process(results[world_size][index], CASES[index][1])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_payload_is_the_formula(results, world_size, index):
    """Four all-to-alls forward (q, k, v, out) and four backward, each rank handing B (T/P) d_head (2h + 2h_kv)
    elements; key/value heads that P does not divide are repeated first, to P heads (one per rank)."""
    case = full_case(CASES[index][1])
    h = case["n_heads"]
    h_kv = case["n_kv_heads"] if case["module"] == "gqa" else h
    moved_kv = h_kv if h_kv % world_size == 0 else world_size  # repeated to one per rank when P > h_kv
    formula = mnp.payload_per_layer("ulysses", world_size=world_size, batch=case["batch"], seq_len=case["seq_len"],
                                    d_model=case["d_model"], n_heads=h, n_kv_heads=moved_kv,
                                    d_head=case["d_model"] // h)
    for result in results[world_size][index]:
        payload = result["traffic"]["payload"]
        assert set(payload) == {"all_to_all/forward", "all_to_all/backward"}
        for direction in ("forward", "backward"):
            assert payload[f"all_to_all/{direction}"]["calls"] == 4
            assert payload[f"all_to_all/{direction}"]["elements"] == formula[direction]["all_to_all"]
