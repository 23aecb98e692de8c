"""mha.numpy's heads across devices, the ranks simulated as a list (chapter 15): tensor parallelism and Ulysses
each equal one process's attention to 1e-12 in float64, masks included; the shards and the collectives are
what the conventions say, by hand. The ring: tests/test_sharding_ring_numpy.py; the payload and the bytes:
tests/test_sharding_bytes_numpy.py."""

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
