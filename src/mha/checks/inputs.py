"""Seeded inputs that the cases of several chapters share: weights scaled like a
real initialisation, a mask with a query that may attend to nothing, and the
parameters of a multi-head attention layer."""

import numpy as np


def rng():
    """The same random numbers on every run of every check."""
    return np.random.default_rng(2026)


def weights(r, rows, cols):
    """A (rows, cols) weight matrix, scaled by 1/sqrt(rows)."""
    return r.standard_normal((rows, cols)) / np.sqrt(rows)


def a_masked_row(T_q, T_k, row):
    """A causal (T_q, T_k) mask in which query `row` may attend to nothing."""
    mask = np.tril(np.ones((T_q, T_k), dtype=bool))
    mask[row] = False
    return mask


def attention_params(r, d, bias=True):
    """W_q, W_k, W_v, W_o (and b_q ... b_o with bias=True) of mha.numpy.multihead_attention."""
    params = {f"W_{n}": weights(r, d, d) for n in "qkvo"}
    if bias:
        params.update({f"b_{n}": 0.3 * r.standard_normal(d) for n in "qkvo"})
    return params
