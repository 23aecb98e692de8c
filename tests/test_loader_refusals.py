"""`GroupedQueryAttention.from_llama` on Hugging Face's decoder families: equal to the layer it
copies (Llama, Mistral, Qwen2, Gemma 1), or a ValueError naming what it cannot compute (Qwen3,
OLMo2, Gemma 2, Gemma 3, a RoPE other than the default kind), never a silently different answer.

Tiny random configs, nothing downloaded; weights drawn with std 0.3 (outputs of about 10) so a
missing feature shows. The transformers 4.56 layouts (rope_theta, rope_scaling, Gemma 3's
rope_local_base_freq and sliding_window_pattern) are emulated with plain config objects."""

import importlib
import inspect
import re
import types

import pytest
import torch
import transformers

import mha.torch as mt
from mha.torch import grouped

TINY = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
            num_hidden_layers=2, vocab_size=32)
# family: (transformers module, class prefix, config class)
FAMILIES = {
    "llama": ("llama", "Llama", "LlamaConfig"),
    "mistral": ("mistral", "Mistral", "MistralConfig"),
    "qwen2": ("qwen2", "Qwen2", "Qwen2Config"),
    "gemma": ("gemma", "Gemma", "GemmaConfig"),
    "qwen3": ("qwen3", "Qwen3", "Qwen3Config"),
    "olmo2": ("olmo2", "Olmo2", "Olmo2Config"),
    "gemma2": ("gemma2", "Gemma2", "Gemma2Config"),
    "gemma3": ("gemma3", "Gemma3", "Gemma3TextConfig"),
    "olmo": ("olmo", "Olmo", "OlmoConfig"),
    "gpt_oss": ("gpt_oss", "GptOss", "GptOssConfig"),
    "glm": ("glm", "Glm", "GlmConfig"),
}
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def tiny_config(family, implementation="eager", **changes):
    config = getattr(transformers, FAMILIES[family][2])(**{**TINY, **changes})
    config._attn_implementation = implementation
    return config


def randomize(module, seed=0):
    """Every weight, bias and norm scale drawn from N(0, 0.3): larger than the default init."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.3)
    return module.eval()


def hf_layer(family, layer_idx=0, implementation="eager", **changes):
    """The family's attention layer with random weights, and its rotary embedding."""
    module_name, prefix, _ = FAMILIES[family]
    modeling = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    config = tiny_config(family, implementation, **changes)
    attention = randomize(getattr(modeling, f"{prefix}Attention")(config, layer_idx=layer_idx))
    return attention, getattr(modeling, f"{prefix}RotaryEmbedding")(config)


def hf_forward(attention, rotary, x, start=0, cache=None):
    """The layer over x (B, T, d) at positions start .., causal, as the model calls it."""
    B, T_new = x.shape[:2]
    position_ids = torch.arange(start, start + T_new)[None].expand(B, T_new)
    per_layer_type = "layer_type" in inspect.signature(rotary.forward).parameters  # Gemma 3: one RoPE per type
    cos_sin = rotary(x, position_ids, attention.layer_type) if per_layer_type else rotary(x, position_ids)
    causal = torch.full((T_new, start + T_new), float("-inf")).triu(start + 1)[None, None]  # (1, 1, T, T_k)
    with torch.no_grad():
        return attention(x, cos_sin, causal, past_key_values=cache)[0]


def ours_forward(attention, x, rope_base=10000.0, **kwargs):
    with torch.no_grad():
        return mt.GroupedQueryAttention.from_llama(attention, rope_base)(x, causal=True, **kwargs)[0]


# The families from_llama computes, each as Hugging Face builds it (changes from TINY).
EQUAL = {
    "Llama": ("llama", {}),
    "Mistral, window 16": ("mistral", dict(sliding_window=16)),
    "Qwen2, biases on q, k, v": ("qwen2", {}),
    "Gemma 1, head_dim 16 != 32 / 4": ("gemma", dict(head_dim=16)),
    "Gemma 2 without its soft-cap and scalar": ("gemma2", dict(attn_logit_softcapping=None, query_pre_attn_scalar=8)),
    "OLMo 1 without clip_qkv": ("olmo", {}),
}


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family,changes", EQUAL.values(), ids=EQUAL.keys())
def test_from_llama_equals_the_families_it_computes(family, changes, implementation):
    attention, rotary = hf_layer(family, implementation=implementation, **changes)
    x = torch.randn(2, 7, 32)
    expected = hf_forward(attention, rotary, x)
    assert expected.abs().max() > 3  # the scale at which a missing feature would show
    torch.testing.assert_close(ours_forward(attention, x), expected, **TOLERANCE)


