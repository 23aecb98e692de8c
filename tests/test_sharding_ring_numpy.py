"""mha.numpy's ring attention, the ranks simulated as a list (chapter 15): the chunks of each layout, the
partial attention and its log-sum-exp, the merge (any grouping; it survives -inf and lse of 1e4 without NaN
or a warning); the ring equals one process's attention to 1e-12 in float64, computes 4r + 3, 2P + 1 or 4P
chunk pairs per rank, and passes each block on P - 1 times."""

import math

import numpy as np
import pytest

from sharding_cases import TOL, rng, warnings_as_errors

import mha.numpy as mnp
from mha.numpy import sharding


@pytest.fixture(autouse=True)
def no_warnings():
    """Any NumPy warning (overflow, invalid value, divide by zero) fails the test."""
    with warnings_as_errors():
        yield


# ring attention: chunks, partial attention, the merge, the ring ---------------------------------------------------


def test_sequence_chunks_by_hand():
    """T = 8 over P = 2: 4 chunks of 2 positions."""
    contiguous = mnp.sequence_chunks(8, 2, "contiguous")
    zigzag = mnp.sequence_chunks(8, 2, "zigzag")
    assert [list(c) for c in contiguous] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(c) for c in zigzag] == [[0, 1, 6, 7], [2, 3, 4, 5]]


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_sequence_chunks_hold_every_position_once(P, layout):
    chunks = mnp.sequence_chunks(6 * P, P, layout)
    assert all(len(c) == 6 for c in chunks)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(6 * P))


def test_sequence_chunks_refuse_a_length_the_ring_cannot_cut_and_an_unknown_layout():
    with pytest.raises(ValueError, match="T=12 is not divisible by 2 \\* world_size = 8"):
        mnp.sequence_chunks(12, 4, "zigzag")
    with pytest.raises(ValueError, match="layout must be 'contiguous' or 'zigzag', got 'striped'"):
        mnp.sequence_chunks(8, 2, "striped")


def test_attention_partial_is_attention_with_the_log_of_its_sum():
    r = rng(3)
    Q, K, V = r.standard_normal((2, 3, 4)), r.standard_normal((2, 5, 4)), r.standard_normal((2, 5, 6))
    mask = r.random((2, 3, 5)) < 0.6
    mask[1, 2] = False  # a query with no allowed key
    out, lse = mnp.attention_partial(Q, K, V, mask)
    np.testing.assert_allclose(out, mnp.scaled_dot_product_attention(Q, K, V, mask)[0], rtol=0, atol=TOL)
    scores = Q @ K.transpose(0, 2, 1) / 2.0  # sqrt(4)
    by_hand = [[math.log(sum(math.exp(s) for s, m in zip(row, keep) if m)) if keep.any() else -math.inf
                for row, keep in zip(scores[b], mask[b])] for b in range(2)]
    np.testing.assert_allclose(lse, by_hand, rtol=0, atol=TOL)
    assert lse[1, 2] == -np.inf and (out[1, 2] == 0).all()


def test_merging_the_blocks_of_keys_gives_attention_over_all_of_them_in_any_grouping():
    r = rng(4)
    Q, K, V = r.standard_normal((2, 4, 3)), r.standard_normal((2, 9, 3)), r.standard_normal((2, 9, 5))
    blocks = [mnp.attention_partial(Q, K[:, s], V[:, s]) for s in (slice(0, 2), slice(2, 6), slice(6, 9))]
    whole_out, whole_lse = mnp.attention_partial(Q, K, V)
    left = mnp.merge_partials(*mnp.merge_partials(*blocks[0], *blocks[1]), *blocks[2])
    right = mnp.merge_partials(*blocks[0], *mnp.merge_partials(*blocks[1], *blocks[2]))
    swapped = mnp.merge_partials(*blocks[2], *mnp.merge_partials(*blocks[1], *blocks[0]))
    for out, lse in (left, right, swapped):
        np.testing.assert_allclose(out, whole_out, rtol=0, atol=TOL)
        np.testing.assert_allclose(lse, whole_lse, rtol=0, atol=TOL)


def test_merge_partials_with_minus_inf_on_either_side_or_both():
    r = rng(5)
    out_a, out_b = r.standard_normal((2, 3, 4)), r.standard_normal((2, 3, 4))
    lse_a, lse_b = r.standard_normal((2, 3)), r.standard_normal((2, 3))
    lse_a[0, 1] = lse_b[1, 0] = -np.inf
    out_a[0, 1] = out_b[1, 0] = 0.0
    lse_a[1, 2] = lse_b[1, 2] = -np.inf
    out_a[1, 2] = out_b[1, 2] = 0.0
    out, lse = mnp.merge_partials(out_a, lse_a, out_b, lse_b)
    np.testing.assert_array_equal(out[0, 1], out_b[0, 1])  # exp(lse_b - lse_b) = 1 exactly
    np.testing.assert_array_equal(out[1, 0], out_a[1, 0])
    assert lse[0, 1] == lse_b[0, 1] and lse[1, 0] == lse_a[1, 0]
    assert (out[1, 2] == 0).all() and lse[1, 2] == -np.inf
    assert np.isfinite(out).all()


