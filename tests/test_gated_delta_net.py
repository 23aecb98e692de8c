"""GatedDeltaNet and its StateCache (chapter 18): copied by from_hf from transformers' Qwen3_5GatedDeltaNet and
Qwen3NextGatedDeltaNet (whose projections are interleaved per key head) and equal to them for a prompt, a
left-padded batch with its 2D mask and cached decoding token by token with transformers' DynamicCache
(float32 within 1e-5 x the largest output; float64 too, where transformers still computes the rule in
float32); the NumPy face's gated_delta_net equal to the module to 1e-10 in float64; the cache's bytes as the
formula and constant over T; what nothing here computes refused by name."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache, Qwen3_5TextConfig, Qwen3NextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

import mha.numpy as mnp
import mha.torch as mt
from mha.torch.hf import linear as hf_linear

FAMILIES = {"qwen3_5": (Qwen3_5TextConfig, Qwen3_5GatedDeltaNet),
            "qwen3_next": (Qwen3NextConfig, Qwen3NextGatedDeltaNet)}
# held-out sizes: (d_model, H_k, H_v, d_k, d_v, conv kernel)
SIZES = [(32, 2, 4, 8, 6, 4), (24, 3, 3, 4, 8, 3), (40, 1, 4, 16, 4, 2)]


def config(family, d_model, n_k, n_v, d_k, d_v, K):
    Config, _ = FAMILIES[family]
    return Config(hidden_size=d_model, linear_num_key_heads=n_k, linear_num_value_heads=n_v, linear_key_head_dim=d_k,
                  linear_value_head_dim=d_v, linear_conv_kernel_dim=K, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"])


def their_layer(family, sizes, seed, dtype=torch.float32):
    """A transformers layer with weights drawn larger than its initialisation, so that every part shows."""
    cfg = config(family, *sizes)
    torch.manual_seed(seed)
    layer = FAMILIES[family][1](cfg, 0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if name != "A_log" else 1.0))
    return cfg, layer.to(dtype)


def assert_close_to_max(got, expected, rtol):
    scale = expected.abs().max().item()
    torch.testing.assert_close(got, expected, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("index", range(len(SIZES)))
def test_a_prompt_and_a_left_padded_batch_equal_transformers(family, index):
    cfg, layer = their_layer(family, SIZES[index], seed=100 + index)
    ours = mt.GatedDeltaNet.from_hf(layer, chunk_size=[64, 5, 16][index])
    x = torch.randn(3, 70, cfg.hidden_size)  # T = 70 crosses a chunk of 64
    mask = torch.ones(3, 70, dtype=torch.long)
    mask[1, :4], mask[2, :33] = 0, 0
    with torch.no_grad():
        assert_close_to_max(ours(x), layer(x), 1e-5)
        expected, got = layer(x, attention_mask=mask), ours(x, keep=mask.bool())
    real = mask.bool()
    assert_close_to_max(got[real], expected[real], 1e-5)
    alone = ours(x[2:, 33:])  # the padded sequence, computed alone, gives the same numbers
    assert_close_to_max(got[2:, 33:], alone.detach(), 1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_float64_equals_transformers_to_its_float32_rule(family):
    cfg, layer = their_layer(family, SIZES[0], seed=7, dtype=torch.float64)
    ours = mt.GatedDeltaNet.from_hf(layer)
    assert ours.W_o.weight.dtype == torch.float64
    x = torch.randn(2, 19, cfg.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        assert_close_to_max(ours(x), layer(x), 1e-6)  # transformers casts g and the rule to float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_models_round_where_transformers_rounds(dtype):
    cfg, layer = their_layer("qwen3_5", SIZES[0], seed=9, dtype=dtype)
    ours = mt.GatedDeltaNet.from_hf(layer)
    x = torch.randn(2, 30, cfg.hidden_size).to(dtype)
    theirs, mine = DynamicCache(config=cfg), ours.new_cache()
    with torch.no_grad():
        for part in (x, x[:, :1]):  # a prompt, then a cached step
            expected, got = layer(part, cache_params=theirs), ours(part, cache=mine)
            assert got.dtype == dtype and mine.recurrent_state.dtype == torch.float32  # as transformers keeps it
            assert mine.nbytes == ours.state_bytes(2) == (4 * 8 * 6 * 4 + 3 * (2 * 2 * 8 + 4 * 6) * 2) * 2
            assert_close_to_max(got.float(), expected.float(), 2 ** -8)  # equal here; a rounding apart elsewhere


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("index", [0, 2])
def test_cached_decoding_token_by_token_equals_transformers(family, index):
    cfg, layer = their_layer(family, SIZES[index], seed=200 + index)
    ours = mt.GatedDeltaNet.from_hf(layer, chunk_size=4)
    x = torch.randn(3, 14, cfg.hidden_size)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :2], mask[2, :6] = 0, 0
    theirs, mine = DynamicCache(config=cfg), ours.new_cache()
    with torch.no_grad():
        expected, got = layer(x[:, :9], cache_params=theirs, attention_mask=mask), ours(x[:, :9], keep=mask.bool(),
                                                                                        cache=mine)
        assert_close_to_max(got[mask.bool()], expected[mask.bool()], 1e-5)
        for t in range(9, 14):
            assert_close_to_max(ours(x[:, t:t + 1], cache=mine), layer(x[:, t:t + 1], cache_params=theirs), 1e-5)
    torch.testing.assert_close(mine.recurrent_state, theirs.layers[0].recurrent_states[0], rtol=1e-5, atol=1e-5)
    assert mine.position == 14


def test_a_prompt_in_pieces_and_token_by_token_equals_the_whole():
    _, layer = their_layer("qwen3_5", SIZES[1], seed=3, dtype=torch.float64)
    ours = mt.GatedDeltaNet.from_hf(layer, chunk_size=4)
    x = torch.randn(2, 23, 24, dtype=torch.float64)
    with torch.no_grad():
        whole = ours(x)
        cache = ours.new_cache()
        pieces = [ours(x[:, :10], cache=cache), ours(x[:, 10:17], cache=cache)]
        pieces += [ours(x[:, t:t + 1], cache=cache) for t in range(17, 23)]
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("index", range(len(SIZES)))
def test_the_numpy_face_is_the_module(index):
    d_model, n_k, n_v, d_k, d_v, K = SIZES[index]
    torch.manual_seed(index)
    ours = mt.GatedDeltaNet(d_model, n_key_heads=n_k, n_value_heads=n_v, key_head_dim=d_k, value_head_dim=d_v,
                            conv_kernel=K, norm_eps=1e-5, chunk_size=8, dtype=torch.float64)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 21, d_model, dtype=torch.float64)
    keep = torch.ones(2, 21, dtype=torch.bool)
    keep[1, :5] = False
    sizes = dict(n_key_heads=n_k, n_value_heads=n_v, key_head_dim=d_k, value_head_dim=d_v, norm_eps=1e-5)
    with torch.no_grad():
        expected = ours(x, keep=keep).numpy()
        unbatched = ours(x[0]).numpy()
    got = mnp.gated_delta_net(x.numpy(), ours.numpy_params(), **sizes, keep=keep.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max())
    np.testing.assert_allclose(unbatched, expected[0], rtol=1e-12, atol=1e-12)


def test_the_state_cache_holds_the_formula_whatever_t():
    d_model, n_k, n_v, d_k, d_v, K = SIZES[0]
    ours = mt.GatedDeltaNet(d_model, n_key_heads=n_k, n_value_heads=n_v, key_head_dim=d_k, value_head_dim=d_v,
                            conv_kernel=K)
    expected = mt.gated_delta_state_bytes(n_key_heads=n_k, n_value_heads=n_v, key_head_dim=d_k,
                                          value_head_dim=d_v, conv_kernel=K, batch=2, bytes_per_value=4)
    cache = ours.new_cache()
    assert isinstance(cache, mt.StateCache) and cache.nbytes == 0 and cache.conv_state is None
    with torch.no_grad():
        for T in (1, 5, 130):
            ours(torch.randn(2, T, d_model), cache=cache)
            assert cache.nbytes == expected == ours.state_bytes(2) == (4 * 8 * 6 + 3 * (2 * 2 * 8 + 4 * 6)) * 2 * 4
    assert cache.position == 136 and cache.dropped == 0 and mt.cache_bytes(cache) == expected
    assert tuple(cache.conv_state.shape) == (2, K - 1, 2 * n_k * d_k + n_v * d_v)
    assert tuple(cache.recurrent_state.shape) == (2, n_v, d_k, d_v)
    cache.reset()
    assert cache.nbytes == 0 and cache.position == 0


def test_it_builds_on_the_meta_device_and_learns():
    meta = mt.GatedDeltaNet(16, n_key_heads=2, n_value_heads=4, key_head_dim=4, value_head_dim=4, device="meta")
    assert meta(torch.empty(2, 70, 16, device="meta")).shape == (2, 70, 16)
    torch.manual_seed(0)
    small = mt.GatedDeltaNet(6, n_key_heads=1, n_value_heads=2, key_head_dim=3, value_head_dim=2, conv_kernel=2,
                             chunk_size=3, dtype=torch.float64)
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: small(x), (x,))
    small(x).pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in small.parameters())


def test_what_is_not_computed_is_refused_by_name():
    cfg, layer = their_layer("qwen3_next", SIZES[0], seed=1)
    layer.activation = "gelu"
    with pytest.raises(ValueError, match=r"the activation 'gelu' after the convolution"):
        mt.GatedDeltaNet.from_hf(layer)
    layer.activation = "silu"
    layer.conv1d.bias = torch.nn.Parameter(torch.zeros(layer.conv_dim))
    with pytest.raises(ValueError, match=r"a bias in the causal convolution of Qwen3NextGatedDeltaNet"):
        hf_linear.gated_delta_net_arguments(layer)
    with pytest.raises(TypeError, match=r"expected a transformers Qwen3_5GatedDeltaNet or Qwen3NextGatedDeltaNet"):
        mt.GatedDeltaNet.from_hf(torch.nn.Linear(2, 2))
    _, other = their_layer("qwen3_5", SIZES[0], seed=2)
    wrong = mt.GatedDeltaNet(32, n_key_heads=2, n_value_heads=4, key_head_dim=8, value_head_dim=6, conv_kernel=3)
    with pytest.raises(ValueError, match=r"build ours with gated_delta_net_arguments\(layer\)"):
        hf_linear.copy_gated_delta_net(wrong, other)
    with pytest.raises(ValueError, match=r"n_value_heads=3 is not a multiple of n_key_heads=2"):
        mt.GatedDeltaNet(8, n_key_heads=2, n_value_heads=3, key_head_dim=4, value_head_dim=4)
    ours = mt.GatedDeltaNet.from_hf(other)
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match=r"keep must be booleans \(B, T\) = \(2, 5\)"):
        ours(x, keep=torch.ones(2, 5))
    with pytest.raises(TypeError, match=r"cache must be a StateCache"):
        ours(x, cache=mt.KVCache())
    with pytest.raises(ValueError, match=r"x has shape \(2, 5, 31\), so width 31"):
        ours(x[..., :31])
    cache = ours.new_cache()
    ours(x, cache=cache)
    with pytest.raises(ValueError, match=r"the cache holds 2 sequences, x has 1"):
        ours(x[:1, :1], cache=cache)
    with pytest.raises(ValueError, match=r"params is missing \['A_log'\]"):
        params = ours.numpy_params()
        del params["A_log"]
        mnp.gated_delta_net(x.numpy(), params, n_key_heads=2, n_value_heads=4, key_head_dim=8, value_head_dim=6)
