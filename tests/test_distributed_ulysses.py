"""Sequence parallelism by all-to-all (Ulysses) equals one process; its payload is the formula.

One launch per world size (P = 2 and 4, gloo on the CPU) runs every case of every scheme
(tests/distributed_cases.py).
"""

import pytest

import mha.numpy as mnp
import distributed_cases
from distributed_cases import WORLD_SIZES, assert_equal_to_one_process
from mha.distributed.equivalence import full_case

CASES = distributed_cases.CASES["ulysses"]  # (name, case); the cases of every scheme share two launches


@pytest.fixture(scope="module")
def results():
    """{P: [per case: [per rank: result]]}: from one launch per world size, shared by every scheme's tests."""
    return distributed_cases.scheme_results("ulysses")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_equal_to_one_process(results, world_size, index):
    assert_equal_to_one_process(results[world_size][index], CASES[index][1])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_payload_is_the_formula(results, world_size, index):
    """Four all-to-alls forward (q, k, v, out) and four backward, each rank handing B (T/P) d_head (2h + 2h_kv)
    elements; key/value heads that P does not divide are repeated first, to P heads (one per rank), and the
    formula, given the model's own h_kv, counts them so (h_kv = 2 and 1 at P = 4: 2P, not 2h_kv)."""
    case = full_case(CASES[index][1])
    h = case["n_heads"]
    h_kv = case["n_kv_heads"] if case["module"] == "gqa" else h
    formula = mnp.payload_per_layer("ulysses", world_size=world_size, batch=case["batch"], seq_len=case["seq_len"],
                                    d_model=case["d_model"], n_heads=h, n_kv_heads=h_kv,
                                    d_head=case["d_model"] // h)
    moved_kv = h_kv if h_kv % world_size == 0 else world_size  # repeated to one per rank when P > h_kv
    d_head = case["d_model"] // h
    per_rank = case["batch"] * case["seq_len"] // world_size * d_head  # B (T/P) d_head
    assert formula["forward"]["all_to_all"] == per_rank * (2 * h + 2 * moved_kv)
    for result in results[world_size][index]:
        payload = result["traffic"]["payload"]
        assert set(payload) == {"all_to_all/forward", "all_to_all/backward"}
        for direction in ("forward", "backward"):
            assert payload[f"all_to_all/{direction}"]["calls"] == 4
            assert payload[f"all_to_all/{direction}"]["elements"] == formula[direction]["all_to_all"]
