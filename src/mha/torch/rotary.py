"""Rotary position embeddings (RoPE), the PyTorch face of `mha.numpy.rotary`.

Hugging Face Llama's "rotate half" convention: frequency i turns the pair made of
feature i and feature i + d_head / 2 by the angle position * base^(-2i / d_head).
The tables follow the dtype asked for: float64 tables are computed in float64;
the others in float32, exactly as Llama's `LlamaRotaryEmbedding`, then cast.
"""

import torch

from mha import validate
from mha.torch.tensors import check_is_tensor, check_tensor


def check_even_width(name, d_head):
    """RoPE turns features in pairs, so a head's width must be even."""
    if d_head % 2:
        raise ValueError(f"{name} has width d_head={d_head}, but rotary embeddings turn features "
                         f"in pairs: d_head must be even")




def rotary_embedding(T, d_head, base=10000.0, offset=0, *, dtype=None, device=None):
    """The rotation tables (cos, sin), each (T, d_head), for positions offset .. offset + T - 1.

    Column i and column i + d_head / 2 hold the same angle, position * base^(-2i / d_head).
    `dtype` defaults to torch's default dtype.
    """
    T, d_head = validate.check_int("T", T), validate.check_int("d_head", d_head)
    offset = validate.check_int("offset", offset, minimum=0)
    check_even_width("the rotary table", d_head)
    base = validate.check_base(base)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    work = torch.float64 if dtype == torch.float64 else torch.float32  # Llama's tables are float32
    inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=work, device=device) / d_head))  # (d/2,)
    angles = torch.arange(offset, offset + T, dtype=work, device=device)[:, None] * inv_freq  # (T, d/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, d_head): pair i and i + d/2 share an angle
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    """(x1, x2) -> (-x2, x1), where x1 and x2 are the first and second halves of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat([-x2, x1], dim=-1)  # (..., d)


def apply_rotary(x, cos, sin):
    """x rotated by the tables of `rotary_embedding`: x * cos + rotate_half(x) * sin.

    x: (..., T, d_head); cos, sin: (T, d_head) (or anything that broadcasts to x).
    Returns x's shape and dtype; the tables are cast to x's dtype, as Llama does.
    """
    check_tensor("x", x)
    check_even_width("x", x.shape[-1])
    for name, table in (("cos", cos), ("sin", sin)):
        check_is_tensor(name, table)
        validate.check_ndim(name, table, 2)
        if tuple(table.shape[-2:]) != tuple(x.shape[-2:]):
            raise ValueError(f"{name} has shape {validate.shape_str(table.shape)} but x has shape "
                             f"{validate.shape_str(x.shape)}: the tables need one row per position "
                             f"(T={x.shape[-2]}) and one column per feature (d_head={x.shape[-1]})")
        if table.device != x.device:
            raise ValueError(f"{name} is on {table.device}, x on {x.device}: make the tables with device=x.device")
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)
