"""Rotary position embeddings (RoPE): positions enter attention as rotations of queries and keys.

Hugging Face Llama's "rotate half" convention: frequency i turns the pair made of
feature i and feature i + d_head / 2, by the angle position * base^(-2i / d_head).
A rotation R_m of query q at position m and R_n of key k at position n give the
score (R_m q) . (R_n k) = q . (R_(n - m) k): it depends on the positions only
through n - m.
"""

import math

import numpy as np

from mha import rope_scaling, validate
from mha.numpy.attention import as_float_array


def check_even_width(name, d_head):
    """RoPE turns features in pairs, so a head's width must be even."""
    if d_head % 2:
        raise ValueError(f"{name} has width d_head={d_head}, but rotary embeddings turn features "
                         f"in pairs: d_head must be even")




def rotary_embedding(T, d_head, base=10000.0, offset=0, *, dtype=np.float64, scaling=None):
    """The rotation tables (cos, sin), each (T, d_head), for positions offset .. offset + T - 1.

    Column i and column i + d_head / 2 hold the same angle, position * base^(-2i / d_head),
    as in Hugging Face's Llama. `dtype` is float64 or float32; float32 tables follow the same
    formula in float32, but NumPy rounds powers, cosines and sines in its own way: they are
    close to Llama's (within 1e-3 up to position 4095), not bitwise equal as the PyTorch face's are.
    `scaling` (see `rotary_frequencies`) changes the frequencies, and YaRN also scales both
    tables; dynamic NTK reads the length offset + T.
    """
    T, d_head = validate.check_int("T", T), validate.check_int("d_head", d_head)
    offset = validate.check_int("offset", offset, minimum=0)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    inv_freq, attention_factor = rotary_frequencies(d_head, base, scaling, seq_len=offset + T, dtype=dtype)  # (d/2,)
    angles = np.arange(offset, offset + T, dtype=dtype)[:, None] * inv_freq  # (T, d/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, d_head): pair i and i + d/2 share an angle
    if attention_factor == 1.0:
        return np.cos(angles), np.sin(angles)
    return np.cos(angles) * dtype.type(attention_factor), np.sin(angles) * dtype.type(attention_factor)


