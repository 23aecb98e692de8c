"""Right solutions of chapters 1 to 6 written from scratch, for the tests of their checks
(tests/test_checks_traps_ch01_06.py, test_checks_cases_ch01_06.py, test_checks_routes_ch01_06.py, and
test_checks.py's right_solutions): NumPy and SciPy only, sharing no code with the library. Also the
builders that wrap one attention into a head or an encoder block, which wrong and permitted solutions share."""

import math

import numpy as np
from scipy.special import erf

import mha.numpy as mnp

CHAPTERS_1_TO_6 = ["softmax", "self_attention", "symmetric_attention", "scaled_dot_product_attention",
                   "head_attention", "multihead_attention_loop", "split_heads", "merge_heads", "causal_mask",
                   "padding_mask", "multihead_attention", "layer_norm", "feed_forward", "encoder_block"]


def rows_softmax(scores, allowed=True):
    """Softmax over the last axis where `allowed` (broadcasting to scores) is True; an empty row gets zeros."""
    allowed = np.broadcast_to(allowed, scores.shape)
    kept = np.where(allowed, scores, -np.inf)
    top = kept.max(axis=-1, keepdims=True)
    e = np.exp(kept - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax(x, axis=-1):
    top = x.max(axis=axis, keepdims=True)
    return np.exp(x - (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))))


def self_attention(X, exclude_self=False):  # the route of the text: a loop over the queries
    T, rows = X.shape[-2], []
    for i in range(T):
        scores = np.einsum("...d,...td->...t", X[..., i, :], X) / math.sqrt(X.shape[-1])  # (..., T)
        rows.append(rows_softmax(scores, (np.arange(T) != i) | (not exclude_self)))
    w = np.stack(rows, axis=-2)  # (..., T, T)
    return w @ X, w


def symmetric_attention(X, W):  # every product with np.einsum
    E = np.einsum("...td,de->...te", X, W)  # (..., T, d_embed)
    w = rows_softmax(np.einsum("...te,...se->...ts", E, E) / math.sqrt(W.shape[1]))
    return np.einsum("...ts,...sd->...td", w, X), w


def scaled_dot_product_attention(Q, K, V, mask=None):  # a loop over the queries
    T_q, T_k = Q.shape[-2], K.shape[-2]
    batch = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], np.shape(mask)[:-2])
    allowed = np.broadcast_to(True if mask is None else mask, (*batch, T_q, T_k))
    rows = []
    for t in range(T_q):
        scores = np.einsum("...d,...sd->...s", Q[..., t, :], K) / math.sqrt(Q.shape[-1])  # (..., T_k)
        rows.append(rows_softmax(np.broadcast_to(scores, allowed.shape[:-2] + (T_k,)), allowed[..., t, :]))
    w = np.stack(rows, axis=-2).astype(np.result_type(Q, K, V))  # (..., T_q, T_k)
    return w @ V, w


def head_attention(X, W_q, W_k, W_v=None, *, context=None, mask=None):  # every product with np.einsum
    source = X if context is None else context
    Q, K = np.einsum("...td,de->...te", X, W_q), np.einsum("...sd,de->...se", source, W_k)
    V = source if W_v is None else np.einsum("...sd,dv->...sv", source, W_v)
    w = rows_softmax(np.einsum("...te,...se->...ts", Q, K) / math.sqrt(W_q.shape[1]), True if mask is None else mask)
    w = w.astype(np.result_type(Q, K, V))
    return np.einsum("...ts,...sv->...tv", w, V), w


def multihead_attention_loop(X, heads, W_o, *, context=None, mask=None):  # never concatenate: a sum over heads
    source = X if context is None else context
    grid = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
    mask = None if mask is None else np.broadcast_to(mask, grid)
    out, start, weights = 0, 0, []
    for i, head in enumerate(heads):
        head_out, w = head_attention(X, *head, context=context, mask=None if mask is None else mask[..., i, :, :])
        out = out + head_out @ W_o[start:start + head_out.shape[-1]]  # its own slice of W_o
        start += head_out.shape[-1]
        weights.append(w)
    return out, np.stack(weights, axis=-3)


def split_heads(X, n_heads):
    return np.stack(np.split(X, n_heads, axis=-1), axis=-3)