@pytest.mark.parametrize("shift", [1e4, -1e4])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_merge_partials_takes_no_exp_of_an_lse(shift, dtype):
    """The merge depends on lse_a - lse_b only: shifting both by 1e4 (exp overflows) or -1e4 (exp underflows)
    changes out and lse - shift only by the rounding of the shifted lse (a few units of |shift| * eps)."""
    r = rng(6)
    out_a, out_b = (r.standard_normal((3, 2)).astype(dtype) for _ in range(2))
    lse_a, lse_b = (r.standard_normal(3).astype(dtype) for _ in range(2))
    out, lse = mnp.merge_partials(out_a, lse_a, out_b, lse_b)
    out_far, lse_far = mnp.merge_partials(out_a, lse_a + dtype(shift), out_b, lse_b + dtype(shift))
    assert out_far.dtype == dtype and lse_far.dtype == dtype
    rounding = 8 * abs(shift) * np.finfo(dtype).eps
    np.testing.assert_allclose(out_far, out, rtol=0, atol=rounding * np.abs(out_a - out_b).max())
    np.testing.assert_allclose(lse_far - dtype(shift), lse, rtol=0, atol=rounding)


def test_merge_partials_refuses_parts_that_do_not_fit():
    with pytest.raises(ValueError, match=r"the two parts' shapes must match: out_a.shape=\(2, 3\) but "):
        mnp.merge_partials(np.ones((2, 3)), np.ones(2), np.ones((2, 4)), np.ones(2))
    with pytest.raises(ValueError, match=r"the rows of out \(\.\.\., T, d_v\) and of lse \(\.\.\., T\) must match"):
        mnp.merge_partials(np.ones((2, 3)), np.ones(3), np.ones((2, 3)), np.ones(2))


def ring_case(seed, B=2, h=2, T=16, d_head=3):
    r = rng(seed)
    Q, K, V = (r.standard_normal((B, h, T, d_head)) for _ in range(3))
    keep = np.arange(T) < r.integers(1, T, size=B)[:, None]  # (B, T)
    keep[-1] = False  # a sequence of padding only: every query attends to nothing
    return Q, K, V, keep


@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_ring_attention_equals_one_process(P, layout, causal, padded):
    Q, K, V, keep = ring_case(P)
    mask = keep[:, None, None, :] if padded else None
    if causal:
        mask = mnp.causal_mask(16) if mask is None else mask & mnp.causal_mask(16)
    expected, _ = mnp.scaled_dot_product_attention(Q, K, V, mask)
    out, _ = mnp.ring_attention(Q, K, V, world_size=P, layout=layout, causal=causal,
                                key_padding_mask=keep if padded else None)
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("P", range(1, 9))
def test_the_ring_computes_4r_plus_3_2p_plus_1_or_4p_chunk_pairs(P):
    """Causal, contiguous: rank r's chunks 2r and 2r + 1 see 2r + 1 and 2r + 2 key chunks, 4r + 3 pairs (the
    last rank works 4P - 1, rank 0 only 3). Zigzag: chunks r and 2P - 1 - r see r + 1 and 2P - r, 2P + 1 on
    every rank. Not causal: 2 x 2P pairs everywhere. Every layout computes the P(2P + 1) pairs at or below
    the diagonal."""
    Q = rng(P).standard_normal((1, 1, 2 * P, 2))
    counts = {(layout, causal): mnp.ring_attention(Q, Q, Q, world_size=P, layout=layout, causal=causal)[1]
              for layout in ("contiguous", "zigzag") for causal in (False, True)}
    assert counts["contiguous", True] == [4 * r + 3 for r in range(P)]
    assert counts["zigzag", True] == [2 * P + 1] * P
    assert counts["contiguous", False] == counts["zigzag", False] == [4 * P] * P
    assert sum(counts["contiguous", True]) == sum(counts["zigzag", True]) == P * (2 * P + 1)


def test_the_ring_passes_each_block_on_p_minus_1_times(monkeypatch):
    """The keys and values one rank hands on: P - 1 sends of its k and v, (P - 1) 2 B h (T/P) d_head elements,
    as payload_per_layer says (forward)."""
    sent, pass_along = [], sharding.pass_along

    def counting(held):
        keys, values, _, _ = held[0]  # what rank 0 hands to rank 1
        sent.append(keys.size + values.size)
        return pass_along(held)
    monkeypatch.setattr(sharding, "pass_along", counting)
    Q, K, V, _ = ring_case(0)
    P = 4
    sharding.ring_attention(Q, K, V, world_size=P)
    payload = mnp.payload_per_layer("ring", world_size=P, batch=2, seq_len=16, d_model=6, n_heads=2, n_kv_heads=2,
                                    d_head=3)
    assert len(sent) == P - 1 and sum(sent) == payload["forward"]["send"] == (P - 1) * 2 * 2 * 2 * (16 // P) * 3


def test_ring_attention_keeps_float32_and_refuses_what_it_cannot_use():
    Q, K, V, keep = ring_case(7)
    out, _ = mnp.ring_attention(*(a.astype(np.float32) for a in (Q, K, V)), world_size=2, causal=True)
    assert out.dtype == np.float32
    with pytest.raises(ValueError, match="T=16 is not divisible by 2 \\* world_size = 6"):
        mnp.ring_attention(Q, K, V, world_size=3)
    with pytest.raises(ValueError, match="the key padding mask's shape and the keys' \\(B, T\\) must match"):
        mnp.ring_attention(Q, K, V, world_size=2, key_padding_mask=keep[:, :8])
    with pytest.raises(TypeError, match="key_padding_mask must be boolean"):
        mnp.ring_attention(Q, K, V, world_size=2, key_padding_mask=keep.astype(int))
    with pytest.raises(ValueError, match="Q must have 4 dimensions, got 3"):
        mnp.ring_attention(Q[0], K[0], V[0], world_size=2)
