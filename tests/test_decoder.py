"""DecoderBlock and Decoder against torch.nn.TransformerDecoderLayer / TransformerDecoder,
and the NumPy decoder against the PyTorch one. The causal property is in
test_decoder_causal.py."""

import itertools

import numpy as np
import pytest
import torch
from torch import nn

import mha.numpy as mn
import mha.torch as mt
from mha.torch import Decoder, DecoderBlock
from conftest import (CPU_AND_CUDA, DEVICES, TORCH_DTYPE, assert_close, assert_close_on, assert_matches_cpu,
                      on_device, random_decoder_params)

OPTIONS = [
    pytest.param(norm_first, activation, dtype, id=f"{'pre' if norm_first else 'post'}-{activation}-{dtype.__name__}")
    for norm_first, activation, dtype in itertools.product([False, True], ["relu", "gelu"], [np.float32, np.float64])
]
D_MODEL, N_HEADS, D_FF, T, S = 12, 3, 20, 5, 7
TARGET_LENGTHS, SOURCE_LENGTHS = [5, 3, 1], [7, 2, 4]


def torch_layer(norm_first, activation, dtype, eps=1e-5):
    layer = nn.TransformerDecoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first, layer_norm_eps=eps,
                                       dtype=TORCH_DTYPE[dtype])
    with torch.no_grad():  # LayerNorm starts at gamma=1, beta=0: make it a real test
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer


