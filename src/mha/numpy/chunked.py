"""Attention in bounded memory: keys and values in blocks, with an online softmax.

`chunked_attention` computes exactly what `mha.numpy.scaled_dot_product_attention`
computes, softmax(Q K^T / sqrt(d_k)) V, without ever holding the T_q x T_k matrix
of scores. It walks over the keys `chunk` at a time and keeps, for every query,
three running quantities:

    row_max  the largest score seen so far                              (..., T_q, 1)
    row_sum  the sum of exp(score - row_max) over the keys seen so far  (..., T_q, 1)
    acc      the sum of exp(score - row_max) * value, same keys         (..., T_q, d_v)

When a block brings a larger maximum, the old `row_sum` and `acc` were computed
relative to the old maximum, so both are multiplied by exp(old_max - new_max)
before the block's own terms are added. At the end, out = acc / row_sum. (float16
inputs are computed in float32 and the output rounded back once, at the end: a
float16 row_sum stops growing at 2048, and 70,000 keys would overflow it.) This is the
"online softmax" of Milakov and Gimelshein (2018), the idea behind
FlashAttention (Dao et al., 2022).

Import it as `mha.numpy.chunked_attention`; the PyTorch twin is
`mha.torch.chunked_attention`.
"""

import math

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array, as_mask, at_least_float32, transpose


def chunked_attention(Q, K, V, mask=None, chunk=256):
    """softmax(Q K^T / sqrt(d_k)) V, computed `chunk` keys at a time in O(T_q * chunk) memory.

    Q: (..., T_q, d_k), K: (..., T_k, d_k), V: (..., T_k, d_v); mask (True = may
    attend) broadcasts to (..., T_q, T_k). Returns only out (..., T_q, d_v): the
    weights would be the T_q x T_k matrix this function exists to avoid.
    A query with nothing to attend to gets a zero output, as elsewhere.
    """
    Q, K, V = (as_float_array(n, a) for n, a in (("Q", Q), ("K", K), ("V", V)))
    batch = validate.check_qkv(Q, K, V)
    validate.check_int("chunk", chunk)
    shape = (*batch, Q.shape[-2], K.shape[-2])  # (..., T_q, T_k): never allocated
    mask = None if mask is None else np.broadcast_to(as_mask(mask, shape), shape)  # a view
    out_dtype = np.result_type(Q, K, V)
    Q = at_least_float32(Q) / math.sqrt(Q.shape[-1])  # scale the queries once, not every block of scores
    Q = np.broadcast_to(Q, (*shape[:-2], *Q.shape[-2:]))  # a view: blocks get the full batch shape
    dtype = np.result_type(Q, K, V)  # the running quantities': float32 for float16 inputs
    row_max = np.full((*shape[:-1], 1), -np.inf, dtype=dtype)  # (..., T_q, 1)
    row_sum = np.zeros_like(row_max)  # (..., T_q, 1)
    acc = np.zeros((*shape[:-1], V.shape[-1]), dtype=dtype)  # (..., T_q, d_v)
    for start in range(0, shape[-1], chunk):
        block = slice(start, start + chunk)
        scores = Q @ transpose(K[..., block, :])  # (..., T_q, c): the only big array
        if mask is not None:
            scores[~mask[..., block]] = -np.inf
        new_max = np.maximum(row_max, scores.max(axis=-1, keepdims=True))  # (..., T_q, 1)
        safe_max = np.where(np.isfinite(new_max), new_max, 0)  # no key allowed yet: avoid -inf - (-inf)
        rescale = np.exp(row_max - safe_max)  # (..., T_q, 1): old terms, relative to the new maximum
        scores -= safe_max  # in place, then exp in place: no second block
        p = np.exp(scores, out=scores)  # (..., T_q, c); 0 where masked
        row_sum = row_sum * rescale + p.sum(axis=-1, keepdims=True)
        acc = acc * rescale + p @ V[..., block, :]
        row_max = new_max
    out = np.divide(acc, row_sum, out=np.zeros_like(acc), where=row_sum != 0)  # empty rows stay 0; NaN stays NaN
    return out.astype(out_dtype, copy=False)
