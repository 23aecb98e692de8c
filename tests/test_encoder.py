"""EncoderBlock and Encoder against torch.nn.TransformerEncoderLayer / TransformerEncoder,
and the NumPy encoder against the PyTorch one."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha.numpy as mn
import mha.torch as mt
from conftest import CPU_AND_CUDA, TORCH_DTYPE, assert_close, assert_close_on

OPTIONS = [
    pytest.param(norm_first, activation, dtype, id=f"{'pre' if norm_first else 'post'}-{activation}-{dtype.__name__}")
    for norm_first, activation, dtype in itertools.product([False, True], ["relu", "gelu"], [np.float32, np.float64])
]
D_MODEL, N_HEADS, D_FF, T = 12, 3, 20, 6
LENGTHS = [6, 4, 1]


def torch_layer(norm_first, activation, dtype, eps=1e-5):
    layer = nn.TransformerEncoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first, layer_norm_eps=eps,
                                       dtype=TORCH_DTYPE[dtype])
    with torch.no_grad():  # LayerNorm starts at gamma=1, beta=0: make it a real test
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer


def padded_batch(dtype, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((len(LENGTHS), T, D_MODEL)).astype(dtype)
    ours = mn.padding_mask(LENGTHS, T)  # (B, 1, 1, T), True at real keys
    theirs = ~torch.as_tensor(ours[:, 0, 0])  # (B, T), True at padding
    return X, ours, theirs


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("norm_first,activation,dtype", OPTIONS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_encoder_block_equals_transformer_encoder_layer(norm_first, activation, dtype, mode, device):
    """On the CPU and on a GPU: our block with PyTorch's weights gives PyTorch's output at the
    real tokens, and the NumPy block gives ours."""
    layer = torch_layer(norm_first, activation, dtype, eps=1e-4).to(device)
    layer.train(mode == "train")
    block = mt.EncoderBlock.from_torch(layer)
    assert block.training == (mode == "train") and block.norm_1.eps == 1e-4
    X, mask, key_padding = padded_batch(dtype)
    x = torch.as_tensor(X, device=device)
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=key_padding.to(device))
        out = block(x, torch.as_tensor(mask, device=device))
    assert out.device.type == device
    real = torch.as_tensor(mask[:, 0, 0], device=device)  # PyTorch's eval fast path may differ at padding
    assert_close_on(device, out[real], expected[real], dtype)
    numpy_out, weights = mn.encoder_block(X, N_HEADS, mask=mask, norm_first=norm_first, eps=1e-4,
                                          activation=activation, **block.numpy_params())
    assert_close_on(device, numpy_out, out, dtype)
    assert weights.shape == (len(LENGTHS), N_HEADS, T, T)
    assert np.all(weights[2, :, :, 1:] == 0)  # sequence 2 has one real key


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("norm_first,activation,dtype", OPTIONS)
def test_encoder_equals_transformer_encoder(norm_first, activation, dtype, device):
    """On the CPU and on a GPU: a stack of three blocks equals PyTorch's, and the NumPy stack
    gives the same output and weights."""
    layer = torch_layer(norm_first, activation, dtype)
    stack = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
    with torch.no_grad():  # the copies start identical: make each layer its own
        for p in stack.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stack = stack.to(device)
    encoder = mt.Encoder.from_torch(stack)
    X, mask, key_padding = padded_batch(dtype, seed=1)
    x = torch.as_tensor(X, device=device)
    with torch.no_grad():
        expected = stack(x, src_key_padding_mask=key_padding.to(device))
        out, weights = encoder(x, torch.as_tensor(mask, device=device), return_weights=True)
    assert out.device.type == device
    assert_close_on(device, out, expected, dtype)
    assert len(weights) == 3 and weights[0].shape == (3, N_HEADS, T, T)
    numpy_out, numpy_weights = mn.encoder(X, encoder.numpy_params(), N_HEADS, mask=mask,
                                          norm_first=norm_first, activation=activation)
    assert_close_on(device, numpy_out, out, dtype)
    for w_np, w_t in zip(numpy_weights, weights):
        assert_close_on(device, w_np, w_t, dtype)


def test_encoder_with_causal_mask_matches_src_mask():
    layer = torch_layer(False, "relu", np.float64)
    block = mt.EncoderBlock.from_torch(layer)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    causal = mt.causal_mask(T)
    with torch.no_grad():
        assert_close(block(x, causal), layer(x, src_mask=~causal))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_causal_block_equals_the_layer_with_is_causal(norm_first, mode):
    """causal=True is nn.TransformerEncoderLayer's is_causal with its causal mask, on every path
    of ours (fused kernel, weights asked for), and the NumPy block with causal=True gives the same."""
    layer = torch_layer(norm_first, "gelu", np.float64).train(mode == "train")
    block = mt.EncoderBlock.from_torch(layer)
    X, _, _ = padded_batch(np.float64, seed=3)
    x = torch.as_tensor(X)
    with torch.no_grad():
        expected = layer(x, src_mask=nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype),
                         is_causal=True)
        fast = block(x, causal=True)
        out, weights = block(x, causal=True, return_weights=True)
    assert_close(fast, expected)
    assert_close(out, expected)
    assert torch.all(weights.triu(diagonal=1) == 0)  # no query attends to a later key
    numpy_out, numpy_weights = mn.encoder_block(X, N_HEADS, causal=True, norm_first=norm_first,
                                                activation="gelu", **block.numpy_params())
    assert_close(numpy_out, expected)
    assert_close(numpy_weights, weights)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_causal_is_the_causal_mask_combined_with_the_given_one(norm_first):
    """causal=True with a padding mask equals the mask padding & causal_mask(T), given explicitly,
    in both faces, with and without the weights."""
    block = mt.EncoderBlock.from_torch(torch_layer(norm_first, "relu", np.float64)).eval()
    X, padding, _ = padded_batch(np.float64, seed=4)
    x, mask = torch.as_tensor(X), torch.as_tensor(padding)
    both = mask & mt.causal_mask(T)  # (B, 1, T, T)
    with torch.no_grad():
        expected, expected_weights = block(x, both, return_weights=True)
        assert_close(block(x, mask, causal=True), expected)
        out, weights = block(x, mask, return_weights=True, causal=True)
    assert_close(out, expected)
    assert torch.equal(weights == 0, expected_weights == 0) and torch.any(weights == 0)
    params = dict(norm_first=norm_first, **block.numpy_params())
    numpy_out, numpy_weights = mn.encoder_block(X, N_HEADS, mask=padding, causal=True, **params)
    numpy_expected, _ = mn.encoder_block(X, N_HEADS, mask=both.numpy(), **params)
    assert_close(numpy_out, numpy_expected)
    assert_close(numpy_out, expected)
    assert_close(numpy_weights, weights)


def test_causal_stack_equals_transformer_encoder_with_is_causal():
    layer = torch_layer(True, "relu", np.float64)
    stack = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(0.05 * torch.randn_like(p))
    encoder = mt.Encoder.from_torch(stack)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        expected = stack(x, mask=nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype), is_causal=True)
        out, weights = encoder(x, return_weights=True, causal=True)
        assert_close(encoder(x, causal=True), expected)
    assert_close(out, expected)
    assert all(torch.all(w.triu(diagonal=1) == 0) for w in weights)
    numpy_out, _ = mn.encoder(x.numpy(), encoder.numpy_params(), N_HEADS, causal=True, norm_first=True)
    assert_close(numpy_out, expected)


def test_causal_without_a_mask_lets_the_kernel_skip_the_blocked_half(monkeypatch):
    """No mask and no weights: the block hands is_causal=True to PyTorch's kernel, no mask tensor."""
    calls = []
    kernel = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    block = mt.EncoderBlock(D_MODEL, N_HEADS, D_FF, dtype=torch.float64).eval()
    with torch.no_grad():
        block(torch.randn(2, T, D_MODEL, dtype=torch.float64), causal=True)
    assert [(c["is_causal"], c["attn_mask"]) for c in calls] == [(True, None)]


