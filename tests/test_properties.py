"""Properties that hold for every input, checked on random shapes with hypothesis."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mha.numpy as mn
import mha.torch as mt
from conftest import (CPU_AND_CUDA, assert_close, assert_close_on, heads_from_columns, load_params,
                      random_attention_params)

settings.register_profile("course", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("course")


@st.composite
def attention_inputs(draw):
    """Random (X, context, mask, params, n_heads) with consistent shapes."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    T_q, T_k = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    n_heads, d_head = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    cross = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    d = n_heads * d_head
    T_k = T_k if cross else T_q
    X = rng.standard_normal((*batch, T_q, d))
    context = rng.standard_normal((*batch, T_k, d)) if cross else None
    mask = rng.random((*batch, 1, T_q, T_k)) < 0.7 if draw(st.booleans()) else None
    return X, context, mask, random_attention_params(rng, d), n_heads


@given(attention_inputs())
def test_weight_rows_sum_to_one_or_zero_when_fully_masked(case):
    X, context, mask, params, h = case
    _, weights = mn.multihead_attention(X, n_heads=h, context=context, mask=mask, **params)
    sums = weights.sum(-1)
    expected = np.ones_like(sums) if mask is None else np.broadcast_to(mask.any(-1), sums.shape).astype(float)
    assert_close(sums, expected)
    assert np.all(weights >= 0)
    if mask is not None:
        assert np.all(weights[~np.broadcast_to(mask, weights.shape)] == 0)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@given(attention_inputs())
def test_fused_equals_loop_and_torch_on_random_shapes(device, case):
    """On random shapes and masks, the loop of heads equals the fused form, and the torch module,
    on the CPU and on a GPU, equals both (outputs and weights)."""
    X, context, mask, params, h = case
    out, weights = mn.multihead_attention(X, n_heads=h, context=context, mask=mask, **params)
    unbiased = {k: v for k, v in params.items() if k.startswith("W")}
    loop_out, loop_w = mn.multihead_attention_loop(
        X, heads_from_columns(params, h), params["W_o"], context=context, mask=mask)
    fused_out, fused_w = mn.multihead_attention(X, n_heads=h, context=context, mask=mask, **unbiased)
    assert_close(loop_out, fused_out)
    assert_close(loop_w, fused_w)
    module = load_params(mt.MultiHeadAttention(X.shape[-1], h, dtype=torch.float64), params).to(device)
    as_t = lambda a: None if a is None else torch.as_tensor(a, device=device)  # noqa: E731
    with torch.no_grad():
        assert_close_on(device, module(as_t(X), as_t(context), as_t(mask)), out)
        _, module_w = module(as_t(X), as_t(context), as_t(mask), return_weights=True)
    assert module_w.device.type == device
    assert_close_on(device, module_w, weights)


@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**16))
def test_permuting_tokens_permutes_outputs(T, h, d_head, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, h * d_head))
    params = random_attention_params(rng, h * d_head)
    perm = rng.permutation(T)
    out, weights = mn.multihead_attention(X, n_heads=h, **params)
    out_p, weights_p = mn.multihead_attention(X[perm], n_heads=h, **params)
    assert_close(out_p, out[perm])
    assert_close(weights_p, weights[:, perm][:, :, perm])
    self_out, _ = mn.self_attention(X[perm])
    assert_close(self_out, mn.self_attention(X)[0][perm])


def antisymmetric_part_is_a_gradient(weights):
    """True when log-weights come from a symmetric score matrix S.

    w_ij = exp(S_ij) / Z_i, so A = log w - log w^T has A_ij = log Z_j - log Z_i,
    which holds exactly when A_ij = A_i0 + A_0j for all i, j.
    """
    L = np.log(weights)
    A = L - L.T
    return np.allclose(A, A[:, :1] + A[:1, :], atol=1e-9)


@given(st.integers(2, 6), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**16))
def test_symmetric_attention_scores_are_symmetric(T, d, d_embed, seed):
    rng = np.random.default_rng(seed)
    X, W = rng.standard_normal((T, d)), rng.standard_normal((d, d_embed))
    _, weights = mn.symmetric_attention(X, W)
    assert antisymmetric_part_is_a_gradient(weights)
    module = mt.SymmetricAttention(d, d_embed, dtype=torch.float64)
    with torch.no_grad():
        module.W.weight.copy_(torch.as_tensor(W.T))
        _, w_t = module(torch.as_tensor(X), return_weights=True)
    assert_close(w_t, weights)


def test_separate_queries_and_keys_break_the_symmetry():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((5, 4))
    _, weights = mn.head_attention(X, rng.standard_normal((4, 3)), rng.standard_normal((4, 3)))
    assert not antisymmetric_part_is_a_gradient(weights)


@given(st.lists(st.integers(1, 3), max_size=2), st.integers(1, 5), st.integers(1, 4),
       st.integers(1, 4))
def test_split_then_merge_is_the_identity(batch, T, h, d_head):
    X = np.arange(np.prod(batch, dtype=int) * T * h * d_head, dtype=float).reshape(*batch, T, h * d_head)
    heads = mn.split_heads(X, h)
    assert heads.shape == (*batch, h, T, d_head)
    np.testing.assert_array_equal(mn.merge_heads(heads), X)
    np.testing.assert_array_equal(heads[..., -1, :, :], X[..., (h - 1) * d_head:])
    t = torch.as_tensor(X)
    assert torch.equal(mt.merge_heads(mt.split_heads(t, h)), t)
    np.testing.assert_array_equal(mt.split_heads(t, h).numpy(), heads)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**16))
def test_one_head_reduces_to_head_attention(T, d, d_head, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((2, T, d))
    W_q, W_k, W_v = (rng.standard_normal((d, d_head)) for _ in range(3))
    mask = rng.random((2, T, T)) < 0.6
    expected, expected_w = mn.head_attention(X, W_q, W_k, W_v, mask=mask)
    out, weights = mn.multihead_attention_loop(X, [(W_q, W_k, W_v)], np.eye(d_head), mask=mask[:, None])
    assert_close(out, expected)
    assert_close(weights[:, 0], expected_w)
    if d == d_head:
        fused, _ = mn.multihead_attention(X, W_q, W_k, W_v, np.eye(d), 1, mask=mask[:, None])
        assert_close(fused, expected)


@given(st.integers(1, 8), st.integers(0, 2**16))
def test_causal_output_ignores_the_future(T, seed):
    rng = np.random.default_rng(seed)
    params = random_attention_params(rng, 6)
    X = rng.standard_normal((T, 6))
    changed = X.copy()
    t = rng.integers(0, T)
    changed[t + 1:] = rng.standard_normal(changed[t + 1:].shape)
    mask = mn.causal_mask(T)
    out, _ = mn.multihead_attention(X, n_heads=2, mask=mask, **params)
    out_changed, _ = mn.multihead_attention(changed, n_heads=2, mask=mask, **params)
    assert_close(out_changed[: t + 1], out[: t + 1])
