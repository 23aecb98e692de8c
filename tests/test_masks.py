"""Masks of every rank that broadcasts (0-D to 4-D) give the same answer on every path:
the NumPy face, the explicit and the fused PyTorch paths, the loop of heads, chunked
attention, and the encoder and decoder blocks. The reference is the NumPy function
given the mask broadcast to its full 4-D shape (B, h, T_q, T_k)."""

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import assert_close

B, H, T_Q, T_K, D = 2, 2, 3, 4, 6
FULL = (B, H, T_Q, T_K)
SHAPES = {0: (), 1: (T_K,), 2: (T_Q, T_K), 3: (H, T_Q, T_K), 4: FULL}


def boolean(shape, seed):
    """Seed 0: all True; seed 1: all False (every row empty); otherwise random."""
    if seed < 2:
        return np.full(shape, seed == 0)
    return np.random.default_rng(seed).random(shape) < 0.6


def random_mask(rank, seed):
    """A boolean mask of that rank, for queries of length T_Q and keys of length T_K."""
    return boolean(SHAPES[rank], seed)


def square_mask(rank, seed):
    """A mask of that rank for self-attention over T_K tokens."""
    return boolean({0: (), 1: (T_K,), 2: (T_K, T_K), 3: (H, T_K, T_K), 4: (B, H, T_K, T_K)}[rank], seed)


MASKS = [pytest.param(rank, seed, id=f"{rank}-D-{['all', 'none', 'random'][min(seed, 2)]}")
         for rank in SHAPES for seed in (0, 1, 2)]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    module = mt.MultiHeadAttention(D, H, dtype=torch.float64)
    rng = np.random.default_rng(1)
    X, context = rng.standard_normal((B, T_Q, D)), rng.standard_normal((B, T_K, D))
    return module, X, context


def full(mask):
    return np.broadcast_to(mask, FULL)


@pytest.mark.parametrize("rank,seed", MASKS)
def test_attention_functions(setup, rank, seed):
    """scaled_dot_product_attention (NumPy, explicit PyTorch) and chunked attention (both faces)."""
    module, X, context = setup
    params = module.numpy_params()
    Q = mn.split_heads(X @ params["W_q"], H)  # (B, h, T_q, d_head)
    K, V = (mn.split_heads(context @ params[f"W_{n}"], H) for n in "kv")  # (B, h, T_k, d_head)
    mask = random_mask(rank, seed)
    expected, weights = mn.scaled_dot_product_attention(Q, K, V, full(mask))
    q, k, v, m = (torch.as_tensor(a) for a in (Q, K, V, mask))
    for name, (out, w) in {"numpy": mn.scaled_dot_product_attention(Q, K, V, mask),
                           "torch explicit": mt.scaled_dot_product_attention(q, k, v, m)}.items():
        assert_close(out, expected, what=f"{name} output, {rank}-D mask")
        assert_close(w, weights, what=f"{name} weights, {rank}-D mask")
    assert_close(mn.chunked_attention(Q, K, V, mask, chunk=3), expected, what="numpy chunked")
    assert_close(mt.chunked_attention(q, k, v, m, chunk=3), expected, what="torch chunked")


@pytest.mark.parametrize("rank,seed", MASKS)
def test_multihead_attention_on_every_path(setup, rank, seed):
    """NumPy fused and loop, and the module's fused kernel, its explicit path and the loop module."""
    module, X, context = setup
    params, mask = module.numpy_params(), random_mask(rank, seed)
    expected, weights = mn.multihead_attention(X, n_heads=H, context=context, mask=full(mask), **params)
    x, c, m = torch.as_tensor(X), torch.as_tensor(context), torch.as_tensor(mask)
    loop = mt.MultiHeadAttentionLoop.from_fused(mt.MultiHeadAttention(D, H, bias=False, dtype=torch.float64))
    loop_params = loop.numpy_params()
    loop_expected, _ = mn.multihead_attention_loop(X, context=context, mask=full(mask), **loop_params)
    with torch.no_grad():
        outputs = {
            "numpy fused": mn.multihead_attention(X, n_heads=H, context=context, mask=mask, **params)[0],
            "torch fused kernel": module(x, c, m),
            "torch explicit": module(x, c, m, return_weights=True)[0],
        }
        assert_close(module(x, c, m, return_weights=True)[1], weights, what=f"weights, {rank}-D mask")
        assert_close(loop(x, c, m), loop_expected, what=f"loop module, {rank}-D mask")
    assert_close(mn.multihead_attention_loop(X, context=context, mask=mask, **loop_params)[0], loop_expected,
                 what=f"numpy loop, {rank}-D mask")
    for name, out in outputs.items():
        assert_close(out, expected, what=f"{name}, {rank}-D mask")


@pytest.mark.parametrize("rank,seed", MASKS)
def test_encoder_and_decoder_blocks(rank, seed):
    """The blocks pass masks of any rank on to their attention, in both faces, against
    the NumPy block given the mask broadcast to (B, h, T, T)."""
    torch.manual_seed(2)
    encoder = mt.EncoderBlock(D, H, 8, dtype=torch.float64).eval()
    decoder = mt.DecoderBlock(D, H, 8, dtype=torch.float64).eval()
    rng = np.random.default_rng(3)
    X, memory = rng.standard_normal((B, T_K, D)), rng.standard_normal((B, T_K, D))
    mask = square_mask(rank, seed)
    four_d = np.array(np.broadcast_to(mask, (B, H, T_K, T_K)))
    x, m, mask_t = torch.as_tensor(X), torch.as_tensor(memory), torch.as_tensor(mask)
    expected, _ = mn.encoder_block(X, H, mask=four_d, **encoder.numpy_params())
    reference, _ = mn.decoder_block(X, memory, H, self_mask=four_d, memory_mask=four_d, causal=True,
                                    **decoder.numpy_params())
    assert_close(mn.encoder_block(X, H, mask=mask, **encoder.numpy_params())[0], expected, what="numpy encoder")
    assert_close(mn.decoder_block(X, memory, H, self_mask=mask, memory_mask=mask, causal=True,
                                  **decoder.numpy_params())[0], reference, what="numpy decoder")
    with torch.no_grad():
        assert_close(encoder(x, mask_t), expected, what=f"encoder block, {rank}-D mask")
        assert_close(encoder(x, mask_t, return_weights=True)[0], expected, what="encoder block, explicit")
        assert_close(decoder(x, m, mask_t, mask_t, causal=True), reference, what=f"decoder block, {rank}-D mask")
