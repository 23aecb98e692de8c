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


# decoder_block (chapter 9) ------------------------------------------------------------

def _decoder(X, memory, n_heads, params, *, self_mask, memory_mask, causal, norm_first, eps, activation,
             cross_from_target=False, ignore_causal=False, norm_memory=False, flip_norm=False):
    p = {k: params.get(k) for k in mn.DECODER_BLOCK_PARAMS}

    def attend(part, x, context, mask):
        return mn.multihead_attention(x, n_heads=n_heads, context=context, mask=mask,
                                      **{k: p[f"{part}_{k}"] for k in mn.ATTENTION_PARAMS})

    def ln(x, i):
        return mn.layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    if causal and not ignore_causal:
        self_mask = mn.causal_mask(X.shape[-2]) & (True if self_mask is None else self_mask)
    if cross_from_target:  # keys and values from the target: the padding of the source no longer fits
        memory, memory_mask = None, None

    def ff(x):
        return mn.feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"], activation)

    if norm_first != flip_norm:
        a, w_self = attend("self", ln(X, 1), None, self_mask)
        X = X + a
        source = ln(memory, 2) if norm_memory and memory is not None else memory
        a, w_cross = attend("cross", ln(X, 2), source, memory_mask)
        X = X + a
        return X + ff(ln(X, 3)), (w_self, w_cross)
    a, w_self = attend("self", X, None, self_mask)
    X = ln(X + a, 1)
    a, w_cross = attend("cross", X, memory, memory_mask)
    X = ln(X + a, 2)
    return ln(X + ff(X), 3), (w_self, w_cross)


@mistake("decoder_block", "cross-attention takes its queries from the target but its keys and values "
         "from `memory`, the encoder's output")
def decoder_cross_from_target(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                              norm_first=False, eps=1e-5, activation="relu", **params):
    return _decoder(X, memory, n_heads, params, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                    norm_first=norm_first, eps=eps, activation=activation, cross_from_target=True)


@mistake("decoder_block", "with causal=True, combine self_mask with the causal mask (both must allow a key): "
         "position t may not attend to later positions")
def decoder_without_causal(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                           norm_first=False, eps=1e-5, activation="relu", **params):
    return _decoder(X, memory, n_heads, params, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                    norm_first=norm_first, eps=eps, activation=activation, ignore_causal=True)


@mistake("decoder_block", "in pre-norm, LN_2 normalises the target before the cross-attention; "
         "`memory` goes in as it is")
def decoder_normalises_memory(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                              norm_first=False, eps=1e-5, activation="relu", **params):
    return _decoder(X, memory, n_heads, params, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                    norm_first=norm_first, eps=eps, activation=activation, norm_memory=True)


@mistake("decoder_block", "check where the LayerNorms go: post-norm (norm_first=False) is "
         "LN(x + sublayer(x)); pre-norm is x + sublayer(LN(x))")
def decoder_norm_swapped(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                         norm_first=False, eps=1e-5, activation="relu", **params):
    return _decoder(X, memory, n_heads, params, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                    norm_first=norm_first, eps=eps, activation=activation, flip_norm=True)


# attention_at_offset --------------------------------------------------------------------

@mistake("attention_at_offset", "offset -1 is the key just BEFORE the query: read weights[..., i, i + offset], "
         "not weights[..., i, i - offset]")
def offset_sign_flipped(weights, offset):
    return np.diagonal(np.asarray(weights, dtype=float), -offset, axis1=-2, axis2=-1).mean(axis=-1)


@mistake("attention_at_offset", "average over the queries that have a key at that offset "
         "(T - |offset| of them), not over all T_q queries")
def offset_divided_by_all_queries(weights, offset):
    weights = np.asarray(weights, dtype=float)
    return np.diagonal(weights, offset, axis1=-2, axis2=-1).sum(axis=-1) / weights.shape[-2]


@mistake("attention_at_offset", "the first token has no previous token: do not wrap around to the "
         "last key (skip the queries whose key i + offset does not exist)")
