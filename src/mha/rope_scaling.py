"""RoPE scaling: the checks and the scalar arithmetic shared by both faces' rotary tables.

A scaling is a dict named as transformers' `rope_parameters` are (rope_type, factor, ...):
linear position interpolation (Chen et al., 2023), dynamic NTK (bloc97 and emozilla, 2023),
YaRN (Peng et al., 2023) and Llama 3's (Meta, 2024). `mha.numpy.rotary` and
`mha.torch.rotary` turn it into frequencies; this module only checks it and computes the
numbers that are the same in both (YaRN's attention factor and ramp, dynamic NTK's base).
"""

import math

# rope_type -> (required, optional) keys
ROPE_SCALINGS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
}


def check_rope_scaling(scaling):
    """None, or a dict {"rope_type": ..., its keys}: returned as a plain dict, checked.

    The keys and their meaning are those of transformers' rope_parameters (rope_theta aside,
    which is `base`); "dynamic" also needs the model's max_position_embeddings. Any other
    rope_type or key is refused: a scaling that is not computed must not be ignored."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict) or "rope_type" not in scaling:
        raise TypeError(f"scaling must be None or a dict with a 'rope_type', got {scaling!r}")
    kind = scaling["rope_type"]
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"rope_type must be one of {sorted(ROPE_SCALINGS)}, got {kind!r}")
    required, optional = ROPE_SCALINGS[kind]
    missing = [key for key in required if scaling.get(key) is None]
    unknown = sorted(set(scaling) - {"rope_type", "rope_theta", *required, *optional})
    if missing or unknown:
        raise ValueError(f"RoPE scaling {kind!r} needs {list(required)} and may have {list(optional)}; "
                         f"missing: {missing}, not computed here: {unknown}")
    for key in ("factor", "max_position_embeddings", "original_max_position_embeddings"):
        if key in required and not scaling[key] > 0:
            raise ValueError(f"RoPE scaling {kind!r}: {key} must be > 0, got {scaling[key]!r}")
    if kind == "llama3" and scaling["high_freq_factor"] == scaling["low_freq_factor"]:
        raise ValueError("RoPE scaling 'llama3': high_freq_factor must differ from low_freq_factor")
    return dict(scaling)


def yarn_attention_factor(scaling):
    """YaRN's scale of cos and sin: attention_factor if given, else 0.1 ln(factor) + 1
    (or the ratio of two such terms with mscale and mscale_all_dim), as in transformers."""
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]

    def magnitude(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(magnitude(factor, mscale) / magnitude(factor, mscale_all_dim))
    return magnitude(factor)


def yarn_ramp_range(scaling, d_head, base):
    """(low, high): the dimensions between which YaRN blends interpolated and original frequencies."""
    def dimension(rotations):
        return (d_head * math.log(scaling["original_max_position_embeddings"] / (rotations * 2 * math.pi))
                / (2 * math.log(base)))

    low, high = dimension(scaling.get("beta_fast") or 32), dimension(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    return low, (high + 0.001 if low == high else high)


def dynamic_ntk_base(scaling, d_head, base, seq_len):
    """Dynamic NTK's base for a sequence of seq_len positions (unchanged up to max_position_embeddings)."""
    factor, longest = scaling["factor"], scaling["max_position_embeddings"]
    seq_len = max(seq_len, longest)
    return base * ((factor * seq_len / longest) - (factor - 1)) ** (d_head / (d_head - 2))
