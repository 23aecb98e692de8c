"""The key-value cache, both faces: decoding token by token (or chunk by chunk) with a cache
gives what one causal forward pass gives; the cache's length, shapes, errors and size."""

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import CPU_AND_CUDA, assert_close_on

F64 = dict(dtype=torch.float64)
CHUNKINGS = [[1] * 7, [3, 1, 1, 2], [4, 3], [7]]


def chunks_of(x, sizes):
    """x (..., T, d) cut along T into consecutive pieces of the given sizes."""
    starts = np.cumsum([0, *sizes])
    return [x[..., a:b, :] for a, b in zip(starts[:-1], starts[1:])]


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("sizes", CHUNKINGS, ids=lambda s: "+".join(map(str, s)))
@pytest.mark.parametrize("h_kv,rope_base", [(4, None), (2, 10000.0), (1, 100.0)])
@pytest.mark.parametrize("return_weights", [False, True])
def test_decoding_with_the_cache_equals_one_causal_pass(device, sizes, h_kv, rope_base, return_weights):
    torch.manual_seed(0)
    module = mt.GroupedQueryAttention(16, 4, h_kv, rope_base=rope_base, **F64).to(device)
    x = torch.randn(2, 7, 16, **F64, device=device)
    full, full_w = module(x, causal=True, return_weights=True)
    cache, outs = mt.KVCache(), []
    for piece in chunks_of(x, sizes):
        out, weights = module(piece, return_weights=return_weights, causal=True, cache=cache)
        outs.append(out)
        if return_weights:
            assert weights.shape == (2, 4, piece.shape[-2], len(cache))
            assert_close_on(device, weights, full_w[..., len(cache) - piece.shape[-2]:len(cache), :len(cache)])
    assert len(cache) == 7 and cache.keys.shape == (2, h_kv, 7, 4)
    assert_close_on(device, torch.cat(outs, dim=-2), full, np.float64, "decoded with the cache")


@pytest.mark.parametrize("sizes", CHUNKINGS, ids=lambda s: "+".join(map(str, s)))
def test_numpy_decoding_with_the_cache_equals_one_causal_pass(sizes):
    torch.manual_seed(0)
    params = mt.GroupedQueryAttention(8, 4, 2, rope_base=10000.0, **F64).numpy_params()
    X = np.random.default_rng(0).standard_normal((3, 7, 8))
    full, _ = mn.grouped_query_attention(X, causal=True, **params)
    cache = mn.KVCache()
    outs = [mn.grouped_query_attention(piece, causal=True, cache=cache, **params)[0] for piece in chunks_of(X, sizes)]
    assert len(cache) == 7
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full, rtol=1e-10, atol=1e-12)


def test_without_causal_a_new_query_sees_every_cached_key_and_every_new_one():
    torch.manual_seed(0)
    module = mt.GroupedQueryAttention(8, 2, 1, rope_base=10000.0, **F64)
    x = torch.randn(6, 8, **F64)
    cache = mt.KVCache()
    module(x[:4], cache=cache)
    _, weights = module(x[4:], return_weights=True, cache=cache)
    assert weights.shape == (2, 2, 6) and (weights > 0).all()
    _, causal_w = mt.GroupedQueryAttention(8, 2, 1, **F64)(x[4:], return_weights=True, causal=True, cache=cache)
    assert causal_w[:, 0, -1].eq(0).all() and (causal_w[:, 0, :-1] > 0).all()  # new query 0 is at position 6


def test_the_cache_keeps_the_rotated_keys_at_continuing_positions():
    torch.manual_seed(0)
    module = mt.GroupedQueryAttention(8, 2, 2, rope_base=10000.0, **F64)
    x = torch.randn(5, 8, **F64)
    cache = mt.KVCache()
    module(x[:3], cache=cache)
    module(x[3:], cache=cache)
    k = mt.split_heads(module.W_k(x), 2)  # (h_kv, T, d_head), before RoPE
    cos, sin = mt.rotary_embedding(5, 4, **F64)
    assert torch.allclose(cache.keys, mt.apply_rotary(k, cos, sin), rtol=1e-12, atol=1e-12)
    assert torch.allclose(cache.values, mt.split_heads(module.W_v(x), 2))