@pytest.mark.parametrize("causal", [1, "yes", None, torch.tensor(True), np.ones((T, T), dtype=bool)],
                         ids=["1", "'yes'", "None", "a tensor", "a mask"])
def test_causal_must_be_true_or_false(causal):
    block = mt.EncoderBlock(D_MODEL, N_HEADS, D_FF, dtype=torch.float64)
    encoder = mt.Encoder(2, D_MODEL, N_HEADS, D_FF, dtype=torch.float64)
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    message = "causal must be True or False, got"
    for run in (lambda: block(x, causal=causal), lambda: encoder(x, causal=causal),
                lambda: mn.encoder_block(x.numpy(), N_HEADS, causal=causal, **block.numpy_params()),
                lambda: mn.encoder(x.numpy(), encoder.numpy_params(), N_HEADS, causal=causal)):
        with pytest.raises(TypeError, match=message):
            run()


def test_encoder_block_without_bias_matches_torch():
    layer = nn.TransformerEncoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, batch_first=True,
                                       bias=False, dtype=torch.float64)
    block = mt.EncoderBlock.from_torch(layer)
    params = block.numpy_params()
    assert params["b_q"] is None and params["beta_1"] is None and params["b_1"] is None
    X = np.random.default_rng(2).standard_normal((2, T, D_MODEL))
    with torch.no_grad():
        expected = layer(torch.as_tensor(X))
    assert_close(mn.encoder_block(X, N_HEADS, **params)[0], expected)


