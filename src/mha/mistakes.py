"""Classic mistakes, written down as code.

Each entry is a wrong implementation with the same signature as its
`mha.numpy` twin, and the hint a learner should read when their answer matches
it. `mha.checks` compares a failing answer with these to name the mistake; the
tests make sure every check rejects every one of them.
"""

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

import mha.numpy as mn


@dataclass(frozen=True)
class Mistake:
    name: str  # which function it imitates
    hint: str  # what the learner should read
    fn: Callable


MISTAKES = []


def mistake(name, hint):
    """Register a wrong implementation of `mha.numpy.<name>`."""
    def register(fn):
        MISTAKES.append(Mistake(name, hint, fn))
        return fn
    return register


def for_function(name):
    return [m for m in MISTAKES if m.name == name]


def softmax_rows(scores, mask=None, *, fill=-np.inf):
    """A softmax that is right apart from what the caller changes."""
    if mask is not None:
        scores = np.where(mask, scores, fill)
    return mn.softmax(scores)


# softmax ------------------------------------------------------------------------------

@mistake("softmax", "the softmax is taken over the wrong axis: normalise along `axis`")
def softmax_wrong_axis(x, axis=-1):
    x = np.asarray(x, dtype=float)
    other = 0 if x.ndim > 1 and axis in (-1, x.ndim - 1) else -1
    return mn.softmax(x, axis=other)


@mistake("softmax", "exp overflows for large inputs: subtract the maximum before exponentiating")
def softmax_without_max(x, axis=-1):
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(np.asarray(x, dtype=float))
        return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax", "divide by the sum along `axis` only, not by the sum of the whole array")
def softmax_global_sum(x, axis=-1):
    x = np.asarray(x, dtype=float)
    e = np.exp(x - x.max())
    return e / e.sum()


# self-attention -----------------------------------------------------------------------

@mistake("self_attention", "divide the scores by sqrt(d) before the softmax")
def self_attention_unscaled(X, exclude_self=False):
    scores = X @ np.swapaxes(X, -1, -2)
    mask = ~np.eye(X.shape[-2], dtype=bool) if exclude_self else None
    w = mn.masked_softmax(scores, mask)
    return w @ X, w


@mistake("self_attention", "with exclude_self=True a token must not attend to itself: mask the diagonal")
def self_attention_ignores_exclude(X, exclude_self=False):
    return mn.self_attention(X)


@mistake("self_attention", "normalise each row (over keys, the last axis), not each column")
def self_attention_column_softmax(X, exclude_self=False):
    scores = X @ np.swapaxes(X, -1, -2) / math.sqrt(X.shape[-1])
    if exclude_self:
        scores = np.where(np.eye(X.shape[-2], dtype=bool), -np.inf, scores)
    w = mn.softmax(scores, axis=-2)
    return w @ X, w


# symmetric attention ------------------------------------------------------------------

@mistake("symmetric_attention", "scale by sqrt(W.shape[1]), the width of the embedded vectors, "
         "not by the input width")
def symmetric_scaled_by_input_width(X, W):
    E = X @ W
    w = mn.softmax(E @ np.swapaxes(E, -1, -2) / math.sqrt(X.shape[-1]))
    return w @ X, w


@mistake("symmetric_attention", "the values are the inputs X themselves, not X W")
def symmetric_values_embedded(X, W):
    E = X @ W
    w = mn.softmax(E @ np.swapaxes(E, -1, -2) / math.sqrt(W.shape[1]))
    return w @ E, w


# single head and scaled dot-product attention -----------------------------------------

@mistake("scaled_dot_product_attention", "divide the scores by sqrt(d_k) before the softmax")
def sdpa_unscaled(Q, K, V, mask=None):
    w = mn.masked_softmax(Q @ np.swapaxes(K, -1, -2), mask)
    return w @ V, w


@mistake("scaled_dot_product_attention", "the mask means True = may attend: keep the True entries")
def sdpa_mask_flipped(Q, K, V, mask=None):
    return mn.scaled_dot_product_attention(Q, K, V, None if mask is None else ~np.asarray(mask))


@mistake("scaled_dot_product_attention", "a query that may attend to nothing must get zero weights, "
         "not NaN: handle rows where the mask is all False")
def sdpa_masked_row_nan(Q, K, V, mask=None):
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    with np.errstate(invalid="ignore"):
        w = softmax_rows(scores, mask)
    return w @ V, w


@mistake("scaled_dot_product_attention", "a query that may attend to nothing must get zero weights, "
         "not uniform ones: masking with a large negative number is not enough for an all-False row")
def sdpa_masked_row_uniform(Q, K, V, mask=None):
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    w = softmax_rows(scores, mask, fill=-1e9)
    return w @ V, w


@mistake("scaled_dot_product_attention", "normalise over keys (the last axis), not over queries")
def sdpa_query_axis(Q, K, V, mask=None):
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    w = mn.softmax(scores if mask is None else np.where(mask, scores, -1e9), axis=-2)
    return w @ V, w