def test_qwen2_copies_biases_on_q_k_v_and_none_on_o():
    attention, _ = hf_layer("qwen2")
    ours = mt.GroupedQueryAttention.from_llama(attention)
    assert attention.o_proj.bias is None and torch.equal(ours.W_o.bias, torch.zeros(32))
    for mine, theirs in [(ours.W_q, attention.q_proj), (ours.W_k, attention.k_proj), (ours.W_v, attention.v_proj)]:
        assert torch.equal(mine.bias, theirs.bias) and theirs.bias.abs().max() > 0


def mistral_attention_in_its_model(window, T):
    """A one-layer MistralModel over T tokens: its attention layer, the layer's input and output
    (the model builds the sliding-window mask itself)."""
    model = randomize(transformers.MistralModel(tiny_config("mistral", sliding_window=window, num_hidden_layers=1)))
    seen = {}

    def keep(module, args, kwargs, output):
        seen["x"], seen["out"] = kwargs["hidden_states"], output[0]

    attention = model.layers[0].self_attn
    attention.register_forward_hook(keep, with_kwargs=True)
    with torch.no_grad():
        model(torch.arange(T)[None] % 32)
    return attention, seen["x"], seen["out"]


def test_mistral_equals_within_its_window_and_refuses_past_it():
    attention, x, expected = mistral_attention_in_its_model(window=5, T=5)
    ours = mt.GroupedQueryAttention.from_llama(attention)
    assert ours.sliding_window == 5
    torch.testing.assert_close(ours_forward(attention, x), expected, **TOLERANCE)
    attention, x, expected = mistral_attention_in_its_model(window=5, T=6)
    with pytest.raises(ValueError, match=re.escape("6 positions (0 cached + 6 new) exceed sliding_window=5")):
        ours_forward(attention, x)
    unwindowed = mt.GroupedQueryAttention.from_llama(attention)
    unwindowed.sliding_window = None
    with torch.no_grad():
        got = unwindowed(x, causal=True)[0]
    torch.testing.assert_close(got[:, :5], expected[:, :5], **TOLERANCE)  # the window hides nothing yet
    assert (got[:, 5] - expected[:, 5]).abs().max() > 1e-2  # the last query no longer sees the first key


def test_mistral_decoding_with_a_cache_stops_at_the_window():
    attention, rotary = hf_layer("mistral", sliding_window=6)
    ours = mt.GroupedQueryAttention.from_llama(attention)
    x, cache, theirs = torch.randn(1, 7, 32), mt.KVCache(), transformers.DynamicCache()
    for start, stop in [(0, 4), (4, 6)]:
        with torch.no_grad():
            got = ours(x[:, start:stop], causal=True, cache=cache)[0]
        torch.testing.assert_close(got, hf_forward(attention, rotary, x[:, start:stop], start, theirs), **TOLERANCE)
    with pytest.raises(ValueError, match=re.escape("7 positions (6 cached + 1 new) exceed sliding_window=6")):
        ours(x[:, 6:], causal=True, cache=cache)
    assert len(cache) == 6  # refused before anything is appended


def refusal(attention, rope_base=10000.0):
    with pytest.raises(ValueError) as error:
        mt.GroupedQueryAttention.from_llama(attention, rope_base)
    return str(error.value)


# family, changes from TINY, layer index, what the message must name.
REFUSED = {
    "Qwen3": ("qwen3", {}, 0, ["q_norm and k_norm (Qwen3RMSNorm"]),
    "OLMo2": ("olmo2", {}, 0, ["q_norm and k_norm (Olmo2RMSNorm"]),
    "Gemma 2 soft-cap": ("gemma2", dict(query_pre_attn_scalar=8), 0, ["attn_logit_softcapping=50.0"]),
    "Gemma 2 scalar": ("gemma2", dict(attn_logit_softcapping=None, query_pre_attn_scalar=16), 0,
                       ["scaling other than head_dim ** -0.5 (scaling=0.25, query_pre_attn_scalar=16"]),
    "Gemma 3": ("gemma3", dict(layer_types=["sliding_attention", "full_attention"]), 1,
                ["q_norm and k_norm (Gemma3RMSNorm", "scaling other than head_dim ** -0.5",
                 "per-layer-type RoPE parameters (rope_parameters has one dict per layer type"]),
    "Llama 3 RoPE": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=16)), 0,
                     ["RoPE of type 'llama3'"]),
    "YaRN RoPE": ("qwen2", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0)), 0,
                  ["RoPE of type 'yarn'"]),
    "GLM partial RoPE": ("glm", {}, 0, ["partial_rotary_factor=0.5 (RoPE on part of each head's features"]),
    "OLMo 1 clip_qkv": ("olmo", dict(clip_qkv=0.5), 0, ["clip_qkv=0.5 (queries, keys and values clamped"]),
    "GPT-OSS sinks": ("gpt_oss", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)), 1,
                      ["sinks (a learned logit per head"]),
    "Qwen2 use_sliding_window": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), 1,
                                 ["use_sliding_window=True (a window of 4 on the layers from max_window_layers=1"]),
}