def offset_wraps_around(weights, offset):
    weights = np.asarray(weights, dtype=float)
    T_q, T_k = weights.shape[-2:]
    keys = (np.arange(T_q) + offset) % T_k
    return weights[..., np.arange(T_q), keys].mean(axis=-1)


# chunked attention (chapter 8) -----------------------------------------------------------

def _online_softmax(Q, K, V, mask, chunk, *, rescale=True, safe=True, keep_last=True, scale_acc=True,
                    keep_true_max=True):
    """Chunked attention with one step left out, as the flags say."""
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    T_k = K.shape[-2]
    shape = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2]) + (Q.shape[-2], T_k)
    mask = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(mask, shape)
    Q = Q / math.sqrt(Q.shape[-1])
    row_max = np.full(shape[:-1] + (1,), -np.inf)
    row_sum = np.zeros_like(row_max)
    acc = np.zeros(shape[:-1] + (V.shape[-1],))
    stop = T_k if keep_last else T_k - T_k % chunk
    for start in range(0, stop, chunk):
        block = slice(start, start + chunk)
        scores = np.where(mask[..., block], Q @ np.swapaxes(K[..., block, :], -1, -2), -np.inf)
        new_max = np.maximum(row_max, scores.max(axis=-1, keepdims=True))
        ref = np.where(np.isfinite(new_max), new_max, 0) if safe else new_max
        factor = np.exp(row_max - ref) if rescale else 1.0
        p = np.exp(scores - ref)
        row_sum = row_sum * factor + p.sum(axis=-1, keepdims=True)
        acc = acc * (factor if scale_acc else 1.0) + p @ V[..., block, :]
        row_max = new_max if keep_true_max else ref
    if not safe:
        return acc / row_sum
    return np.divide(acc, row_sum, out=np.zeros_like(acc), where=row_sum > 0)


@mistake("chunked_attention", "when a block brings a larger maximum, rescale what you have so far: multiply "
         "the running sum and the accumulated output by exp(old_max - new_max) before adding the block")
def chunked_without_rescaling(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, rescale=False)


@mistake("chunked_attention", "rescale the accumulated output too, not only the running sum: both were "
         "computed relative to the old maximum")
def chunked_rescales_only_the_sum(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, scale_acc=False)


@mistake("chunked_attention", "a row with no allowed key so far has a running maximum of -inf, and "
         "-inf - (-inf) is NaN: subtract 0 instead while the maximum is -inf, and divide only where the "
         "running sum is positive (a query with nothing to attend to gets zeros)")
def chunked_nan_on_masked_rows(Q, K, V, mask=None, chunk=256):
    with np.errstate(invalid="ignore", divide="ignore"):
        return _online_softmax(Q, K, V, mask, chunk, safe=False)


@mistake("chunked_attention", "the last block may be shorter than `chunk`: loop with "
         "range(0, T_k, chunk) so the keys after the last full block are not dropped")
def chunked_drops_the_last_block(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, keep_last=False)


@mistake("chunked_attention", "a softmax per block is not the softmax over all keys: keep a running "
         "maximum and sum across the blocks and divide once, at the end")
def chunked_softmax_per_block(Q, K, V, mask=None, chunk=256):
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    total = 0.0
    for start in range(0, K.shape[-2], chunk):
        block = slice(start, start + chunk)
        block_mask = None if mask is None else np.broadcast_to(
            mask, np.broadcast_shapes(np.shape(mask), Q.shape[:-1] + (K.shape[-2],)))[..., block]
        total = total + mn.scaled_dot_product_attention(Q, K[..., block, :], V[..., block, :], block_mask)[0]
    return total


@mistake("chunked_attention", "keep the true running maximum, -inf while a row has no allowed key yet; "
         "only the number you subtract may stand in as 0. A stored 0 makes exp(score - 0) underflow to 0 "
         "when the real scores come later and are very negative")
def chunked_max_reset_to_zero(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, keep_true_max=False)
