"""Positions: how attention, which sees a set of vectors, learns the order of a sequence.

Three ways, each in both faces (chapter 10):
- a learned absolute table, one vector per position, added to the tokens (`add_positions`);
- the sinusoidal encoding of Vaswani et al., a fixed table of sines and cosines
  (`sinusoidal_positions`);
- ALiBi (Press et al.), no vectors at all: a penalty on the scores that grows with the
  distance between query and key (`alibi_slopes`, `alibi_bias`), handed to
  `scaled_dot_product_attention(..., bias=...)`.
Rotary embeddings, a fourth way, live in `rotary.py` (chapter 12).
"""

import math

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array






def sinusoidal_frequencies(d_model, base=10000.0):
    """The frequency of each (sin, cos) pair: theta_i = base^(-2i / d_model), shape (d_model / 2,)."""
    d_model, base = validate.check_even_model_width(d_model), validate.check_base(base)
    return base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (d_model / 2,)


def sinusoidal_positions(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    """Vaswani et al.'s encoding of positions offset .. offset + T - 1, shape (T, d_model).

    PE[t, 2i] = sin(t * theta_i) and PE[t, 2i + 1] = cos(t * theta_i), with
    theta_i = base^(-2i / d_model): pair i turns at its own speed, from one turn
    every 2 pi positions (i = 0) to one every 2 pi * base positions. Computed in
    float64, returned as `dtype`.
    """
    T = validate.check_int("T", T, minimum=0)
    offset = validate.check_int("offset", offset, minimum=0)
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise TypeError(f"dtype must be a floating-point dtype, got {np.dtype(dtype)}")
    theta = sinusoidal_frequencies(d_model, base)  # (d_model / 2,)
    angles = np.arange(offset, offset + T, dtype=np.float64)[:, None] * theta  # (T, d_model / 2)
    table = np.stack([np.sin(angles), np.cos(angles)], axis=-1)  # (T, d_model / 2, 2)
    return table.reshape(T, d_model).astype(dtype)  # (T, d_model): sin, cos, sin, cos, ...


def sinusoidal_shift(k, d_model, *, base=10000.0):
    """The (d_model, d_model) rotation R_k with PE[t + k] = PE[t] @ R_k for every position t.

    Block-diagonal: pair i is turned by the angle k * theta_i, whatever t is. In the
    row-vector convention, (sin a, cos a) @ [[cos b, -sin b], [sin b, cos b]] is
    (sin(a + b), cos(a + b)).
    """
    k = validate.check_int("k", k, minimum=0)
    theta = sinusoidal_frequencies(d_model, base)  # (d_model / 2,)
    R = np.zeros((d_model, d_model))
    for i, angle in enumerate(k * theta):
        c, s = math.cos(angle), math.sin(angle)
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]  # one 2 x 2 rotation per pair
    return R


def add_positions(X, table, *, offset=0):
    """X plus the rows of a position table for its positions: X + table[offset:offset + T].

    X: (..., T, d); table: (max_len, d), learned or fixed. Position t of X gets row
    offset + t. A table knows max_len positions and no more: a longer sequence is an error.
    """
    X, table = as_float_array("X", X), as_float_array("table", table)
    validate.check_sequence("X", X)
    T = X.shape[-2]
    validate.check_position_table(table.shape, T, X.shape[-1], offset)
    return X + table[offset:offset + T].astype(X.dtype, copy=False)  # (..., T, d)


def alibi_slopes(n_heads):
    """Press et al.'s slopes, one per head, shape (h,).

    For h a power of 2: 2^(-8k / h) for k = 1 .. h (h = 8: 1/2, 1/4, ..., 1/256).
    Otherwise: the slopes of the power of 2 just below h, then every other slope
    of twice that power, until there are h.
    """
    n_heads = validate.check_int("n_heads", n_heads)
    below = 2 ** int(math.floor(math.log2(n_heads)))  # the largest power of 2 <= h
    slopes = [2.0 ** (-8 * k / below) for k in range(1, below + 1)]
    if below < n_heads:
        slopes += list(alibi_slopes(2 * below)[0::2][:n_heads - below])
    return np.array(slopes)


def alibi_bias(T_q, T_k, slopes):
    """ALiBi's bias on the scores, -m_h * |(position of query i) - j|, shape (h, T_q, T_k).

    The T_q queries are the last T_q of the T_k positions: query i sits at
    position T_k - T_q + i, as when a key-value cache holds the earlier keys.
    Add it to the scores before the softmax, with or without a causal mask.
    """
    T_q, T_k = validate.check_int("T_q", T_q), validate.check_int("T_k", T_k)
    if T_q > T_k:
        raise ValueError(f"T_q={T_q} queries cannot be the last of only T_k={T_k} positions: "
                         f"ALiBi needs T_q <= T_k")
    slopes = as_float_array("slopes", slopes)
    validate.check_ndim("slopes", slopes, 1, 1)
    query_at = np.arange(T_k - T_q, T_k)[:, None]  # (T_q, 1): each query's position
    distance = np.abs(query_at - np.arange(T_k))  # (T_q, T_k), integers
    return slopes[:, None, None] * (-distance).astype(slopes.dtype)  # (h, T_q, T_k); no -0.0, float32 stays
