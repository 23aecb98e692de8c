"""Chapter 12's rung of the equivalence ladder: our grouped-query attention equals Hugging Face's
Llama (random weights from a tiny LlamaConfig, nothing downloaded) and PyTorch's own
`F.scaled_dot_product_attention(..., enable_gqa=True)`."""

import re
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama import modeling_llama as llama

import mha.numpy as mn
import mha.torch as mt

H, D_HEAD, T = 8, 8, 9


def llama_layer(n_kv_heads, implementation="eager", bias=False, head_dim=D_HEAD, theta=10000.0):
    """A LlamaAttention with random weights, and its rotary embedding."""
    torch.manual_seed(n_kv_heads)
    config = LlamaConfig(hidden_size=64, num_attention_heads=H, num_key_value_heads=n_kv_heads, head_dim=head_dim,
                         intermediate_size=128, num_hidden_layers=1, vocab_size=32, attention_bias=bias,
                         rope_parameters={"rope_type": "default", "rope_theta": theta})
    config._attn_implementation = implementation
    attention = llama.LlamaAttention(config, layer_idx=0).eval()
    return attention, llama.LlamaRotaryEmbedding(config)


def llama_forward(attention, rotary, x, start=0, cache=None):
    """Llama's attention over x (B, T, d) at positions start .., causal, as LlamaModel calls it."""
    B, T_new = x.shape[:2]
    position_ids = torch.arange(start, start + T_new)[None].expand(B, T_new)
    causal = torch.full((T_new, start + T_new), float("-inf")).triu(start + 1)[None, None]  # (1, 1, T, T_k)
    with torch.no_grad():
        return attention(x, rotary(x, position_ids), causal, past_key_values=cache)[0]


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("bias,head_dim,theta", [(False, D_HEAD, 10000.0), (True, 16, 500000.0)])
def test_from_llama_equals_llama_attention(n_kv_heads, implementation, bias, head_dim, theta):
    attention, rotary = llama_layer(n_kv_heads, implementation, bias, head_dim, theta)
    x = torch.randn(2, T, 64)
    ours = mt.GroupedQueryAttention.from_llama(attention, rope_base=theta)
    assert (ours.n_heads, ours.n_kv_heads, ours.d_head) == (H, n_kv_heads, head_dim)
    expected = llama_forward(attention, rotary, x)
    with torch.no_grad():
        fast = ours(x, causal=True)[0]
        explicit = ours(x, causal=True, return_weights=True)[0]
    torch.testing.assert_close(fast, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(explicit, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
def test_decoding_with_our_cache_equals_llama_with_its_cache(n_kv_heads):
    attention, rotary = llama_layer(n_kv_heads)
    ours = mt.GroupedQueryAttention.from_llama(attention)
    x = torch.randn(2, T, 64)
    theirs_cache, our_cache = DynamicCache(config=attention.config), mt.KVCache()
    for start, stop in [(0, 5), (5, 6), (6, 7), (7, 9)]:
        expected = llama_forward(attention, rotary, x[:, start:stop], start, theirs_cache)
        with torch.no_grad():
            got = ours(x[:, start:stop], causal=True, cache=our_cache)[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert len(our_cache) == stop
    keys, values = theirs_cache.layers[0].keys, theirs_cache.layers[0].values
    torch.testing.assert_close(our_cache.keys, keys, rtol=1e-5, atol=1e-5)  # rotated keys, as Llama caches them
    torch.testing.assert_close(our_cache.values, values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offset", [0, 100, 4000])
def test_rotary_tables_and_rotation_equal_llamas(offset):
    _, rotary = llama_layer(2)
    x = torch.randn(1, T, 64)
    cos, sin = rotary(x, torch.arange(offset, offset + T)[None])  # (1, T, d_head), float32
    ours_cos, ours_sin = mt.rotary_embedding(T, D_HEAD, offset=offset)
    torch.testing.assert_close(ours_cos, cos[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_sin, sin[0], rtol=0, atol=1e-5)
    q, k = torch.randn(2, H, T, D_HEAD), torch.randn(2, 2, T, D_HEAD)
    q_llama, k_llama = llama.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(mt.apply_rotary(q, ours_cos, ours_sin), q_llama, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mt.apply_rotary(k, ours_cos, ours_sin), k_llama, rtol=1e-5, atol=1e-5)
    np_cos, np_sin = mn.rotary_embedding(T, D_HEAD, offset=offset)
    np.testing.assert_allclose(mn.apply_rotary(q.double().numpy(), np_cos, np_sin), q_llama.double().numpy(),
                               rtol=1e-4, atol=1e-4 if offset else 1e-5)
    assert torch.equal(mt.repeat_kv(k, 4), llama.repeat_kv(k, 4))


@pytest.mark.parametrize("n_kv_heads", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_module_equals_pytorch_sdpa_with_enable_gqa(n_kv_heads, causal):
    torch.manual_seed(0)
    ours = mt.GroupedQueryAttention(32, 8, n_kv_heads, bias=True, rope_base=10000.0, dtype=torch.float64)
    x = torch.randn(3, 7, 32, dtype=torch.float64)
    q = ours.W_q(x).view(3, 7, 8, 4).transpose(1, 2)  # (B, h, T, d_head)
    k = ours.W_k(x).view(3, 7, n_kv_heads, 4).transpose(1, 2)  # (B, h_kv, T, d_head)
    v = ours.W_v(x).view(3, 7, n_kv_heads, 4).transpose(1, 2)
    cos, sin = mt.rotary_embedding(7, 4, dtype=torch.float64)
    q, k = llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # (B, h, T, d_head)
    expected = ours.W_o(out.transpose(1, 2).reshape(3, 7, 32))
    for return_weights in (False, True):
        torch.testing.assert_close(ours(x, causal=causal, return_weights=return_weights)[0], expected,
                                   rtol=1e-10, atol=1e-12)


def test_from_llama_copies_biases_on_q_k_v_only_as_qwen_has_them():
    attention, rotary = llama_layer(2, bias=True)
    attention.o_proj.bias = None
    x = torch.randn(2, T, 64)
    with torch.no_grad():
        got = mt.GroupedQueryAttention.from_llama(attention)(x, causal=True)[0]
    torch.testing.assert_close(got, llama_forward(attention, rotary, x), rtol=1e-5, atol=1e-5)


def test_from_llama_refuses_what_it_cannot_copy():
    attention, _ = llama_layer(2, theta=500000.0)
    with pytest.raises(ValueError, match="rope_theta=500000.0 for this layer but rope_base=10000.0: pass "
                                         "rope_base=500000.0"):
        mt.GroupedQueryAttention.from_llama(attention)
    with pytest.raises(TypeError, match="expected a transformers LlamaAttention"):
        mt.GroupedQueryAttention.from_llama(torch.nn.Linear(3, 3))
    attention.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0}  # its keys missing
    with pytest.raises(ValueError, match=re.escape("RoPE scaling 'llama3' needs ['factor', 'low_freq_factor'")):
        mt.GroupedQueryAttention.from_llama(attention)


@pytest.mark.parametrize("theta,scaling,error", [
    (10000.0, None, None),
    (500000.0, None, "rope_theta=500000.0 for this layer but rope_base=10000.0"),
    (10000.0, {"rope_type": "llama3", "factor": 8.0}, "missing: ['low_freq_factor', 'high_freq_factor', "
                                                      "'original_max_position_embeddings']"),
], ids=["default", "other theta", "llama3 scaling without its keys"])
def test_from_llama_reads_a_transformers_4_config(theta, scaling, error):
    """transformers 4 keeps the base in config.rope_theta and the scaling in config.rope_scaling,
    with no config.rope_parameters: from_llama reads those instead."""
    attention, rotary = llama_layer(2)
    x = torch.randn(1, 5, 64)
    expected = llama_forward(attention, rotary, x)
    attention.config = types.SimpleNamespace(rope_theta=theta, rope_scaling=scaling)
    if error is None:
        with torch.no_grad():
            got = mt.GroupedQueryAttention.from_llama(attention)(x, causal=True)[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(ValueError, match=re.escape(error)):
            mt.GroupedQueryAttention.from_llama(attention)
