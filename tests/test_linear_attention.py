"""Linear attention (chapter 18) in both faces: the step as its formula, the recurrent form equal to the
parallel (T x T) form and to the chunked form (any T, any chunk size, initial states, batch axes) in
float64, the NumPy face equal to the PyTorch face, half inputs computed in float32, gradients, and
bad input refused by name."""

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt


def case(seed, lead=(2, 3), T=11, d_k=4, d_v=5, features=True):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, *lead, T, d_k))
    v = rng.normal(size=(*lead, T, d_v))
    if features:
        q, k = mnp.elu_feature_map(q), mnp.elu_feature_map(k)
    return q, k, v, rng.normal(size=(*lead, d_k, d_v))


def test_elu_feature_map_is_elu_plus_one_and_positive():
    x = np.array([-30.0, -1.0, 0.0, 0.5, 2.0])
    expected = np.array([np.exp(-30.0), np.exp(-1.0), 1.0, 1.5, 3.0])
    np.testing.assert_allclose(mnp.elu_feature_map(x), expected, rtol=1e-15)
    np.testing.assert_allclose(mt.elu_feature_map(torch.as_tensor(x)).numpy(), expected, rtol=1e-15)
    assert np.all(mnp.elu_feature_map(np.random.default_rng(0).normal(size=100) * 10) > 0)


def test_the_step_writes_an_outer_product_then_reads():
    rng = np.random.default_rng(1)
    S, q, k, v = rng.normal(size=(3, 4)), rng.normal(size=3), rng.normal(size=3), rng.normal(size=4)
    out, new = mnp.linear_attention_step(S, q, k, v)
    expected = S + np.outer(k, v)
    np.testing.assert_allclose(new, expected, rtol=1e-15)
    np.testing.assert_allclose(out, q @ expected, rtol=1e-14)
    out_t, new_t = mt.linear_attention_step(*(torch.as_tensor(a) for a in (S, q, k, v)))
    np.testing.assert_allclose(out_t.numpy(), out, rtol=1e-14)
    np.testing.assert_allclose(new_t.numpy(), new, rtol=1e-15)


def test_the_recurrent_form_is_the_sum_over_earlier_tokens():
    q, k, v, _ = case(2, lead=(), T=6)
    out, state = mnp.linear_attention_recurrent(q, k, v)
    expected = np.stack([q[i] @ sum(np.outer(k[j], v[j]) for j in range(i + 1)) for i in range(6)])
    np.testing.assert_allclose(out, expected, rtol=1e-13)
    np.testing.assert_allclose(state, k.T @ v, rtol=1e-13)


