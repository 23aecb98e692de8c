"""Ring attention equals one process, for both splits of the sequence; its payload and its work.

One launch per world size (P = 2 and 4, gloo on the CPU) runs every case of every scheme
(tests/distributed_cases.py). Work is counted, not timed: the (query chunk, key chunk) pairs each
rank computes.
"""

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt
from mha.distributed import merge_partials, positions_of, ring_attention
import distributed_cases
from distributed_cases import WORLD_SIZES, assert_equal_to_one_process
from mha.distributed.equivalence import full_case
from mha.distributed.sequence import check_module

CASES = distributed_cases.CASES["ring"]  # (name, case); the cases of every scheme share two launches


@pytest.fixture(scope="module")
def results():
    """{P: [per case: [per rank: result]]}: from one launch per world size, shared by every scheme's tests."""
    return distributed_cases.scheme_results("ring")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_equal_to_one_process(results, world_size, index):
    assert_equal_to_one_process(results[world_size][index], CASES[index][1])


def chunk_pairs(rank, world_size, layout, causal):
    if not causal:
        return 4 * world_size
    return 4 * rank + 3 if layout == "contiguous" else 2 * world_size + 1


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_work_per_rank(results, world_size, index):
    """Chunk pairs computed: 4r + 3 contiguous and 2P + 1 zigzag under a causal mask, 4P without; the same
    pairs again in the backward; multiply-adds 2 B h c^2 d_head per pair (c = T / 2P)."""
    case = full_case(CASES[index][1])
    c, d_head = case["seq_len"] // (2 * world_size), case["d_model"] // case["n_heads"]
    for rank, result in enumerate(results[world_size][index]):
        work = result["traffic"]["work"]
        pairs = chunk_pairs(rank, world_size, case["layout"], case["causal"])
        assert work["chunk_pairs/forward"] == work["chunk_pairs/backward"] == pairs
        assert work["multiply_adds/forward"] == pairs * 2 * case["batch"] * case["n_heads"] * c * c * d_head


def test_zigzag_balances_and_contiguous_does_not(results):
    """The busiest rank's share of the causal work: (4P - 1) / (2P + 1) times the average with the
    contiguous split, exactly the average with the zigzag one."""
    for world_size in WORLD_SIZES:
        zigzag = [r["traffic"]["work"]["chunk_pairs/forward"] for r in results[world_size][0]]
        contiguous = [r["traffic"]["work"]["chunk_pairs/forward"] for r in results[world_size][1]]
        assert len(set(zigzag)) == 1
        assert sum(zigzag) == sum(contiguous)  # the same pairs in all, spread differently
        assert max(contiguous) * world_size / sum(contiguous) == pytest.approx((4 * world_size - 1) / (2 * world_size + 1))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_payload_is_the_formula(results, world_size, index):
    """(P - 1) sends of k and v forward; backward, (P - 1) sends of k, v, dk, dv and one of dk, dv home."""
    case = full_case(CASES[index][1])
    n_kv_heads = case["n_kv_heads"] if case["module"] == "gqa" else case["n_heads"]
    formula = mnp.payload_per_layer("ring", world_size=world_size, batch=case["batch"], seq_len=case["seq_len"],
                                    d_model=case["d_model"], n_heads=case["n_heads"], n_kv_heads=n_kv_heads,
                                    d_head=case["d_model"] // case["n_heads"])
    n = case["batch"] * n_kv_heads * case["seq_len"] // world_size * case["d_model"] // case["n_heads"]
    for result in results[world_size][index]:
        payload = result["traffic"]["payload"]
        assert set(payload) == {"send/forward", "send/backward"}
        assert payload["send/forward"]["elements"] == formula["forward"]["send"] == (world_size - 1) * 2 * n
        assert payload["send/backward"]["elements"] == formula["backward"]["send"] == (world_size - 1) * 4 * n + 2 * n
        assert payload["send/forward"]["calls"] == world_size - 1


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_layouts_hold_every_position_once(layout, world_size):
    T = 2 * world_size * 3
    held = [positions_of(rank, world_size, T, layout).tolist() for rank in range(world_size)]
    assert sorted(sum(held, [])) == list(range(T))
    assert all(len(h) == T // world_size for h in held)
    if layout == "zigzag":  # rank r: chunks r and 2P - 1 - r
        assert all(h[0] == rank * 3 and h[-1] == T - 1 - rank * 3 for rank, h in enumerate(held))


def test_layout_refusals():
    with pytest.raises(ValueError, match="divisible by 2 \\* world_size"):
        positions_of(0, 4, 12, "zigzag")
    with pytest.raises(ValueError, match='"contiguous" or "zigzag"'):
        positions_of(0, 2, 8, "striped")


def test_ring_needs_a_process_group():
    q = torch.zeros(1, 2, 4, 3)
    with pytest.raises(RuntimeError, match="process group"):
        ring_attention(q, q, q)


@pytest.mark.parametrize("seed", range(5))
def test_merge_equals_numpy_and_the_whole(seed):
    """The torch merge equals mha.numpy's, and two halves of the keys merged equal attention on all keys,
    with -inf rows (no allowed key on one side, or on both) and lse near 1e4."""
    r = np.random.default_rng(seed)
    Q, K, V = (r.standard_normal((2, 5, 4)) for _ in range(3))
    mask = r.random((2, 5, 5)) < 0.6
    mask[0, 0] = False  # a row with no key at all
    mask[1, 1, :3] = False  # a row with no key in the first half
    out_a, lse_a = mnp.attention_partial(Q, K[:, :3], V[:, :3], mask[:, :, :3])
    out_b, lse_b = mnp.attention_partial(Q, K[:, 3:], V[:, 3:], mask[:, :, 3:])
    theirs, theirs_lse = mnp.merge_partials(out_a, lse_a, out_b, lse_b)
    ours, ours_lse = merge_partials(*(torch.from_numpy(a) for a in (out_a, lse_a, out_b, lse_b)))
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.isinf(ours_lse.numpy()), np.isinf(theirs_lse))
    whole, _ = mnp.scaled_dot_product_attention(Q, K, V, mask)
    np.testing.assert_allclose(ours.numpy(), whole, rtol=1e-12, atol=1e-14)
    assert not np.isnan(ours.numpy()).any()
    big, big_lse = merge_partials(*(torch.from_numpy(a) for a in (out_a, lse_a + 1e4, out_b, lse_b + 1e4)))
    np.testing.assert_allclose(big.numpy(), whole, rtol=1e-9, atol=1e-11)  # lse + 1e4 keeps 12 digits of a difference


def test_what_the_sequence_schemes_refuse():
    """Ring attention and Ulysses compute softmax attention with causal and padding masks: a sliding
    window, soft-capping and dynamic NTK (which needs the whole length) are refused by name."""
    with pytest.raises(ValueError, match="sliding_window and logit_cap are not computed"):
        check_module(mt.GroupedQueryAttention(8, 2, 2, sliding_window=4), "ring attention")
    with pytest.raises(ValueError, match="sliding_window and logit_cap are not computed"):
        check_module(mt.GroupedQueryAttention(8, 2, 2, logit_cap=30.0), "Ulysses")
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}
    with pytest.raises(ValueError, match="dynamic NTK"):
        check_module(mt.GroupedQueryAttention(8, 2, 2, rope_base=10000.0, rope_scaling=dynamic), "Ulysses")
    with pytest.raises(TypeError, match="MultiHeadAttention or GroupedQueryAttention"):
        check_module(torch.nn.MultiheadAttention(8, 2), "ring attention")
