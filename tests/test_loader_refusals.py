"""`GroupedQueryAttention.from_llama` on Hugging Face's decoder families: equal to the layer it
copies (Llama, Mistral, Qwen2, Qwen3, Gemma 1, 2 and 3, OLMo 1, 2 and 3, gpt-oss's sinks, each RoPE scaling), or a
ValueError naming what it cannot compute (clip_qkv, a partial RoPE, another RoPE type),
never a silently different answer.

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
from mha.torch.hf import configuration

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
    "olmo3": ("olmo3", "Olmo3", "Olmo3Config"),
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
    per_layer_type = "layer_type" in inspect.signature(rotary.forward).parameters  # Gemma 3, OLMo 3: one RoPE a type
    cos_sin = rotary(x, position_ids, configuration.layer_type(attention)) if per_layer_type else \
        rotary(x, position_ids)
    window = configuration.attention_options(attention, None)["sliding_window"]
    held = start if window is None or cache is None else min(start, window - 1)  # a window's cache keeps w - 1
    allowed = mt.causal_mask_after(T_new, held, window=window)  # (T, T_k): the model's mask for this layer
    causal = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]  # (1, 1, T, T_k)
    with torch.no_grad():
        return attention(x, cos_sin, causal, past_key_values=cache)[0]


def theta(attention):
    return configuration.layer_rope(attention)[0]


def ours_forward(attention, x, rope_base=10000.0, **kwargs):
    with torch.no_grad():
        return mt.GroupedQueryAttention.from_llama(attention, rope_base)(x, causal=True, **kwargs)[0]


# The families from_llama computes, each as Hugging Face builds it (changes from TINY), and the layer index.
LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=4)
EQUAL = {
    "Llama": ("llama", {}, 0),
    "Mistral, window 4 < T": ("mistral", dict(sliding_window=4), 0),
    "Qwen2, biases on q, k, v": ("qwen2", {}, 0),
    "Qwen2 use_sliding_window": ("qwen2", dict(use_sliding_window=True, sliding_window=3, max_window_layers=1), 1),
    "Qwen3, q_norm and k_norm per head": ("qwen3", {}, 0),
    "OLMo 2, q_norm and k_norm over all heads": ("olmo2", {}, 0),
    "Gemma 1, head_dim 16 != 32 / 4": ("gemma", dict(head_dim=16), 0),
    "Gemma 2, soft-cap 5, scalar 16, sliding layer": ("gemma2", dict(attn_logit_softcapping=5.0,
                                                                     query_pre_attn_scalar=16, sliding_window=3), 0),
    "Gemma 2, full layer": ("gemma2", dict(query_pre_attn_scalar=16), 1),
    "Gemma 3, sliding layer": ("gemma3", dict(layer_types=["sliding_attention", "full_attention"],
                                              sliding_window=4, query_pre_attn_scalar=8), 0),
    "Gemma 3, full layer": ("gemma3", dict(layer_types=["sliding_attention", "full_attention"],
                                           query_pre_attn_scalar=8), 1),
    "Gemma 3 with attn_logit_softcapping, which its attention ignores": ("gemma3", dict(
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=8, attn_logit_softcapping=5.0), 1),
    "OLMo 1 without clip_qkv": ("olmo", {}, 0),
    "gpt-oss, sinks, full layer": ("gpt_oss", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)), 1),
    "gpt-oss, sinks, sliding layer 3 < T, YaRN": ("gpt_oss", dict(sliding_window=3), 0),
    "OLMo 3, sliding layer 3 < T": ("olmo3", dict(sliding_window=3), 0),
    "Llama 3 RoPE": ("llama", dict(rope_parameters=LLAMA3), 0),
    "linear RoPE": ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=3.0)), 0),
    "YaRN RoPE": ("qwen2", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                     original_max_position_embeddings=4)), 0),
    "dynamic NTK RoPE past its length": ("llama", dict(max_position_embeddings=4, rope_parameters=dict(
        rope_type="dynamic", rope_theta=10000.0, factor=2.0)), 0),
}


NO_SDPA = {"gemma2", "gpt_oss"}  # Hugging Face's sdpa refuses soft-capping; gpt-oss has no sdpa path (sinks)


@pytest.mark.parametrize("family,changes,layer_idx,implementation", [
    (*value, implementation) for value in EQUAL.values() for implementation in ("eager", "sdpa")
    if not (value[0] in NO_SDPA and implementation == "sdpa")],
    ids=[f"{key}-{implementation}" for key, value in EQUAL.items() for implementation in ("eager", "sdpa")
         if not (value[0] in NO_SDPA and implementation == "sdpa")])
def test_from_llama_equals_the_families_it_computes(family, changes, layer_idx, implementation):
    attention, rotary = hf_layer(family, layer_idx, implementation=implementation, **changes)
    x = torch.randn(2, 7, 32)
    expected = hf_forward(attention, rotary, x)
    assert expected.abs().max() > 3  # the scale at which a missing feature would show
    torch.testing.assert_close(ours_forward(attention, x, theta(attention)), expected, **TOLERANCE)


@pytest.mark.parametrize("family,changes,layer_idx", [EQUAL[k] for k in (
    "Mistral, window 4 < T", "Gemma 2, soft-cap 5, scalar 16, sliding layer", "Gemma 3, sliding layer",
    "dynamic NTK RoPE past its length", "YaRN RoPE")], ids=["mistral", "gemma2", "gemma3", "dynamic", "yarn"])
def test_decoding_with_a_cache_equals_hugging_face_and_keeps_only_the_window(family, changes, layer_idx):
    attention, rotary = hf_layer(family, layer_idx, **changes)
    ours = mt.GroupedQueryAttention.from_llama(attention, theta(attention))
    x, cache, theirs = torch.randn(1, 9, 32), mt.KVCache(), transformers.DynamicCache(config=attention.config)
    for start, stop in [(0, 5), (5, 6), (6, 7), (7, 9)]:
        with torch.no_grad():
            got = ours(x[:, start:stop], causal=True, cache=cache)[0]
        expected = hf_forward(attention, rotary, x[:, start:stop], start, theirs)
        torch.testing.assert_close(got, expected, **TOLERANCE)
    window = ours.sliding_window
    assert cache.position == 9 and len(cache) == (9 if window is None else window - 1)


def test_each_feature_matters_a_copy_without_it_differs():
    """Switch each copied feature off again: the copy then differs from Hugging Face by far more
    than rounding, so the tests above would catch a loader that dropped it."""
    x = torch.randn(2, 7, 32)
    for key, feature in [("Gemma 2, soft-cap 5, scalar 16, sliding layer", "logit_cap"),
                         ("Gemma 2, soft-cap 5, scalar 16, sliding layer", "scale"),
                         ("Gemma 2, soft-cap 5, scalar 16, sliding layer", "sliding_window"),
                         ("Qwen3, q_norm and k_norm per head", "qk_norm"),
                         ("OLMo 2, q_norm and k_norm over all heads", "qk_norm"),
                         ("Llama 3 RoPE", "rope_scaling"), ("YaRN RoPE", "rope_scaling"),
                         ("gpt-oss, sinks, full layer", "sinks"),
                         ("gpt-oss, sinks, sliding layer 3 < T, YaRN", "sliding_window"),
                         ("OLMo 3, sliding layer 3 < T", "sliding_window")]:
        family, changes, layer_idx = EQUAL[key]
        attention, rotary = hf_layer(family, layer_idx, **changes)
        ours = mt.GroupedQueryAttention.from_llama(attention, theta(attention))
        setattr(ours, feature, None)
        if feature == "rope_scaling":
            ours.rotary = mt.rotary.RotaryTables(ours.d_head, ours.rope_base)
        with torch.no_grad():
            gap = ours(x, causal=True)[0] - hf_forward(attention, rotary, x)
        assert gap.abs().max() > 1e-3, (key, feature)


def test_qwen2_copies_biases_on_q_k_v_and_none_on_o():
    attention, _ = hf_layer("qwen2")
    ours = mt.GroupedQueryAttention.from_llama(attention)
    assert attention.o_proj.bias is None and torch.equal(ours.W_o.bias, torch.zeros(32))
    for mine, theirs in [(ours.W_q, attention.q_proj), (ours.W_k, attention.k_proj), (ours.W_v, attention.v_proj)]:
        assert torch.equal(mine.bias, theirs.bias) and theirs.bias.abs().max() > 0


def test_gemma_3_reads_each_layer_types_rope():
    changes = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                   rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10.0),
                                    "full_attention": dict(rope_type="linear", rope_theta=1e6, factor=8.0)})
    sliding, _ = hf_layer("gemma3", 0, **changes)
    full, _ = hf_layer("gemma3", 1, **changes)
    assert configuration.layer_rope(sliding) == (10.0, None)
    assert configuration.layer_rope(full) == (1e6, {"rope_type": "linear", "factor": 8.0})
    with pytest.raises(ValueError, match=re.escape("rope_theta=10.0 for this layer but rope_base=1000000.0")):
        mt.GroupedQueryAttention.from_llama(sliding, 1e6)


def refusal(attention, rope_base=10000.0):
    with pytest.raises(ValueError) as error:
        mt.GroupedQueryAttention.from_llama(attention, rope_base)
    return str(error.value)


# family, changes from TINY, layer index, what the message must name.
REFUSED = {
    "GLM partial RoPE": ("glm", {}, 0, ["partial_rotary_factor=0.5 (RoPE on part of each head's features"]),
    "OLMo 1 clip_qkv": ("olmo", dict(clip_qkv=0.5), 0, ["clip_qkv=0.5 (queries, keys and values clamped"]),
    "LongRoPE": ("llama", dict(rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 4,
                                                    long_factor=[2.0] * 4, original_max_position_embeddings=4)),
                 0, ["RoPE of type 'longrope'"]),
}


@pytest.mark.parametrize("family,changes,layer_idx,features", REFUSED.values(), ids=REFUSED.keys())
def test_from_llama_refuses_naming_the_feature_model_type_and_class(family, changes, layer_idx, features):
    attention, _ = hf_layer(family, layer_idx, **changes)
    message = refusal(attention)
    for named in [*features, f"model_type={attention.config.model_type!r}", type(attention).__name__]:
        assert named in message, f"{named!r} not in {message!r}"


@pytest.mark.parametrize("family,changes,layer_idx,features",
                         [v for k, v in REFUSED.items() if k != "LongRoPE"], ids=[k for k in REFUSED if k != "LongRoPE"])
def test_each_refusal_is_needed_a_copy_ignoring_it_differs(family, changes, layer_idx, features, monkeypatch):
    """Were the check skipped, the copy would differ from Hugging Face at T = 7 by far more than rounding."""
    attention, rotary = hf_layer(family, layer_idx, **changes)
    x = torch.randn(2, 7, 32)
    monkeypatch.setattr(configuration, "refused_features", lambda attention: [])
    monkeypatch.setattr(configuration, "layer_rope", lambda attention: (10000.0, None))
    gap = (ours_forward(attention, x) - hf_forward(attention, rotary, x))
    assert gap.abs().max() > 1e-3


def test_an_unknown_norm_is_refused():
    attention, _ = hf_layer("qwen3")
    attention.q_norm = type("MysteryNorm", (torch.nn.Module,), {})()
    assert "a norm of class MysteryNorm" in refusal(attention)


def transformers_4_config(**fields):
    """A config as transformers 4.56 lays it out: rope_theta and rope_scaling, no rope_parameters."""
    return types.SimpleNamespace(**{"rope_scaling": None, "max_position_embeddings": 4, **fields})


def test_a_transformers_4_gemma_3_config_gives_its_sliding_layers_the_local_base():
    changes = dict(layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=8)
    for layer_idx, expected in [(0, 1e4), (1, 1e6)]:
        attention, _ = hf_layer("gemma3", layer_idx, **changes)
        attention.config = transformers_4_config(model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
                                                 sliding_window=4096, query_pre_attn_scalar=8)
        assert configuration.layer_rope(attention) == (expected, None)


@pytest.mark.parametrize("fields,expected", [
    (dict(model_type="llama", rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 4.0}),
     dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    (dict(model_type="llama", rope_theta=10000.0, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
     dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4})),
    (dict(model_type="gemma2", rope_theta=10000.0, attn_logit_softcapping=30.0), dict(logit_cap=30.0)),
    (dict(model_type="gemma2", rope_theta=10000.0, query_pre_attn_scalar=16), dict(scale=0.25)),
    (dict(model_type="mistral", rope_theta=10000.0, sliding_window=7), dict(sliding_window=7)),
], ids=["rope_scaling linear", "rope_scaling dynamic", "soft-cap", "query_pre_attn_scalar", "window"])
def test_a_transformers_4_config_is_read(fields, expected):
    """The config's own fields alone are enough: on a Llama layer."""
    attention, _ = hf_layer("llama")
    attention.config = transformers_4_config(**fields)
    del attention.scaling  # so the config's query_pre_attn_scalar is the only word on the scaling
    options = configuration.attention_options(attention, 10000.0)
    assert {key: options[key] for key in expected} == expected


