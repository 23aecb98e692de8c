"""mha.numpy's heads across devices, the ranks simulated as a list (chapter 15): each scheme equals one
process's attention to 1e-12 in float64, masks included; the shards, the collectives and the chunks are
what the conventions say, by hand; the ring computes 4r + 3, 2P + 1 or 4P chunk pairs per rank; the merge
survives -inf and lse of 1e4 without NaN or a warning; and the payload and bytes equal what a simulation
of the collectives counts."""

import math
import warnings

import numpy as np
import pytest

import mha.numpy as mnp
from mha.numpy import sharding

TOL = 1e-12


@pytest.fixture(autouse=True)
def no_warnings():
    """Any NumPy warning (overflow, invalid value, divide by zero) fails the test."""
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        yield


def rng(seed=0):
    return np.random.default_rng(seed)


def attention_weights(r, d, h, d_head, d_out=None):
    """W_q, W_k, W_v (d, h * d_head), W_o (h * d_head, d_out), and their biases."""
    d_out = d_out or d
    W = [r.standard_normal((d, h * d_head)) / math.sqrt(d) for _ in range(3)]
    W.append(r.standard_normal((h * d_head, d_out)) / math.sqrt(h * d_head))
    b = [r.standard_normal(h * d_head) for _ in range(3)] + [r.standard_normal(d_out)]
    return W, b


def masks(r, B, h, T):
    """None, causal, padding (B, 1, 1, T) with an empty sequence, and a per-head mask with an empty row."""
    padding = np.arange(T) < np.array([T - 2, 0])[:B, None]  # (B, T): the second sequence all padding
    per_head = r.random((B, h, T, T)) < 0.6
    per_head[0, 1, 2] = False
    return {"none": None, "causal": mnp.causal_mask(T), "padding": padding[:, None, None, :], "per head": per_head}


# shard_by_heads -----------------------------------------------------------------------------------------------


def test_shards_hold_the_columns_of_their_heads_by_hand():
    """h = 4 heads of 3 columns over P = 2: rank 0 holds columns 0..5 (heads 0, 1), rank 1 columns 6..11."""
    W = np.arange(24.0).reshape(2, 12)
    shards = mnp.shard_by_heads(W, 4, 2)
    assert len(shards) == 2
    np.testing.assert_array_equal(shards[0], W[:, 0:6])
    np.testing.assert_array_equal(shards[1], W[:, 6:12])
    rows = mnp.shard_by_heads(W.T, 4, 2, axis=0)  # W_O: (h * d_head, d_out), by rows
    np.testing.assert_array_equal(rows[1], W.T[6:12])
    bias = mnp.shard_by_heads(np.arange(12.0), 6, 3)  # 6 heads of 2 over 3 ranks: 4 entries each
    assert [list(b) for b in bias] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("P", [1, 2, 4, 8])