def merge_heads(X):
    return np.concatenate([X[..., i, :, :] for i in range(X.shape[-3])], axis=-1)


def causal_mask(T):
    return np.arange(T) <= np.arange(T)[:, None]


def padding_mask(lengths, T):  # a loop over the sentences
    lengths = np.asarray(lengths)
    mask = np.zeros((len(lengths), 1, 1, T), dtype=bool)  # (B, 1, 1, T): everything blocked
    for b, n in enumerate(lengths):
        mask[b, ..., :n] = True
    return mask


def multihead_attention(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None, b_q=None, b_k=None, b_v=None,
                        b_o=None):
    source = X if context is None else context

    def heads(A, W, b):  # (..., T, d) -> (..., h, T, d_head)
        A = A @ W if b is None else A @ W + b
        return np.swapaxes(A.reshape(*A.shape[:-1], n_heads, -1), -3, -2)
    out, w = scaled_dot_product_attention(heads(X, W_q, b_q), heads(source, W_k, b_k), heads(source, W_v, b_v), mask)
    out = np.swapaxes(out, -3, -2)
    out = out.reshape(*out.shape[:-2], -1) @ W_o
    return (out if b_o is None else out + b_o), w


def layer_norm(X, gamma, beta, eps=1e-5):
    d = X.shape[-1]
    deviation = X - X.sum(axis=-1, keepdims=True) / d
    out = deviation / np.sqrt((deviation * deviation).sum(axis=-1, keepdims=True) / d + eps) * gamma
    return out if beta is None else out + beta


def feed_forward(X, W_1, b_1, W_2, b_2, activation="relu"):
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    H = X @ W_1 if b_1 is None else X @ W_1 + b_1
    H = np.where(H > 0, H, 0) if activation == "relu" else H * 0.5 * (1 + erf(H / math.sqrt(2)))
    return H @ W_2 if b_2 is None else H @ W_2 + b_2


def encoder_block(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    p = params.get

    def attend(x):
        return multihead_attention(x, p("W_q"), p("W_k"), p("W_v"), p("W_o"), n_heads, mask=mask, b_q=p("b_q"),
                                   b_k=p("b_k"), b_v=p("b_v"), b_o=p("b_o"))

    def ff(x):
        return feed_forward(x, p("W_1"), p("b_1"), p("W_2"), p("b_2"), activation)

    def norm(x, i):
        return layer_norm(x, p(f"gamma_{i}"), p(f"beta_{i}"), eps)
    if norm_first:
        attended, w = attend(norm(X, 1))
        X = X + attended
        return X + ff(norm(X, 2)), w
    attended, w = attend(X)
    X = norm(X + attended, 1)
    return norm(X + ff(X), 2), w


FROM_SCRATCH = {f.__name__: f for f in (
    softmax, self_attention, symmetric_attention, scaled_dot_product_attention, head_attention,
    multihead_attention_loop, split_heads, merge_heads, causal_mask, padding_mask, multihead_attention,
    layer_norm, feed_forward, encoder_block)}


# One attention wrapped into a head or an encoder block: the wrong solutions (with a softmax of their own)
# and the permitted ones (with mnp's) share these.


def head_with(sdpa):
    def head(X, W_q, W_k, W_v=None, *, context=None, mask=None):
        source = X if context is None else context
        return sdpa(X @ W_q, source @ W_k, source if W_v is None else source @ W_v, mask)
    head.__name__ = f"head_{sdpa.__name__}"
    return head


def encoder_block_with(attention):
    def block(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
        p = params.get
        weights = {k: p(k) for k in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")}

        def norm(x, i):
            return mnp.layer_norm(x, p(f"gamma_{i}"), p(f"beta_{i}"), eps)

        def ff(x):
            return mnp.feed_forward(x, p("W_1"), p("b_1"), p("W_2"), p("b_2"), activation)
        if norm_first:
            attended, w = attention(norm(X, 1), n_heads=n_heads, mask=mask, **weights)
            X = X + attended
            return X + ff(norm(X, 2)), w
        attended, w = attention(X, n_heads=n_heads, mask=mask, **weights)
        X = norm(X + attended, 1)
        return norm(X + ff(X), 2), w
    block.__name__ = f"encoder_block_{attention.__name__}"
    return block
