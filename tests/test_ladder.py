"""The equivalence ladder, rung by rung, on the same weights and inputs:

loop of heads == fused matrix form == mha.torch.MultiHeadAttention (both paths)
    == torch.nn.MultiheadAttention (weights copied, mask meaning converted)
    == torch.nn.functional.scaled_dot_product_attention

Chapter 12's rung, grouped-query attention with rotary positions and a key-value cache
== Hugging Face's LlamaAttention == F.scaled_dot_product_attention(enable_gqa=True),
is in tests/test_grouped_llama.py; the NumPy face == the PyTorch face in tests/test_grouped.py.
"""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha.numpy as mn
import mha.torch as mt
from conftest import (CPU_AND_CUDA, TORCH_DTYPE, assert_close, assert_close_on, heads_from_columns, load_params,
                      make_mask, random_attention_params)

# (batch shape, T_q, T_k, d_model, n_heads, cross-attention?)
SHAPES = [
    ((2,), 5, 5, 12, 3, False),  # odd d_head = 4? no: 12 / 3 = 4; see next rows for odd
    ((2,), 5, 5, 15, 3, False),  # odd d_head = 5
    ((), 4, 4, 6, 2, False),  # no batch dimension; the 6 / 2 = 3 worked example
    ((3,), 1, 1, 8, 1, False),  # T = 1, h = 1
    ((2,), 3, 6, 8, 2, True),  # cross-attention, T_q != T_k
    ((2,), 6, 3, 9, 3, True),  # cross-attention, more queries than keys
]
MASKS = ["none", "padding", "causal", "both", "empty_row"]
DTYPES = [np.float32, np.float64]
CASES = [
    pytest.param(s, m, dt, id=f"{s[0]}-Tq{s[1]}-Tk{s[2]}-d{s[3]}-h{s[4]}-{m}-{dt.__name__}")
    for s, m, dt in itertools.product(SHAPES, MASKS, DTYPES)
]


def make_case(shape, mask_kind, dtype, seed=0):
    batch, T_q, T_k, d, h, cross = shape
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((*batch, T_q, d)).astype(dtype)
    context = rng.standard_normal((*batch, T_k, d)).astype(dtype) if cross else None
    if not cross:
        T_k = T_q
    mask = make_mask(mask_kind, batch, T_q, T_k, rng)
    return X, context, mask, rng


def to_torch(a, dtype, device="cpu"):
    if a is None:
        return None
    return torch.as_tensor(a, dtype=None if a.dtype == bool else TORCH_DTYPE[dtype], device=device)


@pytest.mark.parametrize("shape,mask_kind,dtype", CASES)
def test_loop_equals_fused(shape, mask_kind, dtype):
    X, context, mask, rng = make_case(shape, mask_kind, dtype)
    params = random_attention_params(rng, shape[3], dtype, bias=False)
    heads = heads_from_columns(params, shape[4])
    loop_out, loop_w = mn.multihead_attention_loop(X, heads, params["W_o"], context=context, mask=mask)
    out, w = mn.multihead_attention(X, n_heads=shape[4], context=context, mask=mask, **params)
    assert out.dtype == dtype and w.shape == loop_w.shape
    assert_close(out, loop_out, dtype)
    assert_close(w, loop_w, dtype)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("shape,mask_kind,dtype", CASES)
