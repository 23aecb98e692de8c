"""Multi-head attention in NumPy: the reference that reads like the math.

Conventions (the same in `mha.torch`):
- inputs are row vectors: shape (..., T, d); leading batch dimensions are optional;
- a projection is `X @ W + b` with `W` of shape (d_in, d_out);
- masks are boolean, True means "may attend", and broadcast to (..., h, T_q, T_k);
- a query that may attend to nothing gets zero weights and a zero output.
"""

import math

import numpy as np

from mha import validate


def as_float_array(name, x):
    """`x` as a floating-point array; integers become float64, float32 stays float32."""
    x = np.asarray(x)
    if x.dtype == bool or not np.issubdtype(x.dtype, np.number):
        raise TypeError(f"{name} must be an array of numbers, got dtype {x.dtype}")
    if np.issubdtype(x.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}: attention here is real-valued")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    return x


def sequences(X, context=None):
    """X, and the sequence its queries attend to (X itself when `context` is None), as
    floating-point arrays of shape (..., T, d)."""
    X = as_float_array("X", X)
    source = X if context is None else as_float_array("context", context)
    validate.check_sequence("X", X)
    validate.check_sequence("context", source)
    return X, source


def matrix(name, W, rows=None, input_name="the input"):
    """A weight matrix as a floating-point array of shape (rows, cols)."""
    W = as_float_array(name, W)
    validate.check_matrix(name, W, rows=rows, input_name=input_name)
    return W


def transpose(X):
    """Swap the last two axes: (..., T, d) -> (..., d, T)."""
    return np.swapaxes(X, -1, -2)


