"""The delta rule and Gated DeltaNet's functions (chapter 18) in both faces: the update as its formula, the
recurrent form equal to the chunked form and one chunk equal to its steps (float64, any T, chunk sizes 1, 3
and 64, initial states, batch axes, with and without the decay), the two faces equal, and each equal to
transformers' reference functions (qwen3_next's torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule,
causal_conv1d_fn, causal_conv1d_update, l2norm, Qwen3NextRMSNormGated), called explicitly so that no test
depends on fla or causal_conv1d being installed."""

import numpy as np
import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

import mha.numpy as mnp
import mha.torch as mt


def case(seed, lead=(2, 3), T=11, d_k=4, d_v=5, decay=True):
    """q, k (L2-normalised), v, g (log decays < 0) or None, beta in (0, 1), and a state."""
    rng = np.random.default_rng(seed)
    q, k = mnp.l2_normalize(rng.normal(size=(2, *lead, T, d_k)))
    v = rng.normal(size=(*lead, T, d_v))
    g = np.log(rng.uniform(0.5, 1.0, size=(*lead, T))) if decay else None
    beta = rng.uniform(0.05, 1.0, size=(*lead, T))
    return q, k, v, g, beta, rng.normal(size=(*lead, d_k, d_v))


def tensors(*arrays, dtype=torch.float64):
    return [None if a is None else torch.as_tensor(a, dtype=dtype) for a in arrays]


def test_l2_normalize_puts_eps_inside_the_root_like_transformers():
    x = np.random.default_rng(0).normal(size=(3, 7)) * 0.01
    expected = x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(mnp.l2_normalize(x), expected, rtol=1e-15)
    np.testing.assert_allclose(mt.l2_normalize(torch.as_tensor(x)).numpy(), expected, rtol=1e-14)
    theirs = qwen3_next.l2norm(torch.as_tensor(x), dim=-1, eps=1e-6)
    np.testing.assert_allclose(mt.l2_normalize(torch.as_tensor(x)).numpy(), theirs.numpy(), rtol=1e-14)


def test_the_update_is_decay_then_a_share_beta_of_the_error():
    rng = np.random.default_rng(1)
    S, k, v = rng.normal(size=(3, 4)), rng.normal(size=3), rng.normal(size=4)
    g, beta = -0.3, 0.7
    faded = np.exp(g) * S
    expected = faded + np.outer(k, beta * (v - k @ faded))
    np.testing.assert_allclose(mnp.gated_delta_update(S, k, v, g, beta), expected, rtol=1e-14)
    got = mt.gated_delta_update(*tensors(S, k, v, np.float64(g), np.float64(beta)))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-14)
    no_decay = S + np.outer(k, beta * (v - k @ S))
    np.testing.assert_allclose(mnp.gated_delta_update(S, k, v, None, beta), no_decay, rtol=1e-14)
    unit = k / np.linalg.norm(k)  # beta 1 and a unit key: the state now returns v for that key
    np.testing.assert_allclose(unit @ mnp.gated_delta_update(S, unit, v, None, 1.0), v, rtol=1e-13)
    q = rng.normal(size=3)
    out, new = mnp.gated_delta_step(S, q, k, v, g, beta)
    np.testing.assert_allclose(out, q @ expected, rtol=1e-13)
    out_t, new_t = mt.gated_delta_step(*tensors(S, q, k, v, np.float64(g), np.float64(beta)))
    np.testing.assert_allclose(out_t.numpy(), out, rtol=1e-13)