def test_numpy_equals_torch_module_both_paths(shape, mask_kind, dtype, device):
    """mha.torch.MultiHeadAttention, on the CPU and on a GPU, equals mha.numpy on both of its paths."""
    X, context, mask, rng = make_case(shape, mask_kind, dtype)
    module = mt.MultiHeadAttention(shape[3], shape[4], dtype=TORCH_DTYPE[dtype]).to(device)
    params = module.numpy_params()
    expected, expected_w = mn.multihead_attention(X, n_heads=shape[4], context=context, mask=mask, **params)
    x, ctx, m = (to_torch(a, dtype, device) for a in (X, context, mask))
    fast = module(x, ctx, m)
    explicit, weights = module(x, ctx, m, return_weights=True)
    assert fast.dtype == TORCH_DTYPE[dtype] and fast.device.type == device
    assert_close_on(device, fast, expected, dtype, "fused-kernel path")
    assert_close_on(device, explicit, expected, dtype, "explicit path")
    assert_close_on(device, weights, expected_w, dtype, "weights")


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("shape,mask_kind,dtype", CASES)
def test_torch_module_equals_nn_multihead_attention(shape, mask_kind, dtype, device):
    """On the CPU and on a GPU, our module with nn.MultiheadAttention's weights gives its outputs
    and weights, except that a query with nothing to attend to gets zeros where it gets NaN."""
    X, context, mask, rng = make_case(shape, mask_kind, dtype)
    batch, T_q, T_k, d, h, cross = shape
    theirs = torch.nn.MultiheadAttention(d, h, batch_first=True, dtype=TORCH_DTYPE[dtype]).to(device)
    ours = mt.MultiHeadAttention.from_torch(theirs)
    x, ctx, m = (to_torch(a, dtype, device) for a in (X, context, mask))
    source = x if ctx is None else ctx
    if not batch:  # nn.MultiheadAttention takes (T, d) unbatched input only with 2-D masks
        x, source = x[None], source[None]
        m = None if m is None else m.reshape(m.shape[-2:])
    # nn.MultiheadAttention: True means "may NOT attend", and a 3-D mask is (B * h, T_q, T_k).
    blocked = None
    if m is not None:
        full = m.expand(x.shape[0], h, x.shape[1], source.shape[1])
        blocked = ~full.reshape(-1, x.shape[1], source.shape[1])
    their_out, their_w = theirs(x, source, source, attn_mask=blocked, average_attn_weights=False)
    our_out, our_w = ours(x, None if ctx is None else source, None if m is None else full,
                          return_weights=True)
    empty = torch.zeros(their_w.shape[:-1], dtype=torch.bool, device=device) if m is None else ~full.any(-1)
    live = ~empty  # rows with something to attend to
    assert our_out.device.type == device
    assert_close_on(device, our_out[live.any(1)], their_out[live.any(1)], dtype)
    assert_close_on(device, our_w[live], their_w[live], dtype)
    if empty.any():  # PyTorch's layer gives NaN there; ours gives zeros
        assert torch.isnan(their_w[empty]).all()
        assert (our_w[empty] == 0).all()


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("shape,mask_kind,dtype", CASES)
def test_explicit_sdpa_equals_torch_fused_kernel(shape, mask_kind, dtype, device):
    """The explicit form, NumPy's and ours on the CPU or a GPU, equals PyTorch's kernel there."""
    X, context, mask, rng = make_case(shape, mask_kind, dtype)
    h = shape[4]
    source = X if context is None else context
    Q, K, V = (mn.split_heads(a, h) for a in (X, source, source))  # (..., h, T, d_head)
    out, _ = mn.scaled_dot_product_attention(Q, K, V, mask)
    q, k, v, m = (to_torch(a, dtype, device) for a in (Q, K, V, mask))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert expected.device.type == device
    assert_close_on(device, out, expected, dtype)
    ours, _ = mt.scaled_dot_product_attention(q, k, v, m)
    assert_close_on(device, ours, expected, dtype)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_causal_mask_equals_is_causal_kernel(rng, device):
    """On the CPU and on a GPU, causal_mask gives what the kernel's is_causal=True gives."""
    Q, K, V = (torch.as_tensor(rng.standard_normal((2, 3, 7, 4)), device=device) for _ in range(3))
    expected = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    ours, weights = mt.scaled_dot_product_attention(Q, K, V, mt.causal_mask(7, device=device))
    assert ours.device.type == device
    assert_close_on(device, ours, expected)
    assert (weights.triu(1) == 0).all()


def test_from_torch_keeps_bias_choice_and_training_mode():
    theirs = torch.nn.MultiheadAttention(8, 2, bias=False).eval()
    ours = mt.MultiHeadAttention.from_torch(theirs)
    assert ours.W_q.bias is None and not ours.training
    assert ours.numpy_params()["b_q"] is None


def test_load_params_round_trip(rng):
    params = random_attention_params(rng, 6)
    module = load_params(mt.MultiHeadAttention(6, 2, dtype=torch.float64), params)
    for name, value in module.numpy_params().items():
        assert_close(value, params[name], what=name)
