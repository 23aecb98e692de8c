"""Grouped-query attention: several query heads share one key/value head.

With h query heads and h_kv key/value heads (h_kv divides h), query head j reads
key/value head j // (h / h_kv), Llama's convention. h_kv = h is multi-head
attention; h_kv = 1 is multi-query attention. Fewer key/value heads mean a smaller
key-value cache, which is what generation is short of.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import (as_float_array, as_mask, matrix, merge_heads, project,
                                  scaled_dot_product_attention, sequences, soft_cap, split_heads)
from mha.numpy.cache import KVCache
from mha.numpy.parts import rms_norm
from mha.numpy.rotary import apply_rotary, rotary_at, rotary_embedding
from mha.numpy.sinks import sink_softmax


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


def causal_mask_after(T_new, T_past, *, window=None):
    """(T_new, T_past + T_new) boolean: new query t (at position T_past + t) sees every cached
    key and the new keys up to itself; with `window`, only the last `window` of them (itself included)."""
    T_new, T_past = validate.check_int("T_new", T_new), validate.check_int("T_past", T_past, minimum=0)
    mask = np.tri(T_new, T_past + T_new, k=T_past, dtype=bool)
    if window is None:
        return mask
    window = validate.check_int("window", window)
    return mask & ~np.tri(T_new, T_past + T_new, k=T_past - window, dtype=bool)  # key j > position - window


def sliding_window_mask(T, window):
    """(T, T) boolean: query t sees keys t - window + 1 .. t (Mistral's and Gemma's sliding window)."""
    return causal_mask_after(T, 0, window=window)


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
                            rope_base=None, b_q=None, b_k=None, b_v=None, b_o=None, cache=None, positions=None,
                            rope_scaling=None, scale=None, logit_cap=None, sliding_window=None, q_norm=None,
                            k_norm=None, norm_eps=1e-6, norm_unit_offset=False, sinks=None, W_g=None, b_g=None,
                            rotary_dim=None):
    """Self-attention with n_heads query heads sharing n_kv_heads key/value heads.

    X: (..., T, d_model); W_q: (d_model, h * d_head); W_k, W_v: (d_model, h_kv * d_head);
    W_o: (h * d_head, d_model). With `rope_base`, queries and keys are rotated at their
    positions (`positions`, integers (..., T); default 0 .. T - 1 after `cache.position`),
    with `rope_scaling` if given. With a `KVCache`, the new keys and values are appended to it
    and the queries attend to everything it holds. The features of today's models:
    q_norm, k_norm (RMSNorm weights of width d_head, per head, or h * d_head and h_kv * d_head,
    over all heads, with norm_eps and norm_unit_offset), `scale` instead of d_head ** -0.5,
    `logit_cap` (soft-capped scores), `sliding_window` (a causal query sees only the last
    sliding_window positions; a cache then keeps only sliding_window - 1); sinks (h,), gpt-oss's
    learned logit per head in each row's denominator (`sink_softmax`); W_g (d_model, h * d_head) and
    b_g, Qwen3-Next's output gate: the merged heads times sigmoid(X W_g + b_g) before W_o;
    rotary_dim: RoPE on the first rotary_dim features of each head only (Qwen3-Next). Returns
    out (..., T, d_model) and weights (..., h, T, T_k), T_k the keys held after the call.
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
    if sliding_window is not None:
        sliding_window = validate.check_int("sliding_window", sliding_window)
    q, k = project("W_q", X, W_q, b_q, "X"), project("W_k", X, W_k, b_k, "X")  # (..., T, h * d_head), h_kv
    q, k = query_key_norms(q, k, q_norm, k_norm, n_heads, n_kv_heads, d_head, norm_eps, norm_unit_offset)
    v = split_heads(project("W_v", X, W_v, b_v, "X"), n_kv_heads)  # (..., h_kv, T, d_head)
    T_past, start = (0, 0) if cache is None else (len(cache), cache.position)
    if rope_base is not None:
        T, r = q.shape[-2], d_head if rotary_dim is None else rotary_dim
        dtype = np.float64 if q.dtype == np.float64 else np.float32
        if positions is None:
            cos, sin = rotary_embedding(T, r, rope_base, offset=start, dtype=dtype, scaling=rope_scaling)
        else:
            cos, sin = rotary_at(positions, r, rope_base, dtype=dtype, scaling=rope_scaling)  # (..., T, r)
            cos, sin = cos[..., None, :, :], sin[..., None, :, :]  # (..., 1, T, r): every head
        q = np.concatenate([apply_rotary(q[..., :r], cos, sin), q[..., r:]], axis=-1)  # the first r features turn
        k = np.concatenate([apply_rotary(k[..., :r], cos, sin), k[..., r:]], axis=-1)
    elif positions is not None or rope_scaling is not None:
        raise ValueError("positions and rope_scaling are RoPE's: give rope_base too")
    keys, values = (k, v) if cache is None else cache.append(k, v)  # (..., h_kv, T_past + T, d_head)
    if causal:
        causal_part = causal_mask_after(q.shape[-2], T_past, window=sliding_window)  # (T, T_past + T)
        mask = causal_part if mask is None else as_mask(mask, (*q.shape[:-2], q.shape[-2], keys.shape[-2])) \
            & causal_part
    n_rep = n_heads // n_kv_heads
    if sinks is None:
        out, weights = scaled_dot_product_attention(q, repeat_kv(keys, n_rep), repeat_kv(values, n_rep), mask,
                                                    scale=scale, logit_cap=logit_cap)
    else:
        out, weights = attention_with_sinks(q, repeat_kv(keys, n_rep), repeat_kv(values, n_rep), mask, sinks,
                                            scale=scale, logit_cap=logit_cap)
    if cache is not None and sliding_window is not None:
        cache.keep_last(sliding_window - 1)  # the next query's window holds these and itself
    merged = merge_heads(out)  # (..., T, h * d_head)
    if W_g is not None:  # Qwen3-Next: each head's output gated, feature by feature
        merged = merged / (1 + np.exp(-project("W_g", X, W_g, b_g, "X")))  # times sigmoid(X W_g + b_g)
    return project("W_o", merged, W_o, b_o, "the merged heads"), weights