@pytest.mark.parametrize("decay", [True, False])
@pytest.mark.parametrize("T", [1, 7, 70])
@pytest.mark.parametrize("chunk_size", [1, 3, 64])
def test_recurrent_and_chunked_agree_in_both_faces(T, chunk_size, decay):
    q, k, v, g, beta, S0 = case(T * 10 + chunk_size, T=T, decay=decay)
    out, state = mnp.gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=S0)
    for face_out, face_state in (
            mnp.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=chunk_size, initial_state=S0),
            mt.gated_delta_rule_chunked(*tensors(q, k, v, g, beta), chunk_size=chunk_size,
                                        initial_state=torch.as_tensor(S0)),
            mt.gated_delta_rule_recurrent(*tensors(q, k, v, g, beta), initial_state=torch.as_tensor(S0))):
        np.testing.assert_allclose(np.asarray(face_out), out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(face_state), state, rtol=1e-12, atol=1e-12)
    zero_start, _ = mnp.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=chunk_size, scale=0.5)
    expected, _ = mnp.gated_delta_rule_recurrent(q, k, v, g, beta, scale=0.5)
    np.testing.assert_allclose(zero_start, expected, rtol=1e-12, atol=1e-12)


def test_one_chunk_is_its_steps():
    q, k, v, g, beta, S0 = case(7, lead=(3,), T=6, d_k=3, d_v=5)
    out, state = mnp.gated_delta_chunk(S0, q, k, v, g, beta)
    S, outs = S0, []
    for t in range(6):
        o, S = mnp.gated_delta_step(S, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        outs.append(o)
    np.testing.assert_allclose(out, np.stack(outs, -2), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(state, S, rtol=1e-12, atol=1e-13)
    out_t, state_t = mt.gated_delta_chunk(*tensors(S0, q, k, v, g, beta))
    np.testing.assert_allclose(out_t.numpy(), out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(state_t.numpy(), state, rtol=1e-12, atol=1e-13)


def theirs(function, q, k, v, g, beta, state, **kwargs):
    """transformers' reference, (B, T, heads, d) in and out; ours take (B, heads, T, d)."""
    swap = lambda x: x.transpose(1, 2)
    out, final = function(swap(q), swap(k), swap(v), g=swap(g), beta=swap(beta), initial_state=state,
                          output_final_state=True, use_qk_l2norm_in_kernel=True, **kwargs)
    return swap(out), final


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed, T, n_k, n_v", [(11, 9, 2, 2), (12, 70, 1, 3), (13, 130, 2, 4)])
def test_equal_to_transformers_reference_functions(seed, T, n_k, n_v, dtype):
    rng = np.random.default_rng(seed)
    q, k = tensors(*rng.normal(size=(2, 2, n_k, T, 8)), dtype=dtype)  # not normalised: transformers does it
    v, S0 = tensors(rng.normal(size=(2, n_v, T, 6)), rng.normal(size=(2, n_v, 8, 6)), dtype=dtype)
    g, beta = tensors(-rng.uniform(0.0, 2.0, size=(2, n_v, T)), rng.uniform(0, 1, size=(2, n_v, T)), dtype=dtype)
    q_ours, k_ours = (mt.l2_normalize(x.repeat_interleave(n_v // n_k, dim=1)) for x in (q, k))  # the caller's share
    ours = mt.gated_delta_rule_chunked(q_ours, k_ours, v, g, beta, initial_state=S0)
    mine_recurrent = mt.gated_delta_rule_recurrent(q_ours, k_ours, v, g, beta, initial_state=S0)
    for reference in (theirs(qwen3_next.torch_chunk_gated_delta_rule, q, k, v, g, beta, S0),
                      theirs(qwen3_next.torch_recurrent_gated_delta_rule, q, k, v, g, beta, S0)):
        for a, b in ((ours[0], reference[0]), (ours[1], reference[1]), (mine_recurrent[0], reference[0])):
            assert a.dtype == dtype
            scale = b.abs().max().item()
            torch.testing.assert_close(a.to(b.dtype), b, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32_as_transformers_computes_them(dtype):
    q, k, v, g, beta, S0 = case(14, lead=(2, 2), T=20, d_k=8, d_v=4)
    tq, tk, tv, tg, tb = tensors(q, k, v, g, beta, dtype=dtype)
    out, state = mt.gated_delta_rule_chunked(tq, tk, tv, tg, tb, chunk_size=8)
    assert out.dtype == dtype and state.dtype == torch.float32
    ref_out, ref_state = theirs(qwen3_next.torch_chunk_gated_delta_rule, tq, tk, tv, tg, tb, None, chunk_size=8)
    exact = mt.gated_delta_rule_chunked(*(x.float() for x in (tq, tk, tv, tg, tb)), chunk_size=8)
    torch.testing.assert_close(out, exact[0].to(dtype), rtol=0, atol=0)  # the float32 result, rounded once
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(state, exact[1], rtol=1e-6, atol=1e-6)


def test_the_chunked_form_is_differentiable():
    q, k, v, g, beta, S0 = case(15, lead=(2,), T=7, d_k=3, d_v=2)
    inputs = [torch.as_tensor(a).requires_grad_() for a in (q, k, v, g, beta, S0)]
    chunked = lambda q, k, v, g, b, S: mt.gated_delta_rule_chunked(q, k, v, g, b, chunk_size=3, initial_state=S)
    assert torch.autograd.gradcheck(chunked, inputs)


@pytest.mark.parametrize("K", [1, 2, 4])
def test_causal_conv1d_is_transformers_conv_for_a_prompt_and_a_step(K):
    rng = np.random.default_rng(20 + K)
    x, weight, state = rng.normal(size=(2, 9, 6)), rng.normal(size=(6, K)), rng.normal(size=(2, K - 1, 6))
    y, new_state = mnp.causal_conv1d(x, weight)
    expected = qwen3_next.causal_conv1d_fn(torch.as_tensor(x).transpose(1, 2), torch.as_tensor(weight),
                                           activation="silu").transpose(1, 2)
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(new_state, x[:, 9 - (K - 1):], rtol=0)
    y_t, state_t = mt.causal_conv1d(*tensors(x, weight))
    np.testing.assert_allclose(y_t.numpy(), y, rtol=1e-13, atol=1e-14)
    conv_state = torch.as_tensor(state).transpose(1, 2).clone()  # transformers' (B, C, K - 1), updated in place
    step = qwen3_next.causal_conv1d_update(torch.as_tensor(x[:, :1]).transpose(1, 2), conv_state,
                                           torch.as_tensor(weight), activation="silu")
    for face in (mnp.causal_conv1d(x[:, :1], weight, state=state),
                 mt.causal_conv1d(*tensors(x[:, :1], weight), state=torch.as_tensor(state))):
        np.testing.assert_allclose(np.asarray(face[0]), step.transpose(1, 2).numpy(), rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(np.asarray(face[1]), conv_state.transpose(1, 2).numpy(), rtol=0)
    first, mid = mnp.causal_conv1d(x[:, :4], weight, activation=None)  # split anywhere, the state carries on
    second, _ = mnp.causal_conv1d(x[:, 4:], weight, state=mid, activation=None)
    whole, _ = mnp.causal_conv1d(x, weight, activation=None)
    np.testing.assert_allclose(np.concatenate([first, second], 1), whole, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_gated_rms_norm_is_qwen3_nexts(dtype):
    rng = np.random.default_rng(30)
    x, gate = tensors(*rng.normal(size=(2, 3, 5, 8)), dtype=dtype)
    norm = qwen3_next.Qwen3NextRMSNormGated(8, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.as_tensor(rng.normal(size=8)))
        expected = norm(x, gate)
    got = mt.gated_rms_norm(x, gate, norm.weight.detach(), eps=1e-6)
    assert got.dtype == dtype
    if dtype == torch.float64:  # transformers computes the norm in float32 even here; we keep float64
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        return
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if dtype == torch.float32:
        np_got = mnp.gated_rms_norm(x.numpy(), gate.numpy(), norm.weight.detach().numpy())
        np.testing.assert_allclose(np_got, expected.numpy(), rtol=1e-6 if dtype == torch.float32 else 1e-14)


def test_the_state_bytes_are_the_formula_and_do_not_depend_on_T():
    sizes = dict(n_key_heads=16, n_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4)
    expected = (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2  # Qwen3-Next-80B's layer, bfloat16
    assert mnp.gated_delta_state_bytes(**sizes) == mt.gated_delta_state_bytes(**sizes) == expected == 1_097_728
    assert mnp.gated_delta_state_bytes(**sizes, batch=3, bytes_per_value=4) == expected * 6
    with pytest.raises(ValueError, match="conv_kernel must be at least 1"):
        mnp.gated_delta_state_bytes(**{**sizes, "conv_kernel": 0})


def test_bad_input_is_refused_by_name():
    q, k, v, g, beta, S0 = case(40, T=5)
    with pytest.raises(ValueError, match=r"g is the log of the decay and must be <= 0"):
        mnp.gated_delta_rule_recurrent(q, k, v, -g, beta)
    with pytest.raises(ValueError, match=r"beta must have shape \(2, 3, 5\)"):
        mnp.gated_delta_rule_chunked(q, k, v, g, beta[..., :4])
    with pytest.raises(ValueError, match=r"g must have shape \(2, 3, 5\)"):
        mt.gated_delta_rule_chunked(*tensors(q, k, v, g[..., None], beta))
    with pytest.raises(ValueError, match=r"chunk_size must be at least 1"):
        mt.gated_delta_rule_chunked(*tensors(q, k, v, g, beta), chunk_size=0)
    with pytest.raises(ValueError, match=r"chunk_size must be at least 1"):
        mnp.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=-1)
    with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., d_k, d_v\)"):
        mnp.gated_delta_update(S0[..., :3, :], k[..., 0, :], v[..., 0, :], g[..., 0], beta[..., 0])
    with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., d_k, d_v\)"):
        mt.gated_delta_update(*tensors(S0, k[..., 0, :], v[..., 0, :2], g[..., 0], beta[..., 0]))
    with pytest.raises(ValueError, match=r"initial_state must have shape"):
        mt.gated_delta_rule_recurrent(*tensors(q, k, v, g, beta), initial_state=torch.zeros(2, 3, 5, 4))
    with pytest.raises(ValueError, match=r"scale must be None"):
        mnp.gated_delta_rule_chunked(q, k, v, g, beta, scale=-1.0)
    with pytest.raises(ValueError, match=r"weight must have shape \(C, K\) = \(6, K\)"):
        mt.causal_conv1d(torch.zeros(2, 3, 6), torch.zeros(5, 4))
    with pytest.raises(ValueError, match=r"state must hold the K - 1 inputs before x"):
        mnp.causal_conv1d(np.zeros((2, 3, 6)), np.zeros((6, 4)), state=np.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match=r"activation must be None or 'silu'"):
        mnp.causal_conv1d(np.zeros((2, 3, 6)), np.zeros((6, 4)), activation="gelu")
    with pytest.raises(ValueError, match=r"gate must have the shape of x"):
        mt.gated_rms_norm(torch.zeros(3, 4), torch.zeros(3, 5), torch.ones(4))


def test_the_numpy_face_keeps_float32():
    q, k, v, g, beta, S0 = (None if a is None else a.astype(np.float32) for a in case(41, T=9))
    for decay in (g, None):
        out, state = mnp.gated_delta_chunk(S0, q, k, v, decay, beta)
        assert out.dtype == state.dtype == np.float32
        out, state = mnp.gated_delta_rule_chunked(q, k, v, decay, beta, chunk_size=4)
        assert out.dtype == state.dtype == mnp.gated_delta_rule_recurrent(q, k, v, decay, beta)[0].dtype == np.float32
    assert mnp.causal_conv1d(v, np.ones((5, 3), np.float32))[0].dtype == np.float32