@pytest.mark.parametrize("T", [1, 5, 11, 70])
@pytest.mark.parametrize("chunk_size", [1, 3, 64])
def test_recurrent_parallel_and_chunked_agree_in_both_faces(T, chunk_size):
    q, k, v, S0 = case(T * 100 + chunk_size, T=T)
    out_r, state_r = mnp.linear_attention_recurrent(q, k, v)
    np.testing.assert_allclose(mnp.linear_attention_parallel(q, k, v), out_r, rtol=1e-12, atol=1e-12)
    out_c, state_c = mnp.linear_attention_chunked(q, k, v, chunk_size=chunk_size)
    np.testing.assert_allclose(out_c, out_r, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state_c, state_r, rtol=1e-12, atol=1e-12)
    out_s, state_s = mnp.linear_attention_recurrent(q, k, v, initial_state=S0)  # a state carried in
    np.testing.assert_allclose(out_s, out_r + q @ S0, rtol=1e-12, atol=1e-12)
    tq, tk, tv, tS = (torch.as_tensor(a) for a in (q, k, v, S0))
    for got, state in (mt.linear_attention_chunked(tq, tk, tv, chunk_size=chunk_size, initial_state=tS),
                       mt.linear_attention_recurrent(tq, tk, tv, initial_state=tS)):
        np.testing.assert_allclose(got.numpy(), out_s, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(state.numpy(), state_r + S0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mt.linear_attention_parallel(tq, tk, tv).numpy(), out_r, rtol=1e-12, atol=1e-12)
    out_n, state_n = mnp.linear_attention_chunked(q, k, v, chunk_size=chunk_size, initial_state=S0)
    np.testing.assert_allclose(out_n, out_s, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state_n, state_r + S0, rtol=1e-12, atol=1e-12)


def test_chunks_split_anywhere_continue_the_same_sequence():
    q, k, v, S0 = case(3, T=23)
    whole, state = mt.linear_attention_chunked(*(torch.as_tensor(a) for a in (q, k, v)), chunk_size=4,
                                               initial_state=torch.as_tensor(S0))
    first, mid = mnp.linear_attention_chunked(q[..., :9, :], k[..., :9, :], v[..., :9, :], initial_state=S0)
    second, end = mnp.linear_attention_chunked(q[..., 9:, :], k[..., 9:, :], v[..., 9:, :], chunk_size=5,
                                               initial_state=mid)
    np.testing.assert_allclose(np.concatenate([first, second], -2), whole.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(end, state.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_half_and_single_precision_keep_their_dtype_and_the_values(dtype):
    q, k, v, S0 = case(4, T=13)
    tq, tk, tv = (torch.as_tensor(a, dtype=dtype) for a in (q, k, v))
    out, state = mt.linear_attention_chunked(tq, tk, tv, chunk_size=4)
    assert out.dtype == dtype and state.dtype == torch.float32
    exact, _ = mnp.linear_attention_recurrent(*(t.double().numpy() for t in (tq, tk, tv)))  # the rounded inputs
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    np.testing.assert_allclose(out.double().numpy(), exact, rtol=tol, atol=tol * np.abs(exact).max())
    assert mt.linear_attention_parallel(tq, tk, tv).dtype == dtype
    np32, _ = mnp.linear_attention_chunked(*(a.astype(np.float32) for a in (q, k, v)), chunk_size=4)
    assert np32.dtype == np.float32


def test_the_chunked_form_has_the_gradients_of_the_recurrent_one():
    q, k, v, S0 = case(5, lead=(2,), T=7, d_k=3, d_v=2)
    inputs = [torch.as_tensor(a).requires_grad_() for a in (q, k, v, S0)]
    chunked = lambda q, k, v, S: mt.linear_attention_chunked(q, k, v, chunk_size=3, initial_state=S)
    assert torch.autograd.gradcheck(chunked, inputs)
    out_c, state_c = chunked(*inputs)
    grads_c = torch.autograd.grad((out_c ** 2).sum() + state_c.sum(), inputs)
    out_r, state_r = mt.linear_attention_recurrent(*inputs[:3], initial_state=inputs[3])
    grads_r = torch.autograd.grad((out_r ** 2).sum() + state_r.sum(), inputs)
    for a, b in zip(grads_c, grads_r):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bad_input_is_refused_by_name():
    q, k, v, S0 = case(6, T=5)
    with pytest.raises(ValueError, match=r"q and k must have one shape"):
        mnp.linear_attention_recurrent(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"q and k must have one shape"):
        mt.linear_attention_chunked(torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(v[..., :4, :]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \(\.\.\., d_k, d_v\) = \(2, 3, 4, 5\)"):
        mnp.linear_attention_chunked(q, k, v, initial_state=S0[..., :3])
    with pytest.raises(ValueError, match=r"chunk_size must be at least 1, got chunk_size=0"):
        mnp.linear_attention_chunked(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match=r"chunk_size must be at least 1"):
        mt.linear_attention_chunked(*(torch.as_tensor(a) for a in (q, k, v)), chunk_size=0)
    with pytest.raises(TypeError, match=r"chunk_size must be an integer"):
        mnp.linear_attention_chunked(q, k, v, chunk_size=2.0)
    with pytest.raises(ValueError, match=r"so q and k need width d_k=4 and v width d_v=5"):
        mnp.linear_attention_step(S0, q[..., 0, :], k[..., 0, :], v[..., 0, :3])
    with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., d_k, d_v\)"):
        mt.linear_attention_step(torch.as_tensor(S0), *(torch.as_tensor(a[..., 0, :2]) for a in (q, k, v)))
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor"):
        mt.linear_attention_parallel(q, torch.as_tensor(k), torch.as_tensor(v))
    with pytest.raises(TypeError, match=r"q must be an array of numbers"):
        mnp.linear_attention_parallel(q > 0, k, v)