def padded_pair(dtype, seed=0):
    """A target batch (B, T, d) and a source batch (B, S, d), both padded, with both masks' forms."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((len(TARGET_LENGTHS), T, D_MODEL)).astype(dtype)
    memory = rng.standard_normal((len(SOURCE_LENGTHS), S, D_MODEL)).astype(dtype)
    ours = {"self_mask": mn.padding_mask(TARGET_LENGTHS, T), "memory_mask": mn.padding_mask(SOURCE_LENGTHS, S)}
    theirs = {"tgt_key_padding_mask": ~torch.as_tensor(ours["self_mask"][:, 0, 0]),  # (B, T), True = padding
              "memory_key_padding_mask": ~torch.as_tensor(ours["memory_mask"][:, 0, 0]),
              "tgt_mask": ~mt.causal_mask(T)}  # (T, T), True = blocked
    return X, memory, ours, theirs


def as_tensors(masks, device="cpu"):
    return {k: torch.as_tensor(v, device=device) for k, v in masks.items()}


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("norm_first,activation,dtype", OPTIONS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_decoder_block_equals_transformer_decoder_layer(norm_first, activation, dtype, mode, device):
    """On the CPU and on a GPU: our block with PyTorch's weights gives PyTorch's output on both
    paths, and the NumPy block gives the same output and weights."""
    layer = torch_layer(norm_first, activation, dtype, eps=1e-4).to(device)
    layer.train(mode == "train")
    block = DecoderBlock.from_torch(layer)
    assert block.training == (mode == "train") and block.norm_3.eps == 1e-4
    X, memory, masks, torch_masks = padded_pair(dtype)
    x, m = torch.as_tensor(X, device=device), torch.as_tensor(memory, device=device)
    with torch.no_grad():
        expected = layer(x, m, **as_tensors(torch_masks, device))
        out = block(x, m, causal=True, **as_tensors(masks, device))
        explicit, (self_w, cross_w) = block(x, m, causal=True, return_weights=True, **as_tensors(masks, device))
    assert out.device.type == device
    assert_close_on(device, out, expected, dtype)
    assert_close_on(device, explicit, expected, dtype, what="the explicit path (return_weights=True)")
    numpy_out, (np_self_w, np_cross_w) = mn.decoder_block(
        X, memory, N_HEADS, causal=True, norm_first=norm_first, eps=1e-4, activation=activation,
        **masks, **block.numpy_params())
    assert numpy_out.dtype == dtype
    assert_close_on(device, numpy_out, out, dtype)
    assert_close_on(device, np_self_w, self_w, dtype)
    assert_close_on(device, np_cross_w, cross_w, dtype)
    assert np_self_w.shape == (3, N_HEADS, T, T) and np_cross_w.shape == (3, N_HEADS, T, S)
    assert np.all(np.triu(np_self_w, k=1) == 0)  # no weight on a later target token
    assert np.all(np_self_w[1, ..., 3:] == 0)  # target 1 has 3 real tokens
    assert np.all(np_cross_w[1, ..., 2:] == 0)  # source 1 has 2 real tokens
    assert_close(np_cross_w.sum(-1), np.ones((3, N_HEADS, T)), dtype)


@pytest.mark.parametrize("norm_first,activation,dtype", OPTIONS)
def test_decoder_equals_transformer_decoder(norm_first, activation, dtype):
    layer = torch_layer(norm_first, activation, dtype)
    stack = nn.TransformerDecoder(layer, num_layers=3)
    with torch.no_grad():  # the copies start identical: make each layer its own
        for p in stack.parameters():
            p.add_(0.05 * torch.randn_like(p))
    decoder = Decoder.from_torch(stack)
    X, memory, masks, torch_masks = padded_pair(dtype, seed=1)
    x, m = torch.as_tensor(X), torch.as_tensor(memory)
    with torch.no_grad():
        expected = stack(x, m, **torch_masks)
        out, weights = decoder(x, m, causal=True, return_weights=True, **as_tensors(masks))
        assert_close(decoder(x, m, causal=True, **as_tensors(masks)), expected, dtype)
    assert_close(out, expected, dtype)
    assert len(weights) == 3 and weights[2][1].shape == (3, N_HEADS, T, S)
    numpy_out, numpy_weights = mn.decoder(X, memory, decoder.numpy_params(), N_HEADS, causal=True,
                                          norm_first=norm_first, activation=activation, **masks)
    assert_close(numpy_out, out, dtype)
    for (np_self, np_cross), (t_self, t_cross) in zip(numpy_weights, weights):
        assert_close(np_self, t_self, dtype)
        assert_close(np_cross, t_cross, dtype)


def test_causal_flag_equals_an_explicit_causal_mask_and_torch_is_causal():
    layer = torch_layer(False, "relu", np.float64)
    block = DecoderBlock.from_torch(layer)
    x, m = torch.randn(2, T, D_MODEL, dtype=torch.float64), torch.randn(2, S, D_MODEL, dtype=torch.float64)
    causal = mt.causal_mask(T)
    with torch.no_grad():
        flag = block(x, m, causal=True)
        assert_close(block(x, m, self_mask=causal), flag)
        assert_close(layer(x, m, tgt_mask=~causal, tgt_is_causal=True), flag)
        assert (block(x, m) - flag).abs().max() > 1e-3  # the mask matters


def test_an_arbitrary_memory_mask_matches_torch_memory_mask():
    """memory_mask may be a full (T, S) grid, not only padding: PyTorch's memory_mask, negated."""
    layer = torch_layer(True, "gelu", np.float64)
    block = DecoderBlock.from_torch(layer)
    x, m = torch.randn(2, T, D_MODEL, dtype=torch.float64), torch.randn(2, S, D_MODEL, dtype=torch.float64)
    allowed = torch.rand(T, S, generator=torch.Generator().manual_seed(3)) < 0.5
    allowed[:, 0] = True  # every query keeps at least one source token
    with torch.no_grad():
        out, (_, cross) = block(x, m, memory_mask=allowed, return_weights=True)
        assert_close(out, layer(x, m, memory_mask=~allowed))
    assert torch.all(cross[..., ~allowed] == 0)


