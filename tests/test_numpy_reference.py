"""mha.numpy against numbers worked out by hand, and against PyTorch's own ops."""

import math

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import assert_close


def test_softmax_known_values():
    assert_close(mn.softmax(np.array([0.0, math.log(2.0)])), [1 / 3, 2 / 3])
    assert_close(mn.softmax(np.zeros(4)), np.full(4, 0.25))


def test_softmax_large_logits_do_not_overflow():
    x = np.array([1000.0, 1000.0 + math.log(3.0)])
    assert_close(mn.softmax(x), [0.25, 0.75])
    assert_close(mn.softmax(np.array([-1000.0, -1000.0])), [0.5, 0.5])


def test_softmax_axis_is_respected():
    x = np.array([[0.0, math.log(3.0)], [0.0, 0.0]])
    assert_close(mn.softmax(x, axis=0), [[0.5, 0.75], [0.5, 0.25]])
    assert_close(mn.softmax(x, axis=-1), [[0.25, 0.75], [0.5, 0.5]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_mask", [False, True])
def test_masked_softmax_in_place_equals_the_plain_one(rng, dtype, with_mask):
    scores = (3 * rng.standard_normal((2, 3, 4, 5))).astype(dtype)  # (B, h, T_q, T_k)
    mask = rng.random((4, 5)) < 0.5 if with_mask else None  # broadcast over B and h
    if with_mask:
        mask[1] = False  # query 1 may attend to nothing: zeros, not NaN
    expected = mn.masked_softmax(scores, mask)
    owned = scores.copy()
    weights = mn.masked_softmax_(owned, mask)
    assert weights is owned and weights.dtype == dtype
    assert_close(weights, expected, dtype)
    owned_tensor = torch.from_numpy(scores.copy())  # the PyTorch twin does the same
    twin = mt.masked_softmax_(owned_tensor, None if mask is None else torch.from_numpy(mask))
    assert twin is owned_tensor
    assert_close(twin, expected, dtype)
    if with_mask:
        assert not weights[..., 1, :].any() and not weights[..., ~mask].any()
        assert_close(weights.sum(axis=-1)[..., [0, 2, 3]], np.ones((2, 3, 3)), dtype)


def test_sdpa_leaves_its_inputs_unchanged(rng):
    Q, K, V = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    copies = [a.copy() for a in (Q, K, V)]
    mn.scaled_dot_product_attention(Q, K, V, mn.causal_mask(4))
    for a, before in zip((Q, K, V), copies):
        np.testing.assert_array_equal(a, before)


def test_bias_added_in_place_keeps_float32(rng):
    X = rng.standard_normal((2, 4, 6)).astype(np.float32)
    W = rng.standard_normal((6, 6)).astype(np.float32)
    b = rng.standard_normal(6)  # float64 biases do not promote float32 activations
    out, weights = mn.multihead_attention(X, W, W, W, W, 2, b_q=b, b_k=b, b_v=b, b_o=b)
    assert out.dtype == weights.dtype == np.float32
    expected, _ = mn.multihead_attention(X.astype(np.float64), W, W, W, W, 2, b_q=b, b_k=b, b_v=b, b_o=b)
    assert_close(out, expected, np.float32)


def test_self_attention_by_hand():
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    out, weights = mn.self_attention(X)
    a = 1 / math.sqrt(2)  # score of a token with itself; 0 with the other
    w_self = math.exp(a) / (math.exp(a) + 1)
    assert_close(weights, [[w_self, 1 - w_self], [1 - w_self, w_self]])
    assert_close(out, [[w_self, 1 - w_self], [1 - w_self, w_self]])


def test_exclude_self_moves_all_weight_to_the_others():
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    out, weights = mn.self_attention(X, exclude_self=True)
    assert_close(weights, [[0.0, 1.0], [1.0, 0.0]])
    assert_close(out, X[::-1])


def test_exclude_self_with_one_token_gives_zeros_not_nan():
    out, weights = mn.self_attention(np.ones((1, 3)), exclude_self=True)
    assert_close(weights, [[0.0]])
    assert_close(out, [[0.0, 0.0, 0.0]])


def test_symmetric_attention_scales_by_the_width_of_W(rng):
    X = rng.standard_normal((4, 5))
    W = rng.standard_normal((5, 3))
    E = X @ W
    expected = mn.softmax(E @ E.T / math.sqrt(3))
    out, weights = mn.symmetric_attention(X, W)
    assert_close(weights, expected)
    assert_close(out, expected @ X)


def test_symmetric_attention_with_identity_is_self_attention(rng):
    X = rng.standard_normal((2, 4, 3))
    assert_close(mn.symmetric_attention(X, np.eye(3))[0], mn.self_attention(X)[0])


def test_head_attention_without_W_v_uses_the_inputs_as_values(rng):
    X = rng.standard_normal((4, 5))
    W_q, W_k = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    scores = (X @ W_q) @ (X @ W_k).T / math.sqrt(2)
    out, weights = mn.head_attention(X, W_q, W_k)
    assert_close(weights, mn.softmax(scores))
    assert_close(out, mn.softmax(scores) @ X)


def test_head_attention_with_context_takes_keys_and_values_from_it(rng):
    X, C = rng.standard_normal((3, 4)), rng.standard_normal((6, 5))
    W_q, W_k, W_v = (rng.standard_normal(s) for s in ((4, 2), (5, 2), (5, 7)))
    out, weights = mn.head_attention(X, W_q, W_k, W_v, context=C)
    expected = mn.softmax((X @ W_q) @ (C @ W_k).T / math.sqrt(2))
    assert weights.shape == (3, 6)
    assert_close(out, expected @ (C @ W_v))


def test_sdpa_by_hand_with_mask():
    Q = np.array([[1.0, 0.0], [0.0, 2.0]])
    K = np.array([[2.0, 0.0], [0.0, 0.0]])
    V = np.array([[1.0, 10.0], [3.0, 30.0]])
    mask = np.array([[True, True], [False, True]])
    out, weights = mn.scaled_dot_product_attention(Q, K, V, mask)
    w = math.exp(2 / math.sqrt(2)) / (math.exp(2 / math.sqrt(2)) + 1)
    assert_close(weights, [[w, 1 - w], [0.0, 1.0]])
    assert_close(out, [[w + 3 * (1 - w), 10 * w + 30 * (1 - w)], [3.0, 30.0]])


def test_sdpa_fully_masked_row_gives_zero_weights_and_output(rng):
    Q, K, V = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, weights = mn.scaled_dot_product_attention(Q, K, V, mask)
    assert np.all(weights[1] == 0) and np.all(out[1] == 0)
    assert_close(weights.sum(-1)[[0, 2]], [1.0, 1.0])


def test_split_heads_gives_each_head_its_column_block():
    X = np.arange(12.0).reshape(2, 6)  # T=2 tokens, d=6
    heads = mn.split_heads(X, 2)
    assert heads.shape == (2, 2, 3)
    np.testing.assert_array_equal(heads[0], [[0, 1, 2], [6, 7, 8]])
    np.testing.assert_array_equal(heads[1], [[3, 4, 5], [9, 10, 11]])
    np.testing.assert_array_equal(mn.merge_heads(heads), X)


def test_causal_and_padding_masks_by_hand():
    np.testing.assert_array_equal(
        mn.causal_mask(3), [[True, False, False], [True, True, False], [True, True, True]]
    )
    mask = mn.padding_mask([2, 4, 0], 4)
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == bool
    np.testing.assert_array_equal(
        mask[:, 0, 0], [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    )


def test_layer_norm_by_hand_uses_the_biased_variance():
    out = mn.layer_norm(np.array([1.0, 2.0, 3.0]), np.ones(3), np.zeros(3), eps=0.0)
    assert_close(out, np.array([-1.0, 0.0, 1.0]) / math.sqrt(2 / 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_equals_torch(rng, dtype):
    X = (3 + 2 * rng.standard_normal((2, 5, 8))).astype(dtype)
    gamma, beta = rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype)
    expected = torch.nn.functional.layer_norm(
        torch.tensor(X), (8,), torch.tensor(gamma), torch.tensor(beta), eps=1e-3
    )
    out = mn.layer_norm(X, gamma, beta, eps=1e-3)
    assert out.dtype == dtype
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_equals_torch(rng, activation):
    X = rng.standard_normal((3, 4))
    W_1, b_1 = rng.standard_normal((4, 6)), rng.standard_normal(6)
    W_2, b_2 = rng.standard_normal((6, 4)), rng.standard_normal(4)
    act = torch.nn.functional.relu if activation == "relu" else torch.nn.functional.gelu
    t = [torch.tensor(a) for a in (X, W_1, b_1, W_2, b_2)]
    expected = act(t[0] @ t[1] + t[2]) @ t[3] + t[4]
    assert_close(mn.feed_forward(X, W_1, b_1, W_2, b_2, activation), expected)


def test_relu_and_gelu_differ_on_negative_inputs():
    x = np.array([-1.0, 0.0, 2.0])
    assert_close(mn.relu(x), [0.0, 0.0, 2.0])
    assert_close(mn.gelu(x), [-0.15865525393145707, 0.0, 1.9544997361036416])


def test_float32_stays_float32_through_every_function(rng):
    X = rng.standard_normal((2, 4, 6)).astype(np.float32)
    W = rng.standard_normal((6, 6)).astype(np.float32)
    params = {f"W_{n}": W for n in "qkvo"}
    results = [
        mn.softmax(X), mn.self_attention(X)[0], mn.symmetric_attention(X, W)[0],
        mn.head_attention(X, W, W, W)[0], mn.scaled_dot_product_attention(X, X, X)[0],
        mn.multihead_attention(X, n_heads=2, mask=mn.causal_mask(4), **params)[0],
        mn.layer_norm(X, W[0], W[1]), mn.feed_forward(X, W, W[0], W, W[1], "gelu"),
    ]
    assert [r.dtype for r in results] == [np.float32] * len(results)


def test_integer_inputs_are_computed_in_float64():
    out, weights = mn.self_attention(np.array([[1, 0], [0, 1]]))
    assert out.dtype == np.float64 and weights.dtype == np.float64