def test_dropout_is_active_only_in_training():
    block = mt.EncoderBlock(8, 2, 16, dropout=0.5, dtype=torch.float64)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    block.train()
    assert not torch.allclose(block(x), block(x))
    block.eval()
    assert torch.equal(block(x), block(x))


def test_encoder_block_post_norm_output_is_normalised():
    block = mt.EncoderBlock(8, 2, 16, eps=1e-12, dtype=torch.float64)
    out = block(torch.randn(3, 5, 8, dtype=torch.float64)).detach()
    assert_close(out.mean(-1), torch.zeros(3, 5), what="LayerNorm last: zero mean per token")
    assert_close(out.var(-1, unbiased=False), torch.full((3, 5), 1.0), what="unit variance")


ACTIVATIONS = [  # what PyTorch's layers accept, and what our copy must compute
    ("relu", "relu"), ("gelu", "gelu"), (F.relu, "relu"), (F.gelu, "gelu"), (nn.ReLU(), "relu"),
    (nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"),
]


@pytest.mark.parametrize("layer_type", [nn.TransformerEncoderLayer, nn.TransformerDecoderLayer])
@pytest.mark.parametrize("activation,name", ACTIVATIONS,
                         ids=["'relu'", "'gelu'", "F.relu", "F.gelu", "nn.ReLU", "nn.GELU", "nn.GELU-tanh"])
def test_every_activation_is_copied_exactly(layer_type, activation, name):
    """The copy computes the layer's own function, in training mode with grad enabled too
    (where PyTorch's fast path is off), and the NumPy block with its parameters agrees."""
    torch.manual_seed(0)
    layer = layer_type(8, 2, 16, dropout=0.0, activation=activation, batch_first=True, dtype=torch.float64)
    ours = (mt.EncoderBlock if layer_type is nn.TransformerEncoderLayer else mt.DecoderBlock).from_torch(layer)
    assert ours.activation == name
    x, memory = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    args = (x,) if layer_type is nn.TransformerEncoderLayer else (x, memory)
    assert_close(ours(*args), layer(*args), np.float64)
    numpy_block = mn.encoder_block if layer_type is nn.TransformerEncoderLayer else mn.decoder_block
    out, _ = numpy_block(*[a.numpy() for a in args], 2, activation=name, **ours.numpy_params())
    assert_close(out, layer(*args), np.float64)


@pytest.mark.parametrize("activation", [F.silu, nn.SiLU(), torch.tanh, lambda x: F.gelu(x, approximate="tanh")],
                         ids=["F.silu", "nn.SiLU", "torch.tanh", "a lambda"])
def test_an_activation_that_cannot_be_copied_is_refused(activation):
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation=activation, batch_first=True)
    with pytest.raises(ValueError, match="only relu and gelu activations can be copied"):
        mt.EncoderBlock.from_torch(layer)