@pytest.mark.parametrize("family,changes,layer_idx,features", REFUSED.values(), ids=REFUSED.keys())
def test_from_llama_refuses_naming_the_feature_model_type_and_class(family, changes, layer_idx, features):
    attention, _ = hf_layer(family, layer_idx, **changes)
    message = refusal(attention, 1e6 if family == "gemma3" else 10000.0)
    for named in [*features, f"model_type={attention.config.model_type!r}", type(attention).__name__]:
        assert named in message, f"{named!r} not in {message!r}"


@pytest.mark.parametrize("family,changes,layer_idx,features",
                         [v for k, v in REFUSED.items() if k != "Qwen2 use_sliding_window"],
                         ids=[k for k in REFUSED if k != "Qwen2 use_sliding_window"])
def test_each_refusal_is_needed_a_copy_ignoring_it_differs(family, changes, layer_idx, features, monkeypatch):
    """Were the check skipped, the copy would differ from Hugging Face at T = 7 by far more than
    rounding. (Qwen2's use_sliding_window is left out: past its window of 4, forward refuses anyway.)"""
    attention, rotary = hf_layer(family, layer_idx, **changes)
    x = torch.randn(2, 7, 32)
    monkeypatch.setattr(grouped, "check_computable", lambda attention, rope_base: None)
    gap = (ours_forward(attention, x, 1e6 if family == "gemma3" else 10000.0) - hf_forward(attention, rotary, x))
    assert gap.abs().max() > 1e-3


def test_gemma_3_is_refused_without_rope_too():
    attention, _ = hf_layer("gemma3", layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=8)
    message = refusal(attention, rope_base=None)
    assert "q_norm and k_norm" in message and "per-layer-type" not in message  # no RoPE copied, none checked


def transformers_4_config(**fields):
    """A config as transformers 4.56 lays it out: rope_theta and rope_scaling, no rope_parameters."""
    return types.SimpleNamespace(**{"rope_scaling": None, **fields})


def test_a_transformers_4_gemma_3_config_is_refused_for_its_per_layer_rope():
    attention, _ = hf_layer("gemma3", layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=8)
    attention.config = transformers_4_config(model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
                                             _sliding_window_pattern=6, sliding_window=4096, query_pre_attn_scalar=8)
    message = refusal(attention, rope_base=1e6)
    assert ("per-layer-type RoPE parameters (rope_local_base_freq=10000.0 on the sliding layers, "
            "rope_theta=1000000.0 on the full ones, sliding_window_pattern=6)") in message
    assert "model_type='gemma3_text' (Gemma3Attention)" in message


@pytest.mark.parametrize("fields,named", [
    (dict(model_type="llama", rope_theta=10000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "RoPE of type 'yarn'"),
    (dict(model_type="stablelm", rope_theta=10000.0, partial_rotary_factor=0.25), "partial_rotary_factor=0.25"),
    (dict(model_type="qwen2", rope_theta=10000.0, use_sliding_window=True, sliding_window=4, max_window_layers=1),
     "use_sliding_window=True"),
    (dict(model_type="gemma2", rope_theta=10000.0, attn_logit_softcapping=30.0), "attn_logit_softcapping=30.0"),
    (dict(model_type="gemma2", rope_theta=10000.0, query_pre_attn_scalar=16), "query_pre_attn_scalar=16"),
], ids=["rope_scaling yarn", "partial_rotary_factor", "use_sliding_window", "soft-cap", "query_pre_attn_scalar"])
def test_a_transformers_4_config_is_read(fields, named):
    """The config's own fields alone are enough: on a Llama layer, model_type and all."""
    attention, _ = hf_layer("llama")
    attention.config = transformers_4_config(**fields)
    del attention.scaling  # so the config's query_pre_attn_scalar is the only word on the scaling
    message = refusal(attention)
    assert named in message and f"model_type={fields['model_type']!r} (LlamaAttention)" in message


def test_a_transformers_4_mistral_config_keeps_its_window():
    attention, rotary = hf_layer("mistral", sliding_window=7)
    x = torch.randn(1, 7, 32)
    expected = hf_forward(attention, rotary, x)
    attention.config = transformers_4_config(model_type="mistral", rope_theta=10000.0, sliding_window=7)
    torch.testing.assert_close(ours_forward(attention, x), expected, **TOLERANCE)
    with pytest.raises(ValueError, match="8 positions"):
        ours_forward(attention, torch.randn(1, 8, 32))