@pytest.mark.parametrize("fields,named", [
    (dict(model_type="stablelm", rope_theta=10000.0, partial_rotary_factor=0.25), "partial_rotary_factor=0.25"),
    (dict(model_type="llama", rope_theta=10000.0, rope_scaling={"rope_type": "su", "factor": 2.0}), "type 'su'"),
], ids=["partial_rotary_factor", "unknown type"])
def test_a_transformers_4_config_is_refused(fields, named):
    attention, _ = hf_layer("llama")
    attention.config = transformers_4_config(**fields)
    message = refusal(attention)
    assert named in message and f"model_type={fields['model_type']!r} (LlamaAttention)" in message


def test_a_layer_with_attention_dropout_copies_for_inference_and_refuses_train_by_name():
    """The copy computes without dropout: a layer whose attention_dropout is set is copied in eval() mode
    (equal to transformers' eval), and train() is refused, naming the field; with dropout 0, train() is fine."""
    attention, rotary = hf_layer("llama", attention_dropout=0.5)
    with pytest.raises(ValueError, match="attention_dropout=0.5"):
        mt.GroupedQueryAttention.from_llama(attention.train(), rope_base=theta(attention))
    ours = mt.GroupedQueryAttention.from_llama(attention.eval(), rope_base=theta(attention))
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(ours(x, causal=True)[0], hf_forward(attention, rotary, x), **TOLERANCE)
    with pytest.raises(ValueError, match="attention_dropout"):
        ours.train()
    without, _ = hf_layer("llama", attention_dropout=0.0)
    assert mt.GroupedQueryAttention.from_llama(without.train(), rope_base=theta(without)).training
