"""Chunked attention (online softmax) and the causal fast path of MultiHeadAttention.

chunked_attention must equal scaled_dot_product_attention's output for every
mask, chunk size and dtype, never form the T_q x T_k matrix, and fail on bad
input like the other functions. MultiHeadAttention(causal=True) must equal the
explicit causal mask on both of its paths.
"""

import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mha.numpy as mn
import mha.torch as mt
from conftest import (CPU_AND_CUDA, DEVICES, TORCH_DTYPE, assert_close, assert_close_on, assert_matches_cpu,
                      make_mask, on_device)

MASKS = ["none", "padding", "causal", "both", "empty_row"]


def qkv(rng, batch, T_q, T_k, d_k=5, d_v=3, dtype=np.float64):
    Q = rng.standard_normal((*batch, T_q, d_k)).astype(dtype)
    K = rng.standard_normal((*batch, T_k, d_k)).astype(dtype)
    V = rng.standard_normal((*batch, T_k, d_v)).astype(dtype)
    return Q, K, V


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 100])  # 4 divides T_k = 8, 3 and 7 do not, 100 > T_k
@pytest.mark.parametrize("batch", [(), (2, 3)], ids=["no-batch", "B-h"])
def test_numpy_equals_scaled_dot_product_attention(rng, dtype, kind, chunk, batch):
    T_q, T_k = (6, 8) if kind != "causal" else (8, 8)
    Q, K, V = qkv(rng, batch, T_q, T_k, dtype=dtype)
    mask = make_mask(kind, batch, T_q, T_k, rng)
    expected, _ = mn.scaled_dot_product_attention(Q, K, V, mask)
    got = mn.chunked_attention(Q, K, V, mask, chunk=chunk)
    assert got.dtype == dtype and got.shape == expected.shape
    assert_close(got, expected, dtype)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("chunk", [1, 3, 8, 20])
def test_torch_equals_numpy_and_the_explicit_form(rng, dtype, kind, chunk, device):
    """On the CPU and on a GPU, the torch twin equals the explicit form there and the NumPy twin."""
    batch, T_q, T_k = (2, 2), 5, 8
    arrays = qkv(rng, batch, T_q, T_k, dtype=dtype)
    mask = make_mask(kind, batch, T_q, T_k, rng)
    Q, K, V = (torch.as_tensor(a, device=device) for a in arrays)
    mask_t = None if mask is None else torch.as_tensor(mask, device=device)
    got = mt.chunked_attention(Q, K, V, mask_t, chunk=chunk)
    assert got.dtype == TORCH_DTYPE[dtype] and got.device.type == device
    assert_close_on(device, got, mt.scaled_dot_product_attention(Q, K, V, mask_t)[0], dtype)
    assert_close_on(device, got, mn.chunked_attention(*arrays, mask, chunk=chunk), dtype)


def test_a_fully_masked_row_gives_zeros_not_nan(rng):
    Q, K, V = qkv(rng, (2,), 4, 6)
    mask = np.ones((2, 4, 6), dtype=bool)
    mask[0, 1] = False  # query 1 of sequence 0 may attend to nothing
    mask[1, :, :3] = False  # sequence 1: the whole first chunk is blocked for every query
    with np.errstate(all="raise"):  # no invalid operation hides behind the zeros
        out = mn.chunked_attention(Q, K, V, mask, chunk=3)
    assert np.isfinite(out).all()
    assert (out[0, 1] == 0).all() and np.abs(out[0, 0]).sum() > 0
    assert_close(out, mn.scaled_dot_product_attention(Q, K, V, mask)[0])
    out_t = mt.chunked_attention(*(torch.as_tensor(a) for a in (Q, K, V)), torch.as_tensor(mask), chunk=3)
    assert torch.isfinite(out_t).all() and (out_t[0, 1] == 0).all()


def test_very_negative_scores_after_a_masked_chunk():
    """A row whose first chunk is all masked and whose real scores are far below 0:
    its running maximum must stay -inf until a real key arrives (a maximum of 0 as a
    stand-in would underflow exp(score - 0) to 0 and give a zero output)."""
    Q = np.full((1, 4), 10.0)
    K = np.array([[1.0] * 4, [-50.0] * 4, [-60.0] * 4])  # scores 20, -1000, -1200: exp(-1000) underflows
    V = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    mask = np.array([[False, True, True]])
    expected, _ = mn.scaled_dot_product_attention(Q, K, V, mask)
    for fn, wrap in ((mn.chunked_attention, np.asarray), (mt.chunked_attention, torch.as_tensor)):
        got = fn(wrap(Q), wrap(K), wrap(V), wrap(mask), chunk=1)
        assert_close(got, expected)
    assert abs(expected[0, 1] - 1.0) < 1e-6  # almost all weight on key 1


