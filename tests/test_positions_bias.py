"""Attention with a score bias (chapter 10): ALiBi's bias in both faces and in MultiHeadAttention.

The bias path against F.scaled_dot_product_attention with a float mask, with a boolean mask and a
query that may attend to nothing; the module's fast and explicit paths against the NumPy face, also
on `meta`; a constant bias changes nothing; the errors. The position tables: tests/test_positions.py.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha.numpy as mn
import mha.torch as mt


def random_qkv(B=2, h=3, T_q=5, T_k=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, T, d, generator=g, dtype=torch.float64) for T in (T_q, T_k, T_k))


@pytest.mark.parametrize("T_q,T_k", [(5, 5), (2, 6)])
def test_the_bias_path_equals_pytorch_with_a_float_mask(T_q, T_k):
    q, k, v = random_qkv(T_q=T_q, T_k=T_k)
    bias = mt.alibi_bias(T_q, T_k, mt.alibi_slopes(3, dtype=torch.float64))  # (h, T_q, T_k)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out, weights = mt.scaled_dot_product_attention(q, k, v, bias=bias)
    assert (out - expected).abs().max() < 1e-12
    out_np, weights_np = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=bias.numpy())
    assert np.abs(out_np - expected.numpy()).max() < 1e-12 and np.abs(weights_np - weights.numpy()).max() < 1e-12


def test_a_bias_with_a_boolean_mask_and_a_fully_masked_row():
    q, k, v = random_qkv()
    bias = mt.alibi_bias(5, 5, mt.alibi_slopes(3, dtype=torch.float64))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, 0, 2] = False  # sequence 1, query 2 may attend to nothing
    float_mask = bias.masked_fill(~mask, float("-inf"))  # (2, 3, 5, 5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    out, weights = mt.scaled_dot_product_attention(q, k, v, mask, bias=bias)
    assert (out - expected).abs().max() < 1e-12
    assert torch.all(weights[1, :, 2] == 0) and torch.all(out[1, :, 2] == 0)
    out_np, weights_np = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), mask.numpy(),
                                                         bias=bias.numpy())
    assert np.abs(out_np - expected.numpy()).max() < 1e-12 and np.all(weights_np[1, :, 2] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_the_module_takes_a_bias_on_its_fast_and_explicit_paths_and_equals_the_numpy_face(causal, with_mask):
    torch.manual_seed(0)
    layer = mt.MultiHeadAttention(8, 2, dtype=torch.float64).eval()
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    bias = mt.alibi_bias(6, 6, mt.alibi_slopes(2, dtype=torch.float64))
    mask = mt.padding_mask([6, 4, 0], 6) if with_mask else None  # the last sequence has no real key
    with torch.no_grad():
        fast = layer(x, mask=mask, causal=causal, bias=bias)
        explicit, weights = layer(x, mask=mask, causal=causal, bias=bias, return_weights=True)
    assert (fast - explicit).abs().max() < 1e-12
    full_mask = np.ones((6, 6), dtype=bool) if mask is None else mask.numpy()
    full_mask = full_mask & (mn.causal_mask(6) if causal else True)
    ours, ours_weights = mn.multihead_attention(x.numpy(), n_heads=2, mask=full_mask, bias=bias.numpy(),
                                                **layer.numpy_params())
    assert np.abs(ours - fast.numpy()).max() < 1e-12 and np.abs(ours_weights - weights.numpy()).max() < 1e-12
    on_meta = layer.to("meta")(x.to("meta"), causal=causal, bias=bias.to("meta"))
    assert on_meta.shape == (3, 6, 8)


def test_a_zero_bias_changes_nothing_and_a_constant_one_too():
    q, k, v = random_qkv()
    plain, _ = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())
    shifted, _ = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=np.full((5, 5), 3.0))
    assert np.abs(plain - shifted).max() < 1e-12  # a softmax ignores a constant added to a row


def test_the_bias_errors():
    q, k, v = random_qkv()
    with pytest.raises(ValueError, match=r"bias has shape \(4, 5, 5\) but scores have shape \(2, 3, 5, 5\)"):
        mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=np.zeros((4, 5, 5)))
    with pytest.raises(ValueError, match=r"bias has shape \(5, 6\)"):
        mt.scaled_dot_product_attention(q, k, v, bias=torch.zeros(5, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="bias must be a floating-point tensor"):
        mt.scaled_dot_product_attention(q, k, v, bias=torch.zeros(5, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="bias must be an array of numbers"):
        mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=np.zeros((5, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"bias has shape \(3, 6, 6\) but scores have shape \(2, 3, 5, 5\)"):
        mt.MultiHeadAttention(6, 3)(torch.zeros(2, 5, 6), bias=torch.zeros(3, 6, 6))
    # A float32 score with a float64 bias stays float32.
    out, weights = mn.scaled_dot_product_attention(*(a.numpy().astype(np.float32) for a in (q, k, v)),
                                                   bias=np.zeros((5, 5)))
    assert out.dtype == weights.dtype == np.float32