@pytest.mark.parametrize("face,make", [(mn, np.zeros), (mt, torch.zeros)], ids=["numpy", "torch"])
def test_reusing_a_cache_with_another_batch_size_names_both(face, make):
    cache = face.KVCache()
    assert len(cache) == 0 and "empty" in repr(cache)
    cache.append(make((2, 3, 4, 8)), make((2, 3, 4, 8)))
    with pytest.raises(ValueError, match="batch size 2, but the new keys have batch size 5"):
        cache.append(make((5, 3, 1, 8)), make((5, 3, 1, 8)))
    with pytest.raises(ValueError, match="number of key/value heads 3, but the new keys have .* 1"):
        cache.append(make((2, 1, 1, 8)), make((2, 1, 1, 8)))
    with pytest.raises(ValueError, match="key width d_head 8, but the new keys have key width d_head 6"):
        cache.append(make((2, 3, 1, 6)), make((2, 3, 1, 6)))
    assert len(cache) == 4  # a refused append changes nothing


def test_a_module_refuses_a_cache_filled_with_another_batch():
    module = mt.GroupedQueryAttention(8, 2, 1)
    cache = mt.KVCache()
    module(torch.randn(2, 3, 8), cache=cache)
    with pytest.raises(ValueError, match="batch size 2, but the new keys have batch size 4"):
        module(torch.randn(4, 1, 8), cache=cache)
    with pytest.raises(ValueError, match="the cache holds torch.float32 keys"):
        module.double()(torch.randn(2, 1, 8, **F64), cache=cache)
    with pytest.raises(TypeError, match="cache must be a mha.torch.KVCache, got dict"):
        module(torch.randn(2, 1, 8, **F64), cache={})
    with pytest.raises(TypeError, match="cache must be a mha.numpy.KVCache, got KVCache"):
        mn.grouped_query_attention(np.zeros((1, 8)), **module.numpy_params(), cache=mt.KVCache())


def test_attend_with_cache_equals_one_pass_and_returns_the_cache_to_keep():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 4, 6, 4)), rng.standard_normal((2, 2, 6, 4)), rng.standard_normal((2, 2, 6, 4))
    full = mn.attend_with_cache(q, k, v, causal=True, rope_base=10000.0)
    first = mn.attend_with_cache(q[..., :4, :], k[..., :4, :], v[..., :4, :], causal=True, rope_base=10000.0)
    second = mn.attend_with_cache(q[..., 4:, :], k[..., 4:, :], v[..., 4:, :], *first[2:], causal=True,
                                  rope_base=10000.0)
    np.testing.assert_allclose(np.concatenate([first[0], second[0]], axis=-2), full[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(second[2], full[2], rtol=1e-12, atol=1e-12)
    torch_second = mt.attend_with_cache(*(torch.as_tensor(a[..., 4:, :]) for a in (q, k, v)),
                                        *(torch.as_tensor(a) for a in first[2:]), causal=True, rope_base=10000.0)
    for a, b in zip(torch_second, second):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="give both past_keys and past_values"):
        mn.attend_with_cache(q, k, v, past_keys=k)


def test_kv_cache_bytes_counts_keys_and_values_of_every_layer():
    llama = dict(n_layers=32, d_head=128, T=8192)
    assert mn.kv_cache_bytes(n_kv_heads=32, **llama) == 4 * 2 ** 30  # 4 GiB per sequence in float16
    assert mt.kv_cache_bytes(n_kv_heads=8, **llama) == 2 ** 30  # grouped: 8 key/value heads
    assert mn.kv_cache_bytes(n_kv_heads=1, **llama, batch=3, bytes_per_value=4) == 3 * 4 * 2 ** 30 // 32 * 2
    cache, module = mt.KVCache(), mt.GroupedQueryAttention(32, 8, 2, dtype=torch.float16)
    module(torch.randn(3, 10, 32, dtype=torch.float16), cache=cache)
    measured = sum(t.nelement() * t.element_size() for t in (cache.keys, cache.values))
    assert measured == mt.kv_cache_bytes(1, 2, 4, 10, batch=3, bytes_per_value=2)
    with pytest.raises(ValueError, match="n_layers must be at least 1"):
        mn.kv_cache_bytes(0, 8, 128, 10)