def test_large_logits_do_not_overflow(rng):
    Q, K, V = qkv(rng, (), 5, 9)
    Q, K = 60 * Q, 60 * K  # scores of several hundred: exp would overflow without the maximum
    out = mn.chunked_attention(Q, K, V, chunk=2)
    assert np.isfinite(out).all()
    assert_close(out, mn.scaled_dot_product_attention(Q, K, V)[0])


def test_integers_become_float64_and_masks_broadcast(rng):
    Q, K, V = (rng.integers(-3, 4, size=(3, 4)) for _ in range(3))
    out = mn.chunked_attention(Q, K, V, np.array([True, False, True]), chunk=2)  # a (T_k,) mask
    assert out.dtype == np.float64
    assert_close(out, mn.scaled_dot_product_attention(Q, K, V, np.array([True, False, True]))[0])


def test_never_forms_the_T_by_T_matrix():
    """NumPy reports its allocations to tracemalloc: the peak stays far below T x T."""
    rng = np.random.default_rng(0)
    T, d, chunk = 2048, 16, 64
    Q, K, V = (rng.standard_normal((T, d), dtype=np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        mn.chunked_attention(Q, K, V, chunk=chunk)
        _, peak_chunked = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        mn.scaled_dot_product_attention(Q, K, V)
        _, peak_full = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    t_by_t = T * T * 4
    assert peak_full >= t_by_t  # the plain form holds at least one T x T array
    assert peak_chunked < 4 * T * chunk * 4 + 1_000_000  # a few (T, chunk) blocks, no more


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_shapes_masks_and_chunks(data):
    T_q = data.draw(st.integers(1, 9), label="T_q")
    T_k = data.draw(st.integers(1, 9), label="T_k")
    d_k = data.draw(st.integers(1, 4), label="d_k")
    chunk = data.draw(st.integers(1, 10), label="chunk")
    batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="batch"))
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    rng = np.random.default_rng(seed)
    Q, K, V = qkv(rng, batch, T_q, T_k, d_k=d_k, d_v=2)
    mask = rng.random((*batch, T_q, T_k)) < 0.7 if data.draw(st.booleans(), label="masked") else None
    expected, _ = mn.scaled_dot_product_attention(Q, K, V, mask)
    assert_close(mn.chunked_attention(Q, K, V, mask, chunk=chunk), expected)


def test_gradients_through_chunks_and_a_masked_row():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[2] = False

    def attend(q, k, v):
        return mt.chunked_attention(q, k, v, mask, chunk=3)

    assert torch.autograd.gradcheck(attend, (q, k, v))
    attend(q, k, v).sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, 2] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_twin_runs_on_any_device(device):
    """No tensor is made on a fixed device; on a GPU the output equals the CPU's,
    a query with nothing to attend to included."""
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 6)
    mask = torch.rand(5, 7) < 0.6
    mask[2] = False  # query 2 may attend to nothing
    on_cpu = mt.chunked_attention(q, k, v, mask, chunk=3)
    got = mt.chunked_attention(*(on_device(t, device) for t in (q, k, v, mask)), chunk=3)
    assert_matches_cpu(got, on_cpu, device)
    assert on_cpu.shape == (2, 3, 5, 6) and (on_cpu[..., 2, :] == 0).all()


@pytest.mark.parametrize("fn,wrap", [(mn.chunked_attention, np.asarray), (mt.chunked_attention, torch.as_tensor)],
                         ids=["numpy", "torch"])