def test_unbatched_memory_broadcasts_over_the_target_batch():
    block = DecoderBlock(8, 2, 16, dtype=torch.float64)
    x, m = torch.randn(3, 4, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    with torch.no_grad():
        assert_close(block(x, m, causal=True), block(x, m.expand(3, 6, 8), causal=True))
    params = block.numpy_params()
    out, (_, cross) = mn.decoder_block(x.numpy(), m.numpy(), 2, causal=True, **params)
    assert cross.shape == (3, 2, 4, 6)
    assert_close(out, block(x, m, causal=True))


def test_a_source_with_no_real_token_gives_zero_cross_weights_not_nan():
    block = DecoderBlock(8, 2, 16, dtype=torch.float64)
    x, m = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    memory_mask = mt.padding_mask([5, 0], 5)
    with torch.no_grad():
        fast = block(x, m, memory_mask=memory_mask, causal=True)
        explicit, (_, cross) = block(x, m, memory_mask=memory_mask, causal=True, return_weights=True)
    assert torch.isfinite(fast).all() and torch.all(cross[1] == 0)
    assert_close(fast, explicit)
    numpy_out, _ = mn.decoder_block(x.numpy(), m.numpy(), 2, memory_mask=memory_mask.numpy(), causal=True,
                                    **block.numpy_params())
    assert_close(numpy_out, fast)


def test_decoder_block_without_bias_matches_torch():
    layer = nn.TransformerDecoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, batch_first=True,
                                       bias=False, dtype=torch.float64)
    block = DecoderBlock.from_torch(layer)
    params = block.numpy_params()
    assert params["self_b_q"] is None and params["cross_b_o"] is None and params["beta_3"] is None
    rng = np.random.default_rng(2)
    X, memory = rng.standard_normal((2, T, D_MODEL)), rng.standard_normal((2, S, D_MODEL))
    with torch.no_grad():
        expected = layer(torch.as_tensor(X), torch.as_tensor(memory), tgt_mask=~mt.causal_mask(T))
    assert_close(mn.decoder_block(X, memory, N_HEADS, causal=True, **params)[0], expected)


# Bad input, gradients, devices, dropout ---------------------------------------------------

@pytest.mark.parametrize("call,error,message", [
    (lambda X, M, p: mn.decoder_block(X, M[..., :5], 2, **p), ValueError,
     "widths of X and memory must match: X.shape[-1]=6 but memory.shape[-1]=5"),
    (lambda X, M, p: mn.decoder_block(X, M, 2, self_mask=np.ones((3, 3), bool), **p), ValueError,
     "self_mask: mask has shape (3, 3) but scores have shape (2, 2, 4, 4)"),
    (lambda X, M, p: mn.decoder_block(X, M, 2, memory_mask=np.ones((4, 5), int), **p), TypeError,
     "memory_mask: mask must be boolean (True = may attend), got dtype int64"),
    (lambda X, M, p: mn.decoder_block(X, M, 2, memory_mask=np.ones((4, 4), bool), **p), ValueError,
     "memory_mask: mask has shape (4, 4) but scores have shape (2, 2, 4, 5)"),
    (lambda X, M, p: mn.decoder_block(X, M[:1].repeat(3, 0), 2, **p), ValueError,
     "batch dimensions of X (2,) and memory (3,) do not broadcast"),
    (lambda X, M, p: mn.decoder_block(X, M, 4, **p), ValueError, "d_model=6 is not divisible by n_heads=4"),
    (lambda X, M, p: mn.decoder_block(X, M, 2, activation="tanh", **p), ValueError,
     'activation must be "relu" or "gelu"'),
    (lambda X, M, p: mn.decoder_block(X, M, 2, W_q=p["self_W_q"], **p), TypeError, "unknown: ['W_q']"),
    (lambda X, M, p: mn.decoder_block(X, M, 2, **{k: v for k, v in p.items() if k != "cross_W_k"}),
     TypeError, "missing: ['cross_W_k']"),
    (lambda X, M, p: mn.decoder(X, M, [], 2), ValueError, "layers must hold at least one block"),
])
def test_numpy_bad_input_is_named(call, error, message):
    rng = np.random.default_rng(0)
    params = random_decoder_params(rng, 6, 12)
    X, memory = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 5, 6))
    with pytest.raises(error) as info:
        call(X, memory, params)
    assert message in str(info.value)