def as_mask(mask, scores_shape, name="mask"):
    """`mask` (or None) as a boolean array that broadcasts to `scores_shape`."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    validate.check_named_mask(name, mask.shape, mask.dtype == bool, scores_shape, mask.dtype)
    return mask


def at_least_float32(x):
    """`x`, or a float32 copy of a float16 `x`: float16 sums stall (2048 + 1 rounds to 2048),
    so half-precision softmaxes are summed in float32. float32 and float64 pass as they are."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def check_softmax_input(name, x, axis=-1):
    """A softmax needs an axis, and at least one entry in each slice along it."""
    validate.check_ndim(name, x, 1)  # a 0-d x has no axis to normalise along
    if x.size == 0 and np.zeros(x.shape, dtype=bool).any(axis=axis).size > 0:  # slices with no entry
        raise ValueError(f"{name} has shape {validate.shape_str(x.shape)}: no entry along axis={axis} "
                         f"to normalise, and a softmax needs at least one")


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, computed without overflow; float16 is summed in float32."""
    x = as_float_array("x", x)
    check_softmax_input("x", x, axis)
    z = at_least_float32(x)
    e = np.exp(z - z.max(axis=axis, keepdims=True))  # the largest entry becomes exp(0) = 1
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def masked_softmax(scores, mask=None):
    """Softmax over the last axis, keeping only entries where `mask` is True.

    A row with no True entry gets all-zero weights instead of NaN.
    """
    scores = as_float_array("scores", scores)
    check_softmax_input("scores", scores)
    if mask is None:
        return softmax(scores)
    mask = as_mask(mask, scores.shape)
    has_any = mask.any(axis=-1, keepdims=True)  # (..., T_q, 1)
    keep = mask | ~has_any  # an empty row keeps everything, then is zeroed below
    weights = softmax(np.where(keep, scores, -np.inf))
    return weights * has_any


def masked_softmax_(scores, mask=None):
    """`masked_softmax` written into `scores` itself, for arrays the caller owns.

    Each step of `softmax` overwrites `scores` instead of allocating a new
    (..., T_q, T_k) array: at T = 512 a fresh array of that size costs about as
    much time as one step. `scores` must be floating point and have the full shape.
    """
    check_softmax_input("scores", scores)
    mask = as_mask(mask, scores.shape)
    if scores.dtype == np.float16:  # summed in float32 (see at_least_float32), written back as float16
        scores[...] = masked_softmax_(at_least_float32(scores), mask)
        return scores
    if mask is not None:
        has_any = mask.any(axis=-1, keepdims=True)  # (..., T_q, 1)
        np.copyto(scores, -np.inf, where=~(mask | ~has_any))  # an empty row keeps everything
    scores -= scores.max(axis=-1, keepdims=True)  # the largest entry becomes 0, and exp(0) = 1
    np.exp(scores, out=scores)
    scores *= 1 / scores.sum(axis=-1, keepdims=True)  # one division per row, not per entry
    return scores if mask is None else np.multiply(scores, has_any, out=scores)


def self_attention(X, exclude_self=False):
    """Each output is a softmax-weighted average of the inputs.

    X: (..., T, d). Scores X X^T / sqrt(d); with `exclude_self` a token may not
    attend to itself. Returns out (..., T, d) and weights (..., T, T).
    """
    X = as_float_array("X", X)
    validate.check_sequence("X", X)
    T, d = X.shape[-2:]
    scores = X @ transpose(X) / math.sqrt(d)  # (..., T, T)
    mask = ~np.eye(T, dtype=bool) if exclude_self else None
    weights = masked_softmax(scores, mask)
    return weights @ X, weights


def symmetric_attention(X, W):
    """Attention with one learned matrix W: scores (XW)(XW)^T / sqrt(d_embed).

    X: (..., T, d), W: (d, d_embed). The values are the inputs themselves.
    Returns out (..., T, d) and weights (..., T, T), which come from a
    symmetric score matrix.
    """
    X, _ = sequences(X)
    W = matrix("W", W, rows=X.shape[-1], input_name="X")
    E = X @ W  # (..., T, d_embed)
    scores = E @ transpose(E) / math.sqrt(W.shape[1])  # (..., T, T), symmetric
    weights = softmax(scores)
    return weights @ X, weights


def as_bias(bias, scores_shape):
    """`bias` (or None) as a floating-point array that broadcasts to `scores_shape`."""
    if bias is None:
        return None
    bias = as_float_array("bias", bias)
    validate.check_bias(bias.shape, scores_shape)
    return bias


def soft_cap(x, cap):
    """cap * tanh(x / cap): about x while |x| is small against cap, never beyond +-cap.

    x: any array; cap: a number > 0. Computed as (x / cap), tanh, times cap, in that order,
    as Gemma 2 does."""
    x = as_float_array("x", x)
    cap = validate.check_cap(cap)
    return np.tanh(x / cap) * cap


def scaled_dot_product_attention(Q, K, V, mask=None, *, bias=None, scale=None, logit_cap=None):
    """softmax(Q K^T / sqrt(d_k) + bias) V, with an optional boolean mask.

    Q: (..., T_q, d_k), K: (..., T_k, d_k), V: (..., T_k, d_v).
    bias: an additive term on the scores (e.g. ALiBi's), broadcasting to (..., T_q, T_k).
    scale: replaces 1 / sqrt(d_k) (Gemma's query_pre_attn_scalar ** -0.5). logit_cap: the
    scores become logit_cap * tanh(scores / logit_cap) before bias and mask (Gemma 2).
    Returns out (..., T_q, d_v) and weights (..., T_q, T_k).
    """
    Q, K, V = (as_float_array(n, a) for n, a in (("Q", Q), ("K", K), ("V", V)))
    batch = validate.check_qkv(Q, K, V)
    mask = as_mask(mask, (*batch, Q.shape[-2], K.shape[-2]))  # the scores' shape
    bias = as_bias(bias, (*batch, Q.shape[-2], K.shape[-2]))
    dtype = np.result_type(Q, K, V)
    Q, K, V = (at_least_float32(a) for a in (Q, K, V))  # float16 is computed in float32
    if scale is None:
        scores = (Q / math.sqrt(Q.shape[-1])) @ transpose(K)  # (..., T_q, T_k); scaling Q is cheaper
    else:
        scores = (Q * np.asarray(validate.check_scale(scale), Q.dtype)) @ transpose(K)  # (..., T_q, T_k)
    if logit_cap is not None:
        scores = soft_cap(scores, logit_cap)
    if bias is not None:
        scores += bias  # in place, in the scores' dtype
    weights = masked_softmax_(scores, mask)  # scores is ours: softmax it in place
    return (weights @ V).astype(dtype, copy=False), weights.astype(dtype, copy=False)


def head_attention(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    """One attention head: queries from X, keys and values from `context` (default X).

    X: (..., T_q, d), W_q and W_k: (d, d_head), W_v: (d, d_v) or None, in which
    case the values are the inputs themselves. Returns out (..., T_q, d_v) and
    weights (..., T_q, T_k).
    """
    X, source = sequences(X, context)
    W_q = matrix("W_q", W_q, rows=X.shape[-1], input_name="X")
    W_k = matrix("W_k", W_k, rows=source.shape[-1], input_name="context")
    validate.check_same("W_q.shape[1]", W_q.shape[1], "W_k.shape[1]", W_k.shape[1], "query and key widths")
    V = source if W_v is None else source @ matrix("W_v", W_v, rows=source.shape[-1], input_name="context")
    return scaled_dot_product_attention(X @ W_q, source @ W_k, V, mask)


def split_heads(X, n_heads):
    """(..., T, d) -> (..., h, T, d // h): each head gets its own column block."""
    X = np.asarray(X)
    validate.check_ndim("X", X, 2)
    validate.check_divisible(X.shape[-1], n_heads)
    *batch, T, d = X.shape
    X = X.reshape(*batch, T, n_heads, d // n_heads)  # (..., T, h, d_head)
    return np.swapaxes(X, -3, -2)  # (..., h, T, d_head)


def merge_heads(X):
    """(..., h, T, d_head) -> (..., T, h * d_head): the inverse of `split_heads`."""
    X = np.asarray(X)
    validate.check_ndim("X", X, 3)
    *batch, h, T, d_head = X.shape
    X = np.swapaxes(X, -3, -2)  # (..., T, h, d_head)
    return X.reshape(*batch, T, h * d_head)  # (..., T, h * d_head)


def heads_from_fused(W_q, W_k, W_v, n_heads):
    """The per-head weights hidden in fused ones: head i owns column block i of each matrix.

    W_q, W_k, W_v: (d, h * d_head) -> [(W_q_i, W_k_i, W_v_i), ...], each (d, d_head),
    the `heads` argument of `multihead_attention_loop`.
    """
    blocks = []
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        W = matrix(name, W)
        validate.check_divisible(W.shape[1], n_heads, f"the width of {name}")
        blocks.append(np.split(W, n_heads, axis=1))  # h blocks of (d, d_head)
    return list(zip(*blocks))


def attention_shape(X, context, n_heads):
    """The shape of the scores, (..., h, T_q, T_k), once X and context broadcast."""
    batch = validate.broadcast_batch("X", X.shape[:-2], "context", context.shape[:-2])
    return (*batch, n_heads, X.shape[-2], context.shape[-2])


def multihead_attention_loop(X, heads, W_o, *, context=None, mask=None):
    """Several heads, one after another, outputs concatenated and projected by W_o.

    heads: [(W_q_i, W_k_i, W_v_i), ...], any head width (wide or narrow).
    W_o: (sum of the heads' d_v, d_out). Returns out (..., T_q, d_out) and
    weights (..., h, T_q, T_k).
    """
    X, source = sequences(X, context)
    if len(heads) < 1:
        raise ValueError("heads must hold at least one (W_q, W_k, W_v) triple, got none")
    shape = attention_shape(X, source, len(heads))  # (..., h, T_q, T_k)
    mask = None if mask is None else np.broadcast_to(as_mask(mask, shape), shape)
    outputs, weights = [], []
    for i, (W_q, W_k, W_v) in enumerate(heads):
        head_mask = None if mask is None else mask[..., i, :, :]  # (..., T_q, T_k)
        out, w = head_attention(X, W_q, W_k, W_v, context=context, mask=head_mask)
        outputs.append(out)
        weights.append(w)
    concat = np.concatenate(outputs, axis=-1)  # (..., T_q, h * d_v)
    W_o = matrix("W_o", W_o, rows=concat.shape[-1], input_name="the heads' concatenation")
    return concat @ W_o, np.stack(weights, axis=-3)


def project(name, x, W, b, input_name):
    """x @ W + b, with W: (d_in, d_out) and b: (d_out,) or None."""
    W = matrix(name, W, rows=x.shape[-1], input_name=input_name)
    out = x @ W
    if b is not None:
        b = as_float_array("b" + name[1:], b)
        validate.check_vector("b" + name[1:], b, W.shape[1])
        out += b  # in place: no second (..., T, d_out) array
    return out


def multihead_attention(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None,
                        b_q=None, b_k=None, b_v=None, b_o=None, bias=None):
    """All heads at once: one projection each for Q, K, V, split, attend, merge, W_o.

    X: (..., T_q, d), W_q/W_k/W_v: (d, d_model), W_o: (d_model, d_out).
    Head i uses column block i of W_q, W_k and W_v; `bias` (e.g. ALiBi's, (h, T_q, T_k))
    is added to the scores. Returns out (..., T_q, d_out) and weights (..., h, T_q, T_k).
    """
    X, source = sequences(X, context)
    W_q, W_k = matrix("W_q", W_q, X.shape[-1], "X"), matrix("W_k", W_k, source.shape[-1], "context")
    validate.check_same("W_q.shape[1]", W_q.shape[1], "W_k.shape[1]", W_k.shape[1], "query and key widths")
    Q = project("W_q", X, W_q, b_q, "X")  # (..., T_q, d_model)
    K = project("W_k", source, W_k, b_k, "context")  # (..., T_k, d_model)
    V = project("W_v", source, W_v, b_v, "context")  # (..., T_k, d_model)
    validate.check_divisible(Q.shape[-1], n_heads)
    validate.check_divisible(V.shape[-1], n_heads, "the values' width d_v")
    Q, K, V = (split_heads(a, n_heads) for a in (Q, K, V))  # (..., h, T, d_head)
    out, weights = scaled_dot_product_attention(Q, K, V, mask, bias=bias)  # (..., h, T_q, d_head)
    return project("W_o", merge_heads(out), W_o, b_o, "the merged heads"), weights


def causal_mask(T):
    """(T, T) boolean: query t may attend to keys 0..t (on and below the diagonal)."""
    T = validate.check_int("T", T)
    return np.tril(np.ones((T, T), dtype=bool))


def padding_mask(lengths, T):
    """(B, 1, 1, T) boolean: True at the real keys of each sequence, False at padding."""
    T = validate.check_int("T", T)
    lengths = np.asarray(lengths)
    validate.check_lengths(lengths, np.issubdtype(lengths.dtype, np.integer), T, lengths.tolist())
    real = np.arange(T) < lengths[:, None]  # (B, T)
    return real[:, None, None, :]  # (B, 1, 1, T)


def attention_at_offset(weights, offset):
    """The average weight a query gives to the key `offset` positions away: (..., T_q, T_k) -> (...).

    offset=-1 scores attention to the previous token, +1 to the next one and 0
    to the token itself. Only queries i whose key i + offset exists are
    averaged (T - |offset| of them when T_q = T_k = T): nothing wraps around.
    """
    weights = as_float_array("weights", weights)
    validate.check_ndim("weights", weights, 2)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an integer, got {type(offset).__name__} {offset!r}")
    T_q, T_k = weights.shape[-2:]
    if not -T_q < offset < T_k:
        raise ValueError(f"offset={offset} leaves no query with a key at that distance: "
                         f"weights have T_q={T_q} queries and T_k={T_k} keys")
    return np.diagonal(weights, offset, axis1=-2, axis2=-1).mean(axis=-1)  # weights[..., i, i + offset]
