"""Rotary position embeddings (RoPE): positions enter attention as rotations of queries and keys.

Hugging Face Llama's "rotate half" convention: frequency i turns the pair made of
feature i and feature i + d_head / 2, by the angle position * base^(-2i / d_head).
A rotation R_m of query q at position m and R_n of key k at position n give the
score (R_m q) . (R_n k) = q . (R_(n - m) k): it depends on the positions only
through n - m.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array


def check_even_width(name, d_head):
    """RoPE turns features in pairs, so a head's width must be even."""
    if d_head % 2:
        raise ValueError(f"{name} has width d_head={d_head}, but rotary embeddings turn features "
                         f"in pairs: d_head must be even")




def rotary_embedding(T, d_head, base=10000.0, offset=0, *, dtype=np.float64):
    """The rotation tables (cos, sin), each (T, d_head), for positions offset .. offset + T - 1.

    Column i and column i + d_head / 2 hold the same angle, position * base^(-2i / d_head),
    as in Hugging Face's Llama. `dtype` is float64 or float32; float32 tables follow the same
    formula in float32, but NumPy rounds powers, cosines and sines in its own way: they are
    close to Llama's (within 1e-3 up to position 4095), not bitwise equal as the PyTorch face's are.
    """
    T, d_head = validate.check_int("T", T), validate.check_int("d_head", d_head)
    offset = validate.check_int("offset", offset, minimum=0)
    check_even_width("the rotary table", d_head)
    base, dtype = validate.check_base(base), np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    inv_freq = 1.0 / (dtype.type(base) ** (np.arange(0, d_head, 2, dtype=dtype) / dtype.type(d_head)))  # (d/2,)
    angles = np.arange(offset, offset + T, dtype=dtype)[:, None] * inv_freq  # (T, d/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, d_head): pair i and i + d/2 share an angle
    return np.cos(angles), np.sin(angles)


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
