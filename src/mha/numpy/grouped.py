"""Grouped-query attention: several query heads share one key/value head.

With h query heads and h_kv key/value heads (h_kv divides h), query head j reads
key/value head j // (h / h_kv), Llama's convention. h_kv = h is multi-head
attention; h_kv = 1 is multi-query attention. Fewer key/value heads mean a smaller
key-value cache, which is what generation is short of.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import (as_float_array, as_mask, matrix, merge_heads, project,
                                  scaled_dot_product_attention, sequences, split_heads)
from mha.numpy.cache import KVCache
from mha.numpy.rotary import apply_rotary, rotary_embedding


def repeat_kv(x, n_rep):
    """(..., h_kv, T, d) -> (..., h_kv * n_rep, T, d): output head j is input head j // n_rep.

    Each key/value head is repeated n_rep times in a row (as np.repeat on the head
    axis, or torch.repeat_interleave), so consecutive query heads share it.
    """
    x = np.asarray(x)
    validate.check_ndim("x", x, 3)
    n_rep = validate.check_int("n_rep", n_rep)
    *batch, h_kv, T, d = x.shape
    x = np.broadcast_to(x[..., None, :, :], (*batch, h_kv, n_rep, T, d))  # (..., h_kv, n_rep, T, d), no copy
    return x.reshape(*batch, h_kv * n_rep, T, d)  # (..., h_kv * n_rep, T, d)


def causal_mask_after(T_new, T_past):
    """(T_new, T_past + T_new) boolean: new query t (at position T_past + t) sees every cached
    key and the new keys up to itself."""
    return np.tri(T_new, T_past + T_new, k=T_past, dtype=bool)


def attend_with_cache(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None, rope_base=None):
    """One attention step after T_past cached positions, with grouped heads.

    q: (..., h, T_new, d_head), new queries; k, v: (..., h_kv, T_new, d_head), new keys and
    values, not yet rotated; past_keys, past_values: (..., h_kv, T_past, d_head), already
    rotated, or None for an empty cache. The new positions are T_past .. T_past + T_new - 1:
    with `rope_base`, q and k turn by those positions. causal=True lets new query t see all
    cached keys and the new ones up to itself; `mask` (..., h, T_new, T_past + T_new) must
    allow a key too. Returns out (..., h, T_new, d_head), weights (..., h, T_new, T_past + T_new),
    and keys, values (..., h_kv, T_past + T_new, d_head), the cache to keep.
    """
    q, k, v = (as_float_array(name, a) for name, a in (("q", q), ("k", k), ("v", v)))
    cache = KVCache()
    if (past_keys is None) != (past_values is None):
        raise ValueError("give both past_keys and past_values, or neither (an empty cache)")
    if past_keys is not None:
        cache.append(as_float_array("past_keys", past_keys), as_float_array("past_values", past_values))
    for name, a in (("q", q), ("k", k)):
        validate.check_ndim(name, a, 3)
    validate.check_cache_entries(cache.keys, cache.values, k, v)
    n_rep = validate.check_group_sizes(q.shape[-3], k.shape[-3])
    T_past, T_new = len(cache), q.shape[-2]
    if rope_base is not None:
        cos, sin = rotary_embedding(T_new, q.shape[-1], rope_base, offset=T_past,  # (T_new, d_head)
                                    dtype=np.float64 if q.dtype == np.float64 else np.float32)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    keys, values = cache.append(k, v)  # (..., h_kv, T_past + T_new, d_head)
    if causal:
        causal_part = causal_mask_after(T_new, T_past)  # (T_new, T_past + T_new)
        mask = causal_part if mask is None else as_mask(mask, (*q.shape[:-2], T_new, len(cache))) & causal_part
    out, weights = scaled_dot_product_attention(q, repeat_kv(keys, n_rep), repeat_kv(values, n_rep), mask)
    return out, weights, keys, values


def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, *, mask=None, causal=False,
                            rope_base=None, b_q=None, b_k=None, b_v=None, b_o=None, cache=None):
    """Self-attention with n_heads query heads sharing n_kv_heads key/value heads.

    X: (..., T, d_model); W_q: (d_model, h * d_head); W_k, W_v: (d_model, h_kv * d_head);
    W_o: (h * d_head, d_model). With `rope_base`, queries and keys are rotated at their
    positions (0 .. T - 1, or after the cache's length). With a `KVCache`, the new keys and
    values are appended to it and the queries attend to everything cached. Returns
    out (..., T, d_model) and weights (..., h, T, T_k), where T_k = len(cache) or T.
    """
    X, _ = sequences(X)
    validate.check_group_sizes(n_heads, n_kv_heads)
    W_q, W_k = matrix("W_q", W_q, X.shape[-1], "X"), matrix("W_k", W_k, X.shape[-1], "X")
    validate.check_divisible(W_q.shape[1], n_heads, "the width of W_q")
    d_head = W_q.shape[1] // n_heads
    for name, W in (("W_k", W_k), ("W_v", matrix("W_v", W_v, X.shape[-1], "X"))):
        if W.shape[1] != n_kv_heads * d_head:
            raise ValueError(f"{name} has shape {validate.shape_str(W.shape)}, but n_kv_heads={n_kv_heads} "
                             f"heads of width d_head={d_head} (W_q's width / n_heads) need "
                             f"{n_kv_heads * d_head} columns")
    if cache is not None and not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a mha.numpy.KVCache, got {type(cache).__name__}")
    q = split_heads(project("W_q", X, W_q, b_q, "X"), n_heads)  # (..., h, T, d_head)
    k = split_heads(project("W_k", X, W_k, b_k, "X"), n_kv_heads)  # (..., h_kv, T, d_head)
    v = split_heads(project("W_v", X, W_v, b_v, "X"), n_kv_heads)  # (..., h_kv, T, d_head)
    past = (None, None) if cache is None else (cache.keys, cache.values)
    out, weights, keys, values = attend_with_cache(q, k, v, *past, causal=causal, mask=mask, rope_base=rope_base)
    if cache is not None:
        cache.keys, cache.values = keys, values
    return project("W_o", merge_heads(out), W_o, b_o, "the merged heads"), weights