@pytest.mark.parametrize("call,error,message", [
    (lambda b, x, m: b(x, m[..., :6]), ValueError, "memory has shape (2, 5, 6), so width 6, but the decoder block"),
    (lambda b, x, m: b(x, m, self_mask=torch.ones(3, 3, dtype=torch.bool)), ValueError,
     "self_mask: mask has shape (3, 3) but scores have shape (2, 2, 4, 4)"),
    (lambda b, x, m: b(x, m, memory_mask=np.ones((4, 5), bool)), TypeError,
     "memory_mask must be a torch.Tensor of booleans, got ndarray"),
    (lambda b, x, m: b(x, m, memory_mask=torch.ones(4, 5)), TypeError, "memory_mask: mask must be boolean"),
    (lambda b, x, m: b(x, m[:1].expand(3, 5, 8)), ValueError, "batch dimensions of x (2,) and memory (3,)"),
    (lambda b, x, m: b(x, m.numpy()), TypeError, "memory must be a torch.Tensor, got ndarray"),
    (lambda b, x, m: DecoderBlock.from_torch(nn.TransformerEncoderLayer(8, 2)), TypeError,
     "expected a torch.nn.TransformerDecoderLayer, got TransformerEncoderLayer"),
    (lambda b, x, m: DecoderBlock.from_torch(nn.TransformerDecoderLayer(8, 2, activation=torch.tanh)),
     ValueError, "only relu and gelu activations can be copied"),
    (lambda b, x, m: Decoder.from_torch(nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2), 2,
                                                              norm=nn.LayerNorm(8))),
     ValueError, "final norm cannot be copied"),
    (lambda b, x, m: DecoderBlock(8, 3, 16), ValueError, "d_model=8 is not divisible by n_heads=3"),
    (lambda b, x, m: DecoderBlock(8, 2, 16, activation="swish"), ValueError, "activation must be"),
])
def test_torch_bad_input_is_named(call, error, message):
    block = DecoderBlock(8, 2, 16)
    x, m = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    with pytest.raises(error) as info:
        call(block, x, m)
    assert message in str(info.value)


def test_gradcheck_float64():
    block = DecoderBlock(4, 2, 6, norm_first=True, dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    m = torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)
    memory_mask = mt.padding_mask([2, 1], 2)

    def run(x, m):
        return block(x, m, memory_mask=memory_mask, causal=True)

    assert torch.autograd.gradcheck(run, (x, m), eps=1e-6, atol=1e-5)
    assert m.grad is None  # gradcheck does not leave gradients behind
    run(x, m).sum().backward()
    assert block.cross_attention.W_k.weight.grad.abs().sum() > 0  # the memory reaches the keys


@pytest.mark.parametrize("device", DEVICES)
def test_runs_on_any_device(device):
    """No tensor is made on a fixed device: the causal mask follows the input to `meta`;
    on a GPU the output and every block's weights equal the CPU's."""
    decoder = Decoder(2, 8, 2, 16, norm_first=True, dtype=torch.float64)
    x, m = torch.randn(3, 4, 8, dtype=torch.float64), torch.randn(3, 6, 8, dtype=torch.float64)
    self_mask = mt.padding_mask(torch.tensor([4, 2, 1]), 4)
    memory_mask = mt.padding_mask(torch.tensor([6, 5, 3]), 6)
    on_cpu = (x, m, self_mask, memory_mask)
    there = [on_device(a, device) for a in on_cpu]
    decoder_there = on_device(decoder, device)
    with torch.no_grad():
        assert_matches_cpu(decoder_there(*there, causal=True), decoder(*on_cpu, causal=True), device, "output")
        out, weights = decoder_there(*there, causal=True, return_weights=True)
        assert_matches_cpu((out, weights), decoder(*on_cpu, causal=True, return_weights=True), device,
                           "(output, [(self weights, cross weights) per block])")
    self_w, cross_w = weights[-1]
    assert self_w.shape == (3, 2, 4, 4) and cross_w.shape == (3, 2, 4, 6)


def test_dropout_is_active_only_in_training():
    block = DecoderBlock(8, 2, 16, dropout=0.5, dtype=torch.float64)
    x, m = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    block.train()
    assert not torch.allclose(block(x, m, causal=True), block(x, m, causal=True))
    block.eval()
    assert torch.equal(block(x, m, causal=True), block(x, m, causal=True))


def test_post_norm_output_is_normalised_and_pre_norm_is_not():
    x, m = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(3, 4, 8, dtype=torch.float64)
    post = DecoderBlock(8, 2, 16, eps=1e-12, dtype=torch.float64)(x, m, causal=True).detach()
    assert_close(post.mean(-1), torch.zeros(3, 5), what="LayerNorm last: zero mean per token")
    assert_close(post.var(-1, unbiased=False), torch.full((3, 5), 1.0), what="unit variance")
    pre = DecoderBlock(8, 2, 16, norm_first=True, dtype=torch.float64)(x, m, causal=True).detach()
    assert pre.mean(-1).abs().max() > 1e-3
