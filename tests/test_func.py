"""torch.func on every public function and module of mha.torch: vmap against a plain loop,
jvp, jacrev and hessian against finite differences (float64)."""

import pytest
import torch
from torch.func import hessian, jacrev, jvp, vmap

import mha.torch as mt
from mha.experiments.heads import SumOfHeadsAttention

F64 = dict(dtype=torch.float64)
# torch.func.hessian scripts a helper with torch.jit.script, which PyTorch 2.13 deprecates: not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
T, D, H = 3, 4, 2
EPS = 1e-6


def padding_with_an_empty_row():
    mask = torch.ones(T, T, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing: zero output, and zero derivatives
    return mask


def cached(module, x):
    """A KVCache holding what `module` computed over x: a prefix to decode after."""
    cache = mt.KVCache()
    module(x, cache=cache)
    return cache


def cases():
    """name -> a function of one tensor x (T, D) that returns a tensor: each public function and module."""
    torch.manual_seed(0)
    K, V = torch.randn(T + 1, D, **F64), torch.randn(T + 1, 2, **F64)
    mask = padding_with_an_empty_row()
    modules = {
        "SymmetricAttention": mt.SymmetricAttention(D, 3, **F64),
        "HeadAttention": mt.HeadAttention(D, 3, **F64),
        "MultiHeadAttentionLoop": mt.MultiHeadAttentionLoop(D, H, **F64),
        "MultiHeadAttention": mt.MultiHeadAttention(D, H, **F64),
        "SumOfHeadsAttention": SumOfHeadsAttention(D, H, **F64),
        "FeedForward": mt.FeedForward(D, 6, activation="gelu", **F64),
        "EncoderBlock": mt.EncoderBlock(D, H, 6, **F64),
        "Encoder": mt.Encoder(2, D, H, 6, norm_first=True, **F64),
    }
    gqa = mt.GroupedQueryAttention(D, H, 1, rope_base=100.0, bias=True, **F64)  # returns (out, weights)
    cos, sin = mt.rotary_embedding(T, D, **F64)
    decoder = mt.Decoder(2, D, H, 6, **F64)
    memory = torch.randn(T + 1, D, **F64)
    functions = {
        "scaled_dot_product_attention": lambda x: mt.scaled_dot_product_attention(x, K, V)[0],
        "scaled_dot_product_attention, masked": lambda x: mt.scaled_dot_product_attention(x, x, x, mask)[0],
        "scaled_dot_product_attention, weights": lambda x: mt.scaled_dot_product_attention(x, K, V)[1],
        "chunked_attention": lambda x: mt.chunked_attention(x, K, V, chunk=2),
        "chunked_attention, masked": lambda x: mt.chunked_attention(x, x, x, mask, chunk=2),
        "masked_softmax": lambda x: mt.masked_softmax(x[:, :T], mask),
        "split_heads and merge_heads": lambda x: mt.merge_heads(mt.split_heads(x, H) * 2),
        "layer_norm": lambda x: mt.layer_norm(x, torch.ones(D, **F64), torch.zeros(D, **F64)),
        "MultiHeadAttention, causal": lambda x: modules["MultiHeadAttention"](x, causal=True),
        "MultiHeadAttention, masked": lambda x: modules["MultiHeadAttention"](x, mask=mask),
        "MultiHeadAttention, weights": lambda x: modules["MultiHeadAttention"](x, return_weights=True)[1],
        "DecoderBlock": lambda x: decoder.layers[0](x, memory, causal=True),
        "Decoder": lambda x: decoder(x, memory, causal=True),
        "GroupedQueryAttention": lambda x: gqa(x)[0],
        "GroupedQueryAttention, causal": lambda x: gqa(x, causal=True)[0],
        "GroupedQueryAttention, weights": lambda x: gqa(x, mask=mask, return_weights=True)[1],
        "GroupedQueryAttention, cached": lambda x: gqa(x[1:], causal=True, cache=cached(gqa, x[:1]))[0],
        "apply_rotary": lambda x: mt.apply_rotary(x, cos, sin),
        "repeat_kv": lambda x: mt.repeat_kv(x[None], 2) * x.sum(),
        "attend_with_cache": lambda x: mt.attend_with_cache(
            x[None, :2], x[None, :2], x[None, :2], K[None, :2], K[None, :2], causal=True, rope_base=100.0)[0],
    }
    return {**functions, **modules}


CASES = cases()


@pytest.fixture(params=sorted(CASES))
def case(request):
    return request.param, CASES[request.param]


def x_like(seed=1):
    return torch.randn(T, D, generator=torch.Generator().manual_seed(seed), **F64)


def directional_difference(fn, x, tangent):
    """(fn(x + eps t) - fn(x - eps t)) / 2 eps: the derivative of fn at x along t."""
    with torch.no_grad():
        return (fn(x + EPS * tangent) - fn(x - EPS * tangent)) / (2 * EPS)


def test_vmap_equals_a_plain_loop(case):
    name, fn = case
    batch = torch.stack([x_like(seed) for seed in range(3)])  # (3, T, D)
    looped = torch.stack([fn(x) for x in batch])
    torch.testing.assert_close(vmap(fn)(batch), looped, rtol=1e-10, atol=1e-12, msg=name)


def test_jvp_equals_finite_differences(case):
    name, fn = case
    x, tangent = x_like(), x_like(seed=7)
    value, derivative = jvp(fn, (x,), (tangent,))
    torch.testing.assert_close(value, fn(x), rtol=1e-10, atol=1e-12, msg=name)
    torch.testing.assert_close(derivative, directional_difference(fn, x, tangent), rtol=1e-5, atol=1e-7, msg=name)


def test_jacrev_equals_finite_differences(case):
    name, fn = case
    x = x_like()
    jacobian = jacrev(fn)(x)  # (*out, T, D)
    for i in range(T):
        for j in range(D):
            unit = torch.zeros_like(x)
            unit[i, j] = 1.0
            torch.testing.assert_close(jacobian[..., i, j], directional_difference(fn, x, unit),
                                       rtol=1e-5, atol=1e-7, msg=f"{name}, d/dx[{i}, {j}]")


def test_hessian_equals_finite_differences_of_the_gradient(case):
    name, fn = case
    x = x_like()

    def energy(y):
        return (fn(y) ** 2).sum()

    second = hessian(energy)(x)  # (T, D, T, D)
    gradient = jacrev(energy)
    for i in range(T):
        unit = torch.zeros_like(x)
        unit[i, 0] = 1.0
        expected = (gradient(x + EPS * unit) - gradient(x - EPS * unit)) / (2 * EPS)
        torch.testing.assert_close(second[..., i, 0], expected, rtol=1e-4, atol=1e-6, msg=name)
