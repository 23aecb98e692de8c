"""What `GroupedQueryAttention.from_llama` reads from a Hugging Face decoder attention layer and
its config, and what it refuses.

Our layer computes q, k, v and o projections, the default RoPE with one base, and softmax of
the scores scaled by head_dim ** -0.5 over every key it is given. A layer that does anything
else would be copied into a module that is silently wrong, so each feature below raises a
`ValueError` naming it, the config's `model_type` and the attention class. Both config layouts
of the `pretrained` extra are read: transformers 5 (`rope_parameters`, one dict per layer type
where the types differ) and transformers 4.56 or newer (`rope_theta` and `rope_scaling`; Gemma
3's `rope_local_base_freq` and `sliding_window_pattern`).
"""

import math


def rope_parameters(config):
    """A config's RoPE settings as a dict: transformers 5 keeps them in `config.rope_parameters`
    (one dict, or one per layer type); transformers 4 in `config.rope_theta` and `config.rope_scaling`."""
    rope = getattr(config, "rope_parameters", None)
    if rope:
        return dict(rope)
    scaling = getattr(config, "rope_scaling", None) or {}
    rope = {"rope_type": scaling.get("rope_type", scaling.get("type", "default"))}
    if getattr(config, "rope_theta", None) is not None:
        rope["rope_theta"] = config.rope_theta
    return rope


def is_per_layer_type(rope):
    """transformers 5 writes {"sliding_attention": {...}, "full_attention": {...}} when layer types differ."""
    return any(isinstance(value, dict) for value in rope.values())


def query_key_norms(attention, config):
    """Qwen3, OLMo2, Gemma 3: an RMSNorm of the queries and of the keys before RoPE."""
    norms = [name for name in ("q_norm", "k_norm") if getattr(attention, name, None) is not None]
    if norms:
        kind = type(getattr(attention, norms[0])).__name__
        return f"{' and '.join(norms)} ({kind} of the queries and keys before RoPE)"


def logit_softcapping(attention, config):
    """Gemma 2: scores become cap * tanh(scores / cap) before the softmax."""
    cap = getattr(attention, "attn_logit_softcapping", getattr(config, "attn_logit_softcapping", None))
    if cap is not None:
        return f"attn_logit_softcapping={cap} (scores become {cap} * tanh(scores / {cap}))"


def other_scaling(attention, config):
    """Gemma 2 and 3: scores scaled by query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5."""
    scalar = getattr(config, "query_pre_attn_scalar", None)
    scaling = getattr(attention, "scaling", None)
    if scaling is None and scalar is not None:
        scaling = scalar ** -0.5
    expected = attention.head_dim ** -0.5
    if scaling is not None and not math.isclose(scaling, expected, rel_tol=1e-9):
        source = "" if scalar is None else f", query_pre_attn_scalar={scalar}"
        return (f"a scaling other than head_dim ** -0.5 (scaling={scaling:.6g}{source}; "
                f"head_dim={attention.head_dim} gives {expected:.6g})")


def use_sliding_window(attention, config):
    """Qwen2 and Qwen3's use_sliding_window: a window on the layers from max_window_layers on."""
    if getattr(config, "use_sliding_window", False):
        return (f"use_sliding_window=True (a window of {getattr(config, 'sliding_window', None)} on the layers "
                f"from max_window_layers={getattr(config, 'max_window_layers', None)} on)")


def clipped_qkv(attention, config):
    """OLMo 1: queries, keys and values clamped to [-clip_qkv, clip_qkv]."""
    clip = getattr(config, "clip_qkv", None)
    if clip is not None:
        return f"clip_qkv={clip} (queries, keys and values clamped to [-{clip}, {clip}])"


def attention_sinks(attention, config):
    """GPT-OSS: a learned logit per head that joins the softmax and takes part of the weight."""
    if getattr(attention, "sinks", None) is not None:
        return "sinks (a learned logit per head in the softmax's denominator)"


def partial_rotary(attention, config):
    """GLM, StableLM: RoPE turns only the first partial_rotary_factor of each head's features."""
    factor = rope_parameters(config).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if factor is not None and factor != 1.0:
        return f"partial_rotary_factor={factor} (RoPE on part of each head's features; we turn them all)"


def per_layer_type_rope(attention, config):
    """Gemma 3: a RoPE for the sliding layers and another for the full ones."""
    rope = rope_parameters(config)
    if is_per_layer_type(rope):
        return f"per-layer-type RoPE parameters (rope_parameters has one dict per layer type: {sorted(rope)})"
    local = getattr(config, "rope_local_base_freq", None)
    if local is not None:  # transformers 4's layout; the pattern's last layer of each group is full
        pattern = vars(config).get("sliding_window_pattern", vars(config).get("_sliding_window_pattern"))
        return (f"per-layer-type RoPE parameters (rope_local_base_freq={local} on the sliding layers, "
                f"rope_theta={getattr(config, 'rope_theta', None)} on the full ones, "
                f"sliding_window_pattern={pattern})")


def rope_type(attention, config):
    """Llama 3, YaRN, linear, dynamic...: frequencies rescaled, which our tables do not do."""
    rope = rope_parameters(config)
    kind = rope.get("rope_type", "default")
    if not is_per_layer_type(rope) and kind != "default":
        return f"RoPE of type {kind!r} (it rescales the frequencies; we build the 'default' kind only)"


# Every feature that from_llama refuses, one test each: it returns what the layer has, or None.
LAYER_FEATURES = (
    query_key_norms,  # Qwen3, OLMo2, Gemma 3
    logit_softcapping,  # Gemma 2
    other_scaling,  # Gemma 2 and 3 (query_pre_attn_scalar)
    use_sliding_window,  # Qwen2 and Qwen3 when switched on
    clipped_qkv,  # OLMo 1 when switched on
    attention_sinks,  # GPT-OSS
)
ROPE_FEATURES = (  # checked only when rope_base is given: rope_base=None copies no RoPE at all
    per_layer_type_rope,  # Gemma 3
    rope_type,  # Llama 3 ('llama3'), YaRN, linear, dynamic
    partial_rotary,  # GLM, StableLM
)


def check_computable(attention, rope_base):
    """Raise a ValueError listing every feature of a transformers attention layer (and its config)
    that GroupedQueryAttention does not compute; then check that the RoPE base is `rope_base`."""
    config = getattr(attention, "config", None)
    features = LAYER_FEATURES + (ROPE_FEATURES if rope_base is not None else ())
    found = [what for test in features if (what := test(attention, config)) is not None]
    if found:
        raise ValueError(f"from_llama cannot compute {'; '.join(found)} of model_type="
                         f"{getattr(config, 'model_type', None)!r} ({type(attention).__name__}): the copy would "
                         f"be silently wrong. Expected a layer with the default RoPE on every feature, scores "
                         f"scaled by head_dim ** -0.5, no q_norm, k_norm, clipping, sinks or soft-capping, and "
                         f"no use_sliding_window")
    if rope_base is not None and config is not None:
        theta = rope_parameters(config).get("rope_theta", rope_base)
        if theta != rope_base:
            raise ValueError(f"the {type(attention).__name__} config has rope_theta={theta} but "
                             f"rope_base={rope_base}: pass rope_base={theta}")


def sliding_window(attention):
    """The layer's window (Mistral's config.sliding_window, or the layer's own for per-layer
    windows as Gemma 2's), or None: past it a query sees only the last `window` keys."""
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window
    return getattr(getattr(attention, "config", None), "sliding_window", None)
