"""gpt-oss's attention sinks and Qwen3-Next's gated attention, layer by layer: `sink_softmax` in both faces
(the softmax of each row with one more entry, the sink, whose weight is dropped), GroupedQueryAttention with
sinks against that formula, Qwen3-Next's full-attention layer (output gate, partial RoPE, (1 + w) QK-norms)
copied by from_llama and equal to transformers' for a prompt and cached decoding, and the NumPy face's twin."""

import numpy as np
import pytest
import torch
import transformers

import mha.numpy as mnp
import mha.torch as mt

V = 48


# The sink softmax, in both faces ----------------------------------------------------------------------------


def sink_case(seed=0, shape=(2, 3, 4, 6)):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=shape) * 3
    mask = rng.random(shape) < 0.7
    mask[0, 1, 2] = False  # a fully masked row
    return np.where(mask, scores, -np.inf), rng.normal(size=shape[-3]) * 2, mask


def test_sink_softmax_is_the_softmax_with_one_more_entry_dropped():
    scores, sinks, mask = sink_case()
    weights = mnp.sink_softmax(scores, sinks)
    extended = np.concatenate([scores, np.broadcast_to(sinks[:, None, None], (*scores.shape[:-1], 1))], -1)
    expected = np.exp(extended) / np.exp(extended).sum(-1, keepdims=True)  # no max subtracted: small scores
    np.testing.assert_allclose(weights, expected[..., :-1], rtol=1e-12, atol=1e-15)
    assert np.all(weights[~mask] == 0) and np.all(weights[0, 1, 2] == 0)  # masked keys, the empty row: zeros
    assert np.all(weights.sum(-1) < 1)  # the sink keeps a share of every row


def test_sink_softmax_is_stable_and_the_two_faces_agree():
    scores, sinks, _ = sink_case(1)
    big = scores + 1000.0  # exp would overflow without the max
    weights = mnp.sink_softmax(big, sinks + 1000.0)
    np.testing.assert_allclose(weights, mnp.sink_softmax(scores, sinks), rtol=1e-9, atol=1e-12)
    ours = mt.sink_softmax(torch.as_tensor(scores), torch.as_tensor(sinks)).numpy()
    np.testing.assert_allclose(ours, mnp.sink_softmax(scores, sinks), rtol=1e-13, atol=1e-15)
    very_low = mnp.sink_softmax(scores, np.full(3, -1e9))  # a sink that takes nothing: the masked softmax
    allowed = np.isfinite(scores)
    expected = mnp.masked_softmax(np.where(allowed, scores, 0.0), allowed)
    np.testing.assert_allclose(very_low, expected, rtol=1e-12, atol=1e-15)


def test_sink_softmax_refuses_bad_shapes_by_name():
    scores, sinks, _ = sink_case()
    with pytest.raises(ValueError, match=r"sinks must have shape \(h,\) = \(3,\)"):
        mnp.sink_softmax(scores, sinks[:2])
    with pytest.raises(ValueError, match=r"scores must have shape \(\.\.\., h, T_q, T_k\)"):
        mnp.sink_softmax(scores[0, 0], sinks)
    with pytest.raises(ValueError, match=r"sinks must have shape \(h,\) = \(3,\)"):
        mt.sink_softmax(torch.as_tensor(scores), torch.zeros(4, dtype=torch.float64))


def test_grouped_attention_with_sinks_is_the_sink_softmax_over_masked_scores():
    torch.manual_seed(0)
    layer = mt.GroupedQueryAttention(24, 6, 2, rope_base=10000.0, sinks=True).double()
    with torch.no_grad():
        layer.sinks.normal_(0.0, 2.0)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    out, weights = layer(x, return_weights=True, causal=True)
    q, k, v = layer.project(x)
    q, k = layer.rotary.rotate(q, k)
    scores = (q @ mt.repeat_kv(k, 3).transpose(-2, -1)) / layer.d_head ** 0.5  # (2, 6, 7, 7)
    scores = scores.masked_fill(~mt.causal_mask(7), float("-inf"))
    expected = mnp.sink_softmax(scores.detach().numpy(), layer.sinks.detach().numpy())
    np.testing.assert_allclose(weights.detach().numpy(), expected, rtol=1e-12, atol=1e-15)
    merged = mt.merge_heads(torch.as_tensor(expected) @ mt.repeat_kv(v, 3))
    torch.testing.assert_close(out, layer.W_o(merged), rtol=1e-12, atol=1e-12)