@pytest.mark.parametrize("change,error,message", [
    (dict(chunk=0), ValueError, "chunk must be at least 1, got chunk=0"),
    (dict(chunk=2.5), TypeError, "chunk must be an integer, got float 2.5"),
    (dict(chunk=True), TypeError, "chunk must be an integer, got bool True"),
    (dict(mask=np.ones((4, 4), dtype=bool)), ValueError, r"mask has shape \(4, 4\) but scores have shape \(3, 5\)"),
    (dict(mask=np.ones((3, 5), dtype=int)), TypeError, "mask must be boolean"),
    (dict(K=np.zeros((5, 2))), ValueError, r"query and key widths must match: Q.shape\[-1\]=4 but K.shape\[-1\]=2"),
    (dict(V=np.zeros((6, 2))), ValueError, "numbers of keys and values must match"),
    (dict(Q=np.zeros(4)), ValueError, "Q must have at least 2 dimensions"),
])
def test_bad_input_is_named(fn, wrap, change, error, message):
    args = dict(Q=np.zeros((3, 4)), K=np.zeros((5, 4)), V=np.zeros((5, 2)), mask=None, chunk=2)
    args.update(change)
    args = {k: wrap(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    with pytest.raises(error, match=message):
        fn(**args)


# MultiHeadAttention(causal=True) -------------------------------------------------------

def module_and_input(dtype=torch.float64, T=6, batch=(3,)):
    torch.manual_seed(0)
    module = mt.MultiHeadAttention(8, 2, dtype=dtype).eval()
    return module, torch.randn(*batch, T, 8, dtype=dtype)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_causal_fast_path_equals_the_causal_mask(dtype, device):
    """On the CPU and on a GPU, causal=True gives what the explicit causal mask gives, on both paths."""
    module, x = module_and_input(TORCH_DTYPE[dtype])
    module, x = on_device(module, device), x.to(device)
    fast = module(x, causal=True)  # F.scaled_dot_product_attention(is_causal=True)
    allowed = mt.causal_mask(6, device=device)
    explicit, weights = module(x, mask=allowed, return_weights=True)
    both, weights_causal = module(x, causal=True, return_weights=True)  # explicit path, causal honoured
    assert_close_on(device, fast, explicit, dtype, "the kernel's causal path")
    assert_close_on(device, both, explicit, dtype, "the explicit path with causal=True")
    assert torch.equal(weights_causal, weights)
    assert (weights_causal[..., ~allowed] == 0).all() and (weights_causal[..., allowed] > 0).all()
    assert (fast - module(x)).abs().max() > 1e-3  # causal does change the answer


def test_causal_combines_with_a_padding_mask_and_equals_numpy():
    module, x = module_and_input()
    padding = mt.padding_mask(torch.tensor([6, 4, 1]), 6)  # (B, 1, 1, T)
    got = module(x, mask=padding, causal=True)
    assert_close(got, module(x, mask=padding & mt.causal_mask(6)))
    expected, _ = mn.multihead_attention(x.numpy(), n_heads=2, mask=padding.numpy() & mn.causal_mask(6),
                                         **module.numpy_params())
    assert_close(got, expected)


def test_causal_cross_attention_is_aligned_top_left_like_pytorch():
    module, x = module_and_input(T=4)
    context = torch.randn(3, 7, 8, dtype=torch.float64)
    top_left = torch.ones(4, 7, dtype=torch.bool).tril()  # query i sees keys 0..i
    assert_close(module(x, context, causal=True), module(x, context, mask=top_left))
    assert_close(module(x, context, causal=True, return_weights=True)[1],
                 module(x, context, mask=top_left, return_weights=True)[1])


def test_causal_gradients_match_the_mask():
    module, x = module_and_input()
    module.train()
    grads = []
    for kwargs in (dict(causal=True), dict(mask=mt.causal_mask(6))):
        module.zero_grad()
        module(x, **kwargs).square().sum().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for a, b in zip(*grads):
        assert_close(a, b)


def test_causal_is_keyword_only():
    module, x = module_and_input()
    with pytest.raises(TypeError):
        module(x, None, None, False, True)


@pytest.mark.parametrize("device", DEVICES)
def test_causal_runs_on_any_device(device):
    """The causal mask is made on the input's device, alone and on top of a padding mask, on both
    paths; on a GPU the outputs and weights equal the CPU's."""
    module, x = module_and_input()
    padding = mt.padding_mask(torch.tensor([6, 4, 1]), 6)
    module_there, x_there, padding_there = (on_device(a, device) for a in (module, x, padding))
    with torch.no_grad():
        for kwargs in (dict(), dict(return_weights=True)):
            assert_matches_cpu(module_there(x_there, causal=True, **kwargs), module(x, causal=True, **kwargs),
                               device, f"causal alone, {kwargs}")
            assert_matches_cpu(module_there(x_there, mask=padding_there, causal=True, **kwargs),
                               module(x, mask=padding, causal=True, **kwargs), device, f"causal and padding, {kwargs}")