def attention_with_sinks(q, keys, values, mask, sinks, *, scale=None, logit_cap=None):
    """Attention whose weights are `sink_softmax` of the masked scores: q (..., h, T, d), keys and values
    (..., h, T_k, d), mask broadcasting to (..., h, T, T_k) or None, sinks (h,). Returns out, weights."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ np.swapaxes(keys, -1, -2)) * scale  # (..., h, T, T_k)
    if logit_cap is not None:
        scores = soft_cap(scores, logit_cap)
    if mask is not None:
        scores = np.where(as_mask(mask, scores.shape), scores, -np.inf)
    weights = sink_softmax(scores, sinks)  # (..., h, T, T_k), rows summing to less than 1
    return weights @ values, weights


def query_key_norms(q, k, q_norm, k_norm, n_heads, n_kv_heads, d_head, eps, unit_offset):
    """The projected queries (..., T, h * d_head) and keys (..., T, h_kv * d_head), RMS-normed if
    q_norm and k_norm are given (per head when their width is d_head, else over all heads), and
    split: (..., h, T, d_head) and (..., h_kv, T, d_head)."""
    if (q_norm is None) != (k_norm is None):
        raise ValueError("give both q_norm and k_norm (QK-norm normalises queries and keys), or neither")
    per_head = q_norm is not None and np.shape(q_norm) == (d_head,) and np.shape(k_norm) == (d_head,)
    if per_head:  # Qwen3, Gemma 3
        return (rms_norm_per_head(q, q_norm, n_heads, eps, unit_offset=unit_offset),
                rms_norm_per_head(k, k_norm, n_kv_heads, eps, unit_offset=unit_offset))
    if q_norm is not None:  # OLMo 2: all heads at once, then split
        q, k = rms_norm(q, q_norm, eps, unit_offset=unit_offset), rms_norm(k, k_norm, eps, unit_offset=unit_offset)
    return split_heads(q, n_heads), split_heads(k, n_kv_heads)  # (..., h, T, d_head), (..., h_kv, T, d_head)


def rms_norm_per_head(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    """QK-norm per head, as Qwen3 and Gemma 3 apply it before RoPE: the projected queries (or keys)
    x (..., T, n_heads * d_head) split into heads, (..., n_heads, T, d_head), and each head's vector
    RMS-normed over its own d_head features, scaled by weight (d_head,) (by 1 + weight with unit_offset)."""
    heads = split_heads(x, n_heads)  # (..., h, T, d_head)
    d_head = heads.shape[-1]
    if np.ndim(weight) != 1 or np.shape(weight)[0] != d_head:
        raise ValueError(f"weight has shape {validate.shape_str(np.shape(weight))}, but a norm per head scales the "
                         f"d_head = {d_head} features of one head: give it shape ({d_head},) (a weight over all "
                         f"heads, as OLMo 2's, goes to rms_norm before the split)")
    return rms_norm(heads, weight, eps, unit_offset=unit_offset)