# Qwen3-Next's output gate -------------------------------------------------------------------------------------


def qwen3_next_attention(seed=2, **changes):
    """Qwen3-Next's full-attention layer (layer 3 of its default pattern), random weights, and its rotary embedding."""
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling
    config = transformers.Qwen3NextConfig(**{**dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                                    head_dim=16, intermediate_size=16, num_hidden_layers=4,
                                                    vocab_size=V), **changes})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    attention = modeling.Qwen3NextAttention(config, layer_idx=3).eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.3)
    return attention, modeling.Qwen3NextRotaryEmbedding(config)


def qwen3_next_forward(attention, rotary, x, start=0, cache=None):
    T_new = x.shape[-2]
    position_ids = torch.arange(start, start + T_new)[None].expand(len(x), T_new)
    allowed = mt.causal_mask_after(T_new, start)
    causal = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
    with torch.no_grad():
        return attention(x, rotary(x, position_ids), causal, past_key_values=cache)[0]


@pytest.mark.parametrize("factor", [0.25, 1.0], ids=["partial RoPE 4 of 16 (default)", "RoPE on all 16"])
def test_qwen3_nexts_full_attention_layer_output_gate_and_partial_rope(factor):
    """Qwen3NextAttention copied by from_llama: the gate from q_proj ([query | gate] a head), sigmoid(gate) on the
    heads' outputs, RoPE on the first head_dim * partial_rotary_factor features, (1 + w) QK-norms; a prompt, then
    decoding with the cache."""
    attention, rotary = qwen3_next_attention(partial_rotary_factor=factor)
    ours = mt.GroupedQueryAttention.from_llama(attention, attention.config.rope_parameters["rope_theta"])
    assert ours.output_gate and ours.n_heads == 4 and ours.rotary_dim == int(16 * factor)
    assert ours.q_norm.unit_offset
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, causal=True)[0], qwen3_next_forward(attention, rotary, x),
                                   rtol=1e-5, atol=1e-5)
    cache, theirs = mt.KVCache(), transformers.DynamicCache(config=attention.config)
    for start, stop in [(0, 5), (5, 6), (6, 9)]:
        with torch.no_grad():
            got = ours(x[:, start:stop], causal=True, cache=cache)[0]
        expected = qwen3_next_forward(attention, rotary, x[:, start:stop], start, theirs)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_output_gate_matters():
    """The same layer without the gate (its query rows alone): far off."""
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling
    config = transformers.Qwen3NextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                          intermediate_size=16, num_hidden_layers=2, vocab_size=V,
                                          partial_rotary_factor=1.0)
    config._attn_implementation = "eager"
    torch.manual_seed(2)
    attention = modeling.Qwen3NextAttention(config, layer_idx=1).eval()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0.0, 0.3)
    rotary = modeling.Qwen3NextRotaryEmbedding(config)
    x = torch.randn(2, 7, 32)
    position_ids = torch.arange(7)[None].expand(2, 7)
    causal = torch.zeros(7, 7).masked_fill(~mt.causal_mask(7), float("-inf"))[None, None]
    with torch.no_grad():
        expected = attention(x, rotary(x, position_ids), causal)[0]
        ours = mt.GroupedQueryAttention.from_llama(attention, config.rope_parameters["rope_theta"])
        torch.testing.assert_close(ours(x, causal=True)[0], expected, rtol=1e-5, atol=1e-5)
        ours.output_gate = False  # the same weights without the gate: far off
        ours.W_q = torch.nn.Linear(32, 32, bias=False)
        ours.W_q.weight.copy_(attention.q_proj.weight.view(4, 16, 32)[:, :8].reshape(32, 32))
        assert (ours(x, causal=True)[0] - expected).abs().max() > 1e-2


def test_the_numpy_face_computes_sinks_the_output_gate_and_a_partial_rope():
    torch.manual_seed(3)
    layer = mt.GroupedQueryAttention(24, 4, 2, d_head=8, bias=True, rope_base=10000.0, rotary_dim=4, sinks=True,
                                     output_gate=True, qk_norm="head", norm_unit_offset=True).double()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.5)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    with torch.no_grad():
        expected, expected_weights = layer(x, return_weights=True, causal=True)
    got, weights = mnp.grouped_query_attention(x.numpy(), **layer.numpy_params(), causal=True)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=1e-12, atol=1e-14)
