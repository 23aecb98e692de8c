"""The attention features of today's models in `GroupedQueryAttention` (QK-norm per head and over
all heads, a score scale, soft-capping, sliding windows with a window-only cache, RoPE scaling,
positions per sequence): the NumPy face equal to the PyTorch face, and each feature checked
against what it means. Equality to Hugging Face's layers is in tests/test_loader_refusals.py."""

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt

FEATURES = {
    "plain": {},
    "QK-norm per head, Gemma's (1 + w)": dict(qk_norm="head", norm_unit_offset=True, norm_eps=1e-5),
    "QK-norm over all heads": dict(qk_norm="all"),
    "scale and soft-cap": dict(scale=0.1, logit_cap=2.0),
    "sliding window 3": dict(sliding_window=3),
    "YaRN": dict(rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4)),
    "dynamic NTK": dict(rope_scaling=dict(rope_type="dynamic", factor=2.0, max_position_embeddings=4)),
}


def module(seed=0, **features):
    torch.manual_seed(seed)
    layer = mt.GroupedQueryAttention(16, 4, 2, rope_base=100.0, dtype=torch.float64, **features)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.5)
    return layer


@pytest.mark.parametrize("features", FEATURES.values(), ids=FEATURES.keys())
def test_numpy_equals_torch_at_once_and_decoding(features):
    layer = module(**features)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        expected, weights = layer(x, causal=True, return_weights=True)
    got, got_weights = mnp.grouped_query_attention(x.numpy(), causal=True, **layer.numpy_params())
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_weights, weights.numpy(), rtol=1e-10, atol=1e-10)
    cache, torch_cache, steps, torch_steps = mnp.KVCache(), mt.KVCache(), [], []
    for start, stop in [(0, 4), (4, 5), (5, 7)]:
        steps.append(mnp.grouped_query_attention(x[:, start:stop].numpy(), causal=True, cache=cache,
                                                 **layer.numpy_params())[0])
        with torch.no_grad():
            torch_steps.append(layer(x[:, start:stop], causal=True, cache=torch_cache)[0])
    np.testing.assert_allclose(np.concatenate(steps, axis=-2), torch.cat(torch_steps, 1).numpy(), rtol=1e-10,
                               atol=1e-10)
    if features.get("rope_scaling", {}).get("rope_type") != "dynamic":  # dynamic NTK: cached keys keep old angles
        np.testing.assert_allclose(np.concatenate(steps, axis=-2), expected.numpy(), rtol=1e-10, atol=1e-10)


def test_the_sliding_window_hides_exactly_the_keys_outside_it():
    layer = module(sliding_window=3)
    with torch.no_grad():
        _, weights = layer(torch.randn(1, 8, 16, dtype=torch.float64), causal=True, return_weights=True)
    seen = weights[0] > 0  # (h, T, T)
    t, s = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    assert torch.equal(seen, ((s <= t) & (s > t - 3)).expand_as(seen))


def test_a_windowed_cache_holds_window_minus_one_and_decodes_as_the_whole_sequence():
    layer = module(sliding_window=3)
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    cache = mt.KVCache()
    with torch.no_grad():
        whole = layer(x, causal=True)[0]
        steps = [layer(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-12, atol=1e-12)
    assert (len(cache), cache.position, cache.dropped) == (2, 9, 7)


def test_soft_capped_scores_stay_inside_the_cap():
    layer = module(logit_cap=1.5, scale=1.0)
    layer.W_q.weight.data *= 20  # huge scores
    with torch.no_grad():
        _, weights = layer(torch.randn(1, 6, 16, dtype=torch.float64), return_weights=True)
    ratio = weights.amax(-1) / weights.amin(-1)  # at most e^(2 * cap) between two keys of one query
    assert ratio.max() <= np.exp(3.0) + 1e-9 and ratio.max() > np.exp(2.9)


def test_qk_norm_per_head_gives_each_head_unit_rms_before_the_weight():
    layer = module(qk_norm="head")
    torch.nn.init.ones_(layer.q_norm.weight)
    q, _, _ = layer.project(torch.randn(2, 5, 16, dtype=torch.float64))
    torch.testing.assert_close(q.pow(2).mean(-1), torch.ones(2, 4, 5, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_positions_per_sequence_equal_shifted_sequences():
    """Left padding: a sequence whose positions start at 0 after 2 pads equals the unpadded one."""
    layer = module(rope_scaling=dict(rope_type="linear", factor=2.0))
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    padded = torch.cat([torch.randn(1, 2, 16, dtype=torch.float64), x], dim=1)  # (1, 7, 16)
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4]])
    keep = torch.tensor([False, False, True, True, True, True, True])[None, None, None, :]  # (1, 1, 1, 7)
    with torch.no_grad():
        alone = layer(x, causal=True)[0]
        shifted = layer(padded, keep, causal=True, positions=positions)[0][:, 2:]
    torch.testing.assert_close(shifted, alone, rtol=1e-12, atol=1e-12)
    got = mnp.grouped_query_attention(padded.numpy(), mask=keep.numpy(), causal=True, positions=positions.numpy(),
                                      **layer.numpy_params())[0][:, 2:]
    np.testing.assert_allclose(got, alone.numpy(), rtol=1e-10, atol=1e-10)


def test_rotary_tables_equal_rotary_embedding_bit_for_bit():
    for scaling in [None, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=8)]:
        tables = mt.RotaryTables(8, 500.0, scaling)
        for T, start in [(5, 0), (1, 5), (70, 6), (1, 200)]:
            cos, sin = tables(T, start)
            ref_cos, ref_sin = mt.rotary_embedding(T, 8, 500.0, start, dtype=torch.float32, scaling=scaling)
            assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)


@pytest.mark.parametrize("bad,error", [
    (dict(qk_norm="both"), 'qk_norm must be None, "head"'),
    (dict(scale=0), "scale must be None"),
    (dict(logit_cap=-1.0), "cap must be a number > 0"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(rope_scaling=dict(rope_type="su")), "rope_type must be one of"),
])
def test_bad_features_are_refused_by_name(bad, error):
    with pytest.raises(ValueError, match=error):
        mt.GroupedQueryAttention(16, 4, 2, rope_base=100.0, **bad)


def test_rope_scaling_without_rope_is_refused_in_both_faces():
    with pytest.raises(ValueError, match="give rope_base too"):
        mt.GroupedQueryAttention(16, 4, 2, rope_scaling=dict(rope_type="linear", factor=2.0))
    params = mt.GroupedQueryAttention(16, 4, 2).numpy_params()
    with pytest.raises(ValueError, match="give rope_base too"):
        mnp.grouped_query_attention(np.ones((3, 16)), **{**params, "positions": np.arange(3)})