def rotary_frequencies(d_head, base=10000.0, scaling=None, *, seq_len=None, dtype=np.float64):
    """(inv_freq, attention_factor): the d_head / 2 frequencies of RoPE, (d_head / 2,), and the
    factor that scales cos and sin (1 except for YaRN), with a RoPE scaling applied if given.

    scaling: None, or a dict named as transformers' rope_parameters (see mha.rope_scaling):
    rope_type "linear" (every frequency divided by factor), "dynamic" (NTK: a larger base once
    seq_len passes max_position_embeddings), "yarn" (slow frequencies divided by factor, fast
    ones kept, a ramp between, and cos and sin scaled) or "llama3" (the same idea with a smooth
    blend by wavelength). seq_len: positions seen so far; only dynamic NTK reads it.
    """
    d_head = validate.check_int("d_head", d_head)
    check_even_width("the rotary table", d_head)
    base, scaling, dtype = validate.check_base(base), rope_scaling.check_rope_scaling(scaling), np.dtype(dtype)
    kind = "default" if scaling is None else scaling["rope_type"]
    if kind == "dynamic":
        seq_len = validate.check_int("seq_len", seq_len if seq_len is not None else 1)
        base = rope_scaling.dynamic_ntk_base(scaling, d_head, base, seq_len)
    exponents = np.arange(0, d_head, 2, dtype=dtype) / dtype.type(d_head)  # (d/2,)
    powers = dtype.type(base) ** exponents  # (d/2,)
    inv_freq = 1.0 / powers
    if kind == "linear":
        inv_freq = inv_freq / dtype.type(scaling["factor"])
    elif kind == "yarn":
        low, high = rope_scaling.yarn_ramp_range(scaling, d_head, base)
        ramp = np.clip((np.arange(d_head // 2, dtype=dtype) - low) / (high - low), 0, 1)  # (d/2,): 0 = keep
        inv_freq = inv_freq / dtype.type(scaling["factor"]) * ramp + inv_freq * (1 - ramp)
        return inv_freq.astype(dtype), rope_scaling.yarn_attention_factor(scaling)
    elif kind == "llama3":
        inv_freq = llama3_frequencies(scaling, inv_freq)
    return inv_freq.astype(dtype), 1.0


def ntk_frequencies(d_head, base, factor, seq_len, original_max):
    """Dynamic NTK-aware RoPE (transformers' rope_type "dynamic"): the d_head / 2 frequencies (d_head / 2,)
    for a sequence of seq_len positions, of a model trained on original_max positions. Up to original_max
    they are RoPE's own; beyond, the base grows with seq_len, faster for a larger factor."""
    scaling = {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": original_max}
    inv_freq, _ = rotary_frequencies(d_head, base, scaling, seq_len=seq_len)  # (d_head / 2,)
    return inv_freq


def llama3_frequencies(scaling, inv_freq):
    """Llama 3.1's: wavelengths longer than original / low_freq_factor divided by the factor, those
    shorter than original / high_freq_factor kept, and a smooth blend by wavelength between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq  # (d/2,)
    smooth = np.clip((context / wavelength - low) / (high - low), 0, 1)  # 0: long waves, 1: short ones
    return inv_freq / factor * (1 - smooth) + inv_freq * smooth


def rotate_half(x):
    """(x1, x2) -> (-x2, x1), where x1 and x2 are the first and second halves of the last axis."""
    x1, x2 = np.split(x, 2, axis=-1)  # (..., d/2) each
    return np.concatenate([-x2, x1], axis=-1)  # (..., d)


def apply_rotary(x, cos, sin):
    """x rotated by the tables of `rotary_embedding`: x * cos + rotate_half(x) * sin.

    x: (..., T, d_head); cos, sin: (T, d_head) (or anything that broadcasts to x).
    Pair (i, i + d_head / 2) of position t turns by its angle. Returns x's shape and dtype.
    """
    x = as_float_array("x", x)
    cos, sin = as_float_array("cos", cos), as_float_array("sin", sin)
    validate.check_sequence("x", x)
    check_even_width("x", x.shape[-1])
    for name, table in (("cos", cos), ("sin", sin)):
        validate.check_ndim(name, table, 2)
        if table.shape[-2:] != x.shape[-2:]:
            raise ValueError(f"{name} has shape {validate.shape_str(table.shape)} but x has shape "
                             f"{validate.shape_str(x.shape)}: the tables need one row per position "
                             f"(T={x.shape[-2]}) and one column per feature (d_head={x.shape[-1]})")
    cos, sin = cos.astype(x.dtype, copy=False), sin.astype(x.dtype, copy=False)
    return x * cos + rotate_half(x) * sin


def rotary_at(positions, d_head, base=10000.0, *, dtype=np.float64, scaling=None):
    """The tables (cos, sin) at integer `positions` (..., T): each (..., T, d_head).

    Where positions differ per sequence (left padding shifts them), each sequence gets its own
    rows. Dynamic NTK reads the length max(positions) + 1, as transformers does.
    """
    positions = np.asarray(positions)
    if positions.dtype.kind not in "iu" or positions.ndim < 1:
        raise ValueError(f"positions must be integers of shape (..., T), got dtype {positions.dtype} and shape "
                         f"{validate.shape_str(positions.shape)}")
    if positions.size and positions.min() < 0:
        raise ValueError(f"positions start at 0, got {positions.min()}")
    seq_len = int(positions.max()) + 1 if positions.size else 1
    inv_freq, factor = rotary_frequencies(d_head, base, scaling, seq_len=seq_len, dtype=dtype)  # (d/2,)
    angles = positions.astype(inv_freq.dtype)[..., None] * inv_freq  # (..., T, d/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (..., T, d_head)
    return (np.cos(angles) * factor).astype(dtype), (np.sin(angles) * factor).astype(dtype)
