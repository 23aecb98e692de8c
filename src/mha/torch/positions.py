"""Positions, the PyTorch face of `mha.numpy.positions` (chapter 10).

The same functions (tables and biases made with `dtype` and `device` keywords),
and two modules that add positions to a sequence: `LearnedPositions`, a trained
table, and `SinusoidalPositions`, Vaswani et al.'s fixed one. ALiBi's bias goes to
`scaled_dot_product_attention(..., bias=...)` or `MultiHeadAttention(..., bias=...)`.
The sinusoidal table is computed in float64 and cast, as in the NumPy face.
"""

import math

import torch
from torch import nn

from mha import validate
from mha.torch.tensors import check_input, check_is_tensor, check_tensor






def sinusoidal_positions(T, d_model, *, base=10000.0, offset=0, dtype=None, device=None):
    """Vaswani et al.'s encoding of positions offset .. offset + T - 1, shape (T, d_model).

    PE[t, 2i] = sin(t * theta_i), PE[t, 2i + 1] = cos(t * theta_i), theta_i = base^(-2i / d_model).
    Computed in float64, returned as `dtype` (default: torch's default dtype).
    """
    T = validate.check_int("T", T, minimum=0)
    offset = validate.check_int("offset", offset, minimum=0)
    d_model, base = validate.check_even_model_width(d_model), validate.check_base(base)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    theta = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)  # (d/2,)
    angles = torch.arange(offset, offset + T, dtype=torch.float64, device=device)[:, None] * theta  # (T, d/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, d_model / 2, 2)
    return table.reshape(T, d_model).to(dtype)  # (T, d_model): sin, cos, sin, cos, ...


def add_positions(x, table, *, offset=0):
    """x + table[offset:offset + T]: x (..., T, d), table (max_len, d) on x's device."""
    check_tensor("x", x)
    check_is_tensor("table", table)
    T = x.shape[-2]
    validate.check_position_table(tuple(table.shape), T, x.shape[-1], offset)
    if table.device != x.device:
        raise ValueError(f"table is on {table.device}, x on {x.device}: move one with .to()")
    return x + table[offset:offset + T].to(x.dtype)  # (..., T, d)


def alibi_slopes(n_heads, *, dtype=None, device=None):
    """Press et al.'s slopes, one per head, shape (h,): 2^(-8k / h) for k = 1 .. h when h is a
    power of 2; otherwise those of the power of 2 below h, then every other one of twice it."""
    n_heads = validate.check_int("n_heads", n_heads)
    below = 2 ** int(math.floor(math.log2(n_heads)))  # the largest power of 2 <= h
    slopes = [2.0 ** (-8 * k / below) for k in range(1, below + 1)]
    if below < n_heads:
        slopes += alibi_slopes(2 * below, dtype=torch.float64)[0::2][:n_heads - below].tolist()
    return torch.tensor(slopes, dtype=dtype or torch.get_default_dtype(), device=device)


def alibi_bias(T_q, T_k, slopes):
    """ALiBi's bias -m_h * |i - j|, shape (h, T_q, T_k), on slopes' device and in its dtype.

    Query i sits at position T_k - T_q + i (the last T_q of T_k positions).
    """
    T_q, T_k = validate.check_int("T_q", T_q), validate.check_int("T_k", T_k)
    if T_q > T_k:
        raise ValueError(f"T_q={T_q} queries cannot be the last of only T_k={T_k} positions: "
                         f"ALiBi needs T_q <= T_k")
    check_is_tensor("slopes", slopes)
    validate.check_ndim("slopes", slopes, 1, 1)
    if not slopes.is_floating_point():
        raise TypeError(f"slopes must be a floating-point tensor, got dtype {slopes.dtype}")
    query_at = torch.arange(T_k - T_q, T_k, device=slopes.device)[:, None]  # (T_q, 1)
    distance = (query_at - torch.arange(T_k, device=slopes.device)).abs()  # (T_q, T_k), integers
    return slopes[:, None, None] * (-distance).to(slopes.dtype)  # (h, T_q, T_k); no -0.0


class LearnedPositions(nn.Module):
    """A learned absolute position table: forward(x, offset=0) = x + table[offset:offset + T].

    `table` is an nn.Parameter of shape (max_len, d_model), initialised like
    nn.Embedding's weight: N(0, 1). Scale it after construction if you want smaller
    starting vectors (GPT-2 uses a standard deviation of 0.01 or 0.02), e.g.
    `with torch.no_grad(): positions.table.mul_(0.02)`. A sequence longer than
    max_len is an error: the table has no row for position max_len.
    """

    def __init__(self, max_len, d_model, *, device=None, dtype=None):
        super().__init__()
        self.max_len = validate.check_int("max_len", max_len)
        self.d_model = validate.check_int("d_model", d_model)
        self.table = nn.Parameter(torch.randn(max_len, d_model, device=device, dtype=dtype))

    def forward(self, x, offset=0):
        check_input(self, "x", x, self.d_model)
        return add_positions(x, self.table, offset=offset)  # (..., T, d_model)

    def numpy_params(self):
        """{"table": (max_len, d_model)} as NumPy, for `mha.numpy.add_positions`."""
        return {"table": self.table.detach().cpu().numpy()}

    def extra_repr(self):
        return f"max_len={self.max_len}, d_model={self.d_model}"


class SinusoidalPositions(nn.Module):
    """Vaswani et al.'s fixed encoding: forward(x, offset=0) = x + PE[offset:offset + T].

    No parameters: the table is made for each call on x's device and in x's dtype,
    so any length works.
    """

    def __init__(self, d_model, *, base=10000.0):
        super().__init__()
        self.d_model = validate.check_even_model_width(d_model)
        self.base = validate.check_base(base)

    def forward(self, x, offset=0):
        check_tensor("x", x, self.d_model)
        table = sinusoidal_positions(x.shape[-2], self.d_model, base=self.base, offset=offset,
                                     dtype=x.dtype, device=x.device)  # (T, d_model)
        return x + table

    def extra_repr(self):
        return f"d_model={self.d_model}, base={self.base}"