@mistake("head_attention", "queries come from X with W_q and keys from the context with W_k: "
         "the roles of W_q and W_k look swapped")
def head_attention_swapped(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    return mn.head_attention(X, W_k, W_q, W_v, context=context, mask=mask)


@mistake("head_attention", "divide by sqrt(d_head), the width of the queries, not by sqrt(d)")
def head_attention_scaled_by_input(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    source = X if context is None else context
    Q, K = X @ W_q, source @ W_k
    V = source if W_v is None else source @ W_v
    scale = math.sqrt(Q.shape[-1] / X.shape[-1])  # turns 1/sqrt(d_head) into 1/sqrt(d)
    return mn.scaled_dot_product_attention(Q * scale, K, V, mask)


# heads --------------------------------------------------------------------------------

@mistake("split_heads", "after the reshape to (..., T, h, d_head), swap the T and h axes; "
         "a single reshape to (..., h, T, d_head) mixes tokens between heads")
def split_without_transpose(X, n_heads):
    *batch, T, d = X.shape
    return X.reshape(*batch, n_heads, T, d // n_heads)


@mistake("split_heads", "head i takes the i-th block of d_head consecutive columns, "
         "not every h-th column")
def split_interleaved(X, n_heads):
    *batch, T, d = X.shape
    return np.swapaxes(X.reshape(*batch, T, d // n_heads, n_heads), -1, -2).swapaxes(-3, -2)


@mistake("merge_heads", "swap the h and T axes back before the reshape to (..., T, h * d_head)")
def merge_without_transpose(X):
    *batch, h, T, d_head = X.shape
    return X.reshape(*batch, T, h * d_head)


@mistake("multihead_attention_loop", "the concatenated heads must go through W_o")
def loop_without_W_o(X, heads, W_o, *, context=None, mask=None):
    eye = np.eye(sum(W_v.shape[1] for _, _, W_v in heads))
    out, w = mn.multihead_attention_loop(X, heads, eye, context=context, mask=mask)
    return out[..., : W_o.shape[1]], w


@mistake("multihead_attention", "divide the scores by sqrt(d_head) = sqrt(d_model / n_heads)")
def mha_unscaled(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return mn.multihead_attention(X, W_q * math.sqrt(W_q.shape[1] // n_heads), W_k, W_v, W_o, n_heads,
                                  **{**kw, "b_q": _scaled(kw.get("b_q"), math.sqrt(W_q.shape[1] // n_heads))})


@mistake("multihead_attention", "scale by sqrt(d_head), the width of one head, not sqrt(d_model)")
def mha_scaled_by_d_model(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    factor = math.sqrt(1 / n_heads)
    return mn.multihead_attention(X, W_q * factor, W_k, W_v, W_o, n_heads,
                                  **{**kw, "b_q": _scaled(kw.get("b_q"), factor)})


@mistake("multihead_attention", "split heads with a reshape AND a transpose: (..., T, h, d_head) "
         "then (..., h, T, d_head)")
def mha_split_without_transpose(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _mha_with(X, W_q, W_k, W_v, W_o, n_heads, kw, split=split_without_transpose)


@mistake("multihead_attention", "merge heads by swapping h and T back before the reshape")
def mha_merge_without_transpose(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _mha_with(X, W_q, W_k, W_v, W_o, n_heads, kw, merge=merge_without_transpose)


@mistake("multihead_attention", "the merged heads must go through W_o (and b_o)")
def mha_without_W_o(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    kw = {**kw, "b_o": None}
    return mn.multihead_attention(X, W_q, W_k, W_v, np.eye(W_o.shape[0]), n_heads, **kw)


@mistake("multihead_attention", "the mask means True = may attend: keep the True entries")
def mha_mask_flipped(X, W_q, W_k, W_v, W_o, n_heads, mask=None, **kw):
    return mn.multihead_attention(X, W_q, W_k, W_v, W_o, n_heads,
                                  mask=None if mask is None else ~np.asarray(mask), **kw)


@mistake("multihead_attention", "add the biases b_q, b_k, b_v and b_o")
def mha_ignores_biases(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None, **biases):
    return mn.multihead_attention(X, W_q, W_k, W_v, W_o, n_heads, context=context, mask=mask)


def _scaled(b, factor):
    return None if b is None else b * factor


def _mha_with(X, W_q, W_k, W_v, W_o, n_heads, kw, split=mn.split_heads, merge=mn.merge_heads):
    source = X if kw.get("context") is None else kw["context"]
    Q, K, V = (mn.project(n, a, W, kw.get(b), "x") for n, a, W, b in
               (("W_q", X, W_q, "b_q"), ("W_k", source, W_k, "b_k"), ("W_v", source, W_v, "b_v")))
    out, w = mn.scaled_dot_product_attention(split(Q, n_heads), split(K, n_heads), split(V, n_heads),
                                             kw.get("mask"))
    return mn.project("W_o", merge(out), W_o, kw.get("b_o"), "x"), w


# masks --------------------------------------------------------------------------------

@mistake("causal_mask", "query t may attend to keys 0..t, itself included: keep the diagonal")
def causal_without_diagonal(T):
    return np.tril(np.ones((T, T), dtype=bool), k=-1)


@mistake("causal_mask", "True must be on and below the diagonal (the past), not above it (the future)")
def causal_upper(T):
    return np.triu(np.ones((T, T), dtype=bool))


@mistake("causal_mask", "one step too far: query t must not see key t + 1")
def causal_one_ahead(T):
    return np.tril(np.ones((T, T), dtype=bool), k=1)


@mistake("padding_mask", "padding hides keys, so the mask must have shape (B, 1, 1, T): "
         "it looks like padding was applied to queries, (B, 1, T, 1)")
def padding_on_queries(lengths, T):
    return np.swapaxes(mn.padding_mask(lengths, T), -1, -2)


@mistake("padding_mask", "True marks real tokens (may attend) and False marks padding")
def padding_flipped(lengths, T):
    return ~mn.padding_mask(lengths, T)


@mistake("padding_mask", "position t is real when t < length: the last real token is at length - 1")
def padding_off_by_one(lengths, T):
    real = np.arange(T) <= np.asarray(lengths)[:, None]
    return real[:, None, None, :]


# layer norm, feed-forward, encoder block ----------------------------------------------

@mistake("layer_norm", "use the biased variance (divide by d, not d - 1), as torch.nn.LayerNorm does")
def layer_norm_unbiased(X, gamma, beta, eps=1e-5):
    mean = X.mean(-1, keepdims=True)
    return (X - mean) / np.sqrt(X.var(-1, ddof=1, keepdims=True) + eps) * gamma + beta


@mistake("layer_norm", "eps goes inside the square root: sqrt(var + eps), not sqrt(var) + eps")
def layer_norm_eps_outside(X, gamma, beta, eps=1e-5):
    mean = X.mean(-1, keepdims=True)
    return (X - mean) / (X.std(-1, keepdims=True) + eps) * gamma + beta


@mistake("layer_norm", "LayerNorm normalises each vector over its features (the last axis), "
         "not each feature over the batch as BatchNorm does")
def layer_norm_batch_axis(X, gamma, beta, eps=1e-5):
    axes = tuple(range(X.ndim - 1)) or (0,)
    mean = X.mean(axes, keepdims=True)
    return (X - mean) / np.sqrt(X.var(axes, keepdims=True) + eps) * gamma + beta


@mistake("layer_norm", "scale by gamma and shift by beta after normalising")
def layer_norm_no_affine(X, gamma, beta, eps=1e-5):
    return mn.layer_norm(X, np.ones_like(gamma), np.zeros_like(gamma), eps)


@mistake("feed_forward", "apply the activation (ReLU) between the two linear layers")
def feed_forward_no_activation(X, W_1, b_1, W_2, b_2, activation="relu"):
    return (X @ W_1 + b_1) @ W_2 + b_2


@mistake("feed_forward", "GELU here is the exact form x * Phi(x) with the normal CDF (erf), "
         "not the tanh approximation")
def feed_forward_tanh_gelu(X, W_1, b_1, W_2, b_2, activation="relu"):
    H = X @ W_1 + b_1
    if activation == "gelu":
        H = 0.5 * H * (1 + np.tanh(math.sqrt(2 / math.pi) * (H + 0.044715 * H**3)))
    else:
        H = np.maximum(H, 0)
    return H @ W_2 + b_2


def _block(X, n_heads, params, *, mask, norm_first, eps, activation, residual=True, flip_norm=False,
           ff_activation=None):
    p = {k: params.get(k) for k in mn.BLOCK_PARAMS}
    attention = {k: p[k] for k in mn.ATTENTION_PARAMS}

    def ff(x):
        H = x @ p["W_1"] + p["b_1"]
        H = ff_activation(H) if ff_activation else (mn.relu(H) if activation == "relu" else mn.gelu(H))
        return H @ p["W_2"] + p["b_2"]

    def ln(x, i):
        return mn.layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    r = 1.0 if residual else 0.0
    if norm_first != flip_norm:
        a, w = mn.multihead_attention(ln(X, 1), n_heads=n_heads, mask=mask, **attention)
        X = r * X + a
        return r * X + ff(ln(X, 2)), w
    a, w = mn.multihead_attention(X, n_heads=n_heads, mask=mask, **attention)
    X = ln(r * X + a, 1)
    return ln(r * X + ff(X), 2), w


@mistake("encoder_block", "add the residual: each sublayer's output is added to its input")
def block_without_residual(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  residual=False)


@mistake("encoder_block", "check where the LayerNorm goes: post-norm (norm_first=False) is "
         "LN(x + sublayer(x)); pre-norm is x + sublayer(LN(x))")
def block_norm_swapped(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  flip_norm=True)


@mistake("encoder_block", "apply the activation between the two linear layers of the feed-forward network")
def block_without_activation(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  ff_activation=lambda h: h)