def test_shards_put_together_give_w_back_and_head_i_lives_on_rank_i_over_heads_per_rank(P):
    r = rng(P)
    h, d_head = 2 * P, 3
    W = r.standard_normal((5, h * d_head)).astype(np.float32)
    shards = mnp.shard_by_heads(W, h, P)
    np.testing.assert_array_equal(np.concatenate(shards, axis=-1), W)
    heads = mnp.split_heads(W, h)  # (h, 5, d_head): head i's columns, as chapter 5 splits them
    for i in range(h):
        rank, j = divmod(i, h // P)
        np.testing.assert_array_equal(shards[rank][:, j * d_head:(j + 1) * d_head], heads[i])
    assert all(s.dtype == np.float32 for s in shards)


def test_a_shard_is_a_copy_and_w_is_left_alone():
    W = np.ones((3, 8))
    shards = mnp.shard_by_heads(W, 4, 2)
    shards[0][:] = 7.0
    assert (W == 1.0).all() and not np.shares_memory(shards[1], W)


@pytest.mark.parametrize("args,kwargs,error,words", [
    ((np.ones((4, 12)), 6, 4), {}, ValueError, "n_heads=6 is not divisible by world_size=4"),
    ((np.ones((4, 10)), 4, 2), {}, ValueError, "W.shape[1]=10 is not divisible by n_heads=4"),
    ((np.ones((10, 4)), 4, 2), {"axis": 0}, ValueError, "W.shape[0]=10 is not divisible by n_heads=4"),
    ((np.ones((4, 12)), 4, 2), {"axis": 2}, ValueError, "axis=2 does not exist in W of 2 dimension(s)"),
    ((np.ones((4, 12)), 4, 2), {"axis": 1.0}, TypeError, "axis must be an integer, got float"),
    ((np.ones((4, 12)), 4, 0), {}, ValueError, "world_size must be at least 1, got world_size=0"),
    ((np.ones((4, 12)), 4, True), {}, TypeError, "world_size must be an integer, got bool"),
    ((np.float64(3.0), 1, 1), {}, ValueError, "W must have at least 1 dimensions, got 0"),
    ((np.array(["a", "b"]), 1, 1), {}, TypeError, "W must be an array of numbers"),
])
def test_shard_by_heads_refuses_what_no_rank_could_hold(args, kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        mnp.shard_by_heads(*args, **kwargs)


# tensor parallelism --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "per head"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
def test_tensor_parallel_attention_equals_one_process(P, mask_name, with_bias):
    r = rng(P)
    B, T, d, h, d_head = 2, 5, 6, 4, 3
    X = r.standard_normal((B, T, d))
    W, b = attention_weights(r, d, h, d_head, d_out=7)
    b = b if with_bias else [None] * 4
    mask = masks(r, B, h, T)[mask_name]
    expected, _ = mnp.multihead_attention(X, *W, h, mask=mask, b_q=b[0], b_k=b[1], b_v=b[2], b_o=b[3])
    out, partials = mnp.tensor_parallel_attention(X, *W, *b, n_heads=h, world_size=P, mask=mask)
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL)
    assert len(partials) == P and all(p.shape == (B, T, 7) for p in partials)
    np.testing.assert_allclose(sum(partials) + (0 if b[3] is None else b[3]), out, rtol=0, atol=TOL)


def test_each_partial_is_its_heads_through_its_rows_of_w_o_and_the_bias_is_added_once():
    r = rng(1)
    X = r.standard_normal((3, 4))
    W, b = attention_weights(r, 4, 4, 2)
    out, partials = mnp.tensor_parallel_attention(X, *W, *b, n_heads=4, world_size=2)
    Q, K, V = (mnp.split_heads(X @ w + bias, 4) for w, bias in zip(W[:3], b[:3]))  # (h, T, d_head)
    heads, _ = mnp.scaled_dot_product_attention(Q, K, V)  # (h, T, d_head)
    for rank in range(2):
        mine = mnp.merge_heads(heads[2 * rank:2 * rank + 2])  # (T, 2 * d_head): this rank's heads
        np.testing.assert_allclose(partials[rank], mine @ W[3][4 * rank:4 * rank + 4], rtol=0, atol=TOL)
    assert not np.allclose(partials[0], partials[1])
    np.testing.assert_allclose(out - partials[0] - partials[1], np.broadcast_to(b[3], out.shape), atol=TOL)


def test_tensor_parallel_attention_keeps_float32_and_refuses_a_split_of_heads():
    r = rng(2)
    X = r.standard_normal((2, 3, 4)).astype(np.float32)
    W = [w.astype(np.float32) for w in attention_weights(r, 4, 2, 2)[0]]
    out, partials = mnp.tensor_parallel_attention(X, *W, n_heads=2, world_size=2)
    assert out.dtype == np.float32 and all(p.dtype == np.float32 for p in partials)
    with pytest.raises(ValueError, match="n_heads=2 is not divisible by world_size=4"):
        mnp.tensor_parallel_attention(X, *W, n_heads=2, world_size=4)
    with pytest.raises(ValueError, match="the width of W_k=4 is not divisible by n_heads=3"):
        mnp.tensor_parallel_attention(X, W[0][:, :3], *W[1:], n_heads=3, world_size=1)
    with pytest.raises(ValueError, match=r"b_o must have shape \(4,\), got shape \(3,\)"):
        mnp.tensor_parallel_attention(X, *W, b_o=np.ones(3), n_heads=2, world_size=2)


# the collectives -----------------------------------------------------------------------------------------------


def test_all_reduce_gives_every_rank_the_sum_in_its_own_copy():
    parts = [np.full((2, 3), float(r + 1)) for r in range(4)]
    totals = mnp.all_reduce(parts)
    assert len(totals) == 4 and all((t == 10.0).all() for t in totals)
    totals[0][0, 0] = -1.0
    assert totals[1][0, 0] == 10.0 and parts[0][0, 0] == 1.0
    with pytest.raises(ValueError, match=r"the ranks' shapes must match: partials\[0\].shape=\(2, 3\) but "):
        mnp.all_reduce([np.ones((2, 3)), np.ones((3, 2))])
    with pytest.raises(TypeError, match="partials must be a non-empty list"):
        mnp.all_reduce([])


def test_all_to_all_transposes_the_list_of_lists_and_twice_is_nothing():
    chunks = [[f"{r}->{s}" for s in range(3)] for r in range(3)]
    received = mnp.all_to_all(chunks)
    assert received[2] == ["0->2", "1->2", "2->2"]  # rank 2 receives what every rank sent to it
    assert mnp.all_to_all(received) == chunks
    with pytest.raises(ValueError, match=r"P = 2 lists of 2 pieces each .* lengths \[2, 1\]"):
        mnp.all_to_all([[1, 2], [3]])
    with pytest.raises(TypeError, match="chunks must be a non-empty list of lists"):
        mnp.all_to_all(np.ones((2, 2)))


# Ulysses -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "per head"])
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_attention_equals_one_process(P, mask_name, causal):
    r = rng(P)
    B, h, T, d_head = 2, 4, 8, 3
    Q, K, V = (r.standard_normal((B, h, T, d_head)) for _ in range(3))
    mask = masks(r, B, h, T)[mask_name]
    full = mask if not causal else (mnp.causal_mask(T) if mask is None else mask & mnp.causal_mask(T))
    expected, _ = mnp.scaled_dot_product_attention(Q, K, V, full)
    out = mnp.ulysses_attention(Q, K, V, world_size=P, mask=mask, causal=causal)
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL)


def test_ulysses_hands_q_k_v_and_out_to_two_all_to_alls(monkeypatch):
    """What rank 0 hands to the all-to-alls: its (B, h, T/P, d_head) of q, k and v, then (B, h/P, T, d_head)
    of out, 4 * B * h * (T/P) * d_head elements: payload_per_layer's B (T/P) d_head (2h + 2h_kv) with h_kv = h."""
    handed = []

    def counting(chunks):
        handed.append(sum(np.size(piece) for piece in chunks[0]))  # rank 0's pieces
        return mnp.all_to_all(chunks)
    monkeypatch.setattr(sharding, "all_to_all", counting)
    B, h, T, d_head, P = 2, 4, 8, 3, 2
    Q = rng().standard_normal((B, h, T, d_head)).astype(np.float32)
    out = sharding.ulysses_attention(Q, Q, Q, world_size=P)
    assert out.dtype == np.float32 and len(handed) == 4
    payload = mnp.payload_per_layer("ulysses", world_size=P, batch=B, seq_len=T, d_model=h * d_head, n_heads=h,
                                    n_kv_heads=h, d_head=d_head)
    assert sum(handed) == payload["forward"]["all_to_all"] == 4 * B * h * (T // P) * d_head


def test_ulysses_refuses_what_it_cannot_split():
    Q = np.ones((1, 4, 6, 2))
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by world_size=3"):
        mnp.ulysses_attention(Q, Q, Q, world_size=3)
    with pytest.raises(ValueError, match="T=6 is not divisible by world_size=4"):
        mnp.ulysses_attention(Q, Q, Q, world_size=4)
    with pytest.raises(ValueError, match="the shapes .* of queries and keys must match"):
        mnp.ulysses_attention(Q, Q[:, :2], Q, world_size=2)
    with pytest.raises(TypeError, match="causal must be True or False, got ndarray"):
        mnp.ulysses_attention(Q, Q, Q, world_size=2, causal=mnp.causal_mask(6))


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


# bytes and payload ----------------------------------------------------------------------------------------------


def ring_all_reduce(vectors):
    """A ring all-reduce of P vectors of n elements (P dividing n), step by step: a reduce-scatter, then an
    all-gather, each P - 1 steps in which rank r sends one n/P piece to rank r + 1. Returns (the vectors every
    rank ends with, the elements each rank sent)."""
    P = len(vectors)
    pieces = [np.split(v.astype(float), P) for v in vectors]  # pieces[r][i]: rank r's copy of piece i
    sent = [0] * P
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(P - 1):
            moves = []
            for r in range(P):  # rank r sends piece (r - step) (reduce) or (r + 1 - step) (gather) to r + 1
                i = (r - step) % P if phase == "reduce-scatter" else (r + 1 - step) % P
                moves.append((r, i, pieces[r][i].copy()))
                sent[r] += pieces[r][i].size
            for r, i, piece in moves:
                nxt = (r + 1) % P
                pieces[nxt][i] = pieces[nxt][i] + piece if phase == "reduce-scatter" else piece
    return [np.concatenate(p) for p in pieces], sent


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_all_reduce_bytes_is_what_a_ring_all_reduce_sends(P):
    n = 24
    vectors = [rng(P).standard_normal(n) for _ in range(P)]
    totals, sent = ring_all_reduce(vectors)
    for total in totals:
        np.testing.assert_allclose(total, sum(vectors), rtol=0, atol=1e-12)
    for elements in sent:
        assert elements * 2 == mnp.all_reduce_bytes(n, P, 2) == pytest.approx(2 * (P - 1) / P * n * 2, rel=1e-15)


def test_all_reduce_bytes_by_hand_and_its_refusals():
    assert mnp.all_reduce_bytes(1000, 4) == 6000.0  # 2 * 3/4 * 1000 * 4 bytes
    assert mnp.all_reduce_bytes(1000, 3, 4) == pytest.approx(16000 / 3, rel=1e-15)
    assert mnp.all_reduce_bytes(5000, 1) == 0.0
    assert mnp.all_reduce_bytes(np.int64(10), np.int64(2), np.int64(2)) == 20.0
    with pytest.raises(ValueError, match="n_elements must be at least 0, got n_elements=-1"):
        mnp.all_reduce_bytes(-1, 2)
    with pytest.raises(TypeError, match="world_size must be an integer, got float 2.0"):
        mnp.all_reduce_bytes(10, 2.0)


SIZES = dict(batch=2, seq_len=16, d_model=32, n_heads=8, n_kv_heads=2, d_head=4)


def test_payload_per_layer_by_hand():
    """P = 4: tensor 2*16*32 = 1024 each way; Ulysses 2*4*4*(16 + 4) = 640 each way; ring: a block of k and v
    is 2*2*2*4*4 = 128 elements, 3 sends forward, 3 + 4 backward."""
    assert mnp.payload_per_layer("tensor", world_size=4, **SIZES) == {"forward": {"all_reduce": 1024},
                                                                      "backward": {"all_reduce": 1024}}
    assert mnp.payload_per_layer("ulysses", world_size=4, **SIZES) == {"forward": {"all_to_all": 640},
                                                                       "backward": {"all_to_all": 640}}
    assert mnp.payload_per_layer("ring", world_size=4, **SIZES) == {"forward": {"send": 384},
                                                                    "backward": {"send": 896}}
    in_bytes = mnp.payload_per_layer("ring", world_size=4, bytes_per_element=2, **SIZES)
    assert in_bytes == {"forward": {"send": 768}, "backward": {"send": 1792}}


def test_wire_bytes_applies_each_collective_s_share():
    payload = {"forward": {"all_reduce": 1000, "all_to_all": 1000, "send": 1000}, "backward": {"send": 10}}
    wire = mnp.wire_bytes(payload, 4, bytes_per_element=2)
    assert wire == {"forward": {"all_reduce": 3000.0, "all_to_all": 1500.0, "send": 2000.0},
                    "backward": {"send": 20.0}}
    assert wire["forward"]["all_reduce"] == mnp.all_reduce_bytes(1000, 4, 2)
    assert mnp.wire_bytes(payload, 1)["forward"] == {"all_reduce": 0.0, "all_to_all": 0.0, "send": 4000.0}
    with pytest.raises(ValueError, match=r"unknown collective\(s\) \['broadcast'\]"):
        mnp.wire_bytes({"forward": {"broadcast": 1}}, 2)
    with pytest.raises(TypeError, match="payload must be a dict"):
        mnp.wire_bytes([1, 2], 2)


@pytest.mark.parametrize("scheme,P,changes,words", [
    ("pipeline", 2, {}, "scheme must be one of"),
    ("tensor", 3, {}, "n_heads=8 is not divisible by world_size=3"),
    ("ulysses", 16, {}, "n_heads=8 is not divisible by world_size=16"),
    ("tensor", 4, {"n_kv_heads": 3, "n_heads": 12}, "n_kv_heads=3 and world_size=4"),
    ("ulysses", 8, {"seq_len": 12}, "seq_len=12 is not divisible by world_size=8"),
    ("ring", 3, {}, "seq_len=16 is not divisible by 2 \\* world_size = 6"),
    ("ring", 2, {"n_kv_heads": 3}, "n_heads=8 is not divisible by n_kv_heads=3"),
])
def test_payload_per_layer_refuses_a_scheme_that_cannot_use_p_ranks(scheme, P, changes, words):
    with pytest.raises(ValueError, match=words):
        mnp.payload_per_layer(scheme, world_size=P, **{**SIZES, **changes})


def test_kv_heads_fewer_than_the_ranks_are_replicated_not_refused():
    """h_kv = 2 key/value heads over P = 4 ranks: each is replicated on 2 ranks (tensor parallelism)."""
    assert mnp.payload_per_layer("tensor", world_size=4, **SIZES)["forward"]["all_reduce"] == 2 * 16 * 32
