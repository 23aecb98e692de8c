"""Chapter 5, fused heads and masks: the checks of `split_heads`, `merge_heads`,
`causal_mask`, `padding_mask` and `multihead_attention`, their cases and their
catalogued mistakes."""

import math

import numpy as np

import mha.numpy as mn
from mha.checks.inputs import a_masked_row, attention_params, rng
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake

# split and merge heads ----------------------------------------------------------------


@cases_for("split_heads")
def split_heads_cases():
    """With and without a batch, h = 1 and d_head = 1."""
    r = rng()
    return [
        Case("one sequence, 2 heads", (r.standard_normal((5, 6)), 2)),
        Case("a batch, 3 heads", (r.standard_normal((2, 4, 6)), 3)),
        Case("h = 1", (r.standard_normal((3, 4)), 1)),
        Case("d_head = 1", (r.standard_normal((2, 3, 4)), 4)),
    ]


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


check_split_heads = make_check("split_heads")


@cases_for("merge_heads")
def merge_heads_cases():
    """Heads with and without a batch, and h = 1."""
    r = rng()
    return [
        Case("2 heads", (r.standard_normal((2, 4, 3)),)),
        Case("a batch, 3 heads", (r.standard_normal((2, 3, 5, 2)),)),
        Case("h = 1", (r.standard_normal((1, 3, 4)),)),
    ]


@mistake("merge_heads", "swap the h and T axes back before the reshape to (..., T, h * d_head)")
def merge_without_transpose(X):
    *batch, h, T, d_head = X.shape
    return X.reshape(*batch, T, h * d_head)


check_merge_heads = make_check("merge_heads")

# masks --------------------------------------------------------------------------------


@cases_for("causal_mask")
def causal_mask_cases():
    """One token and two longer sequences."""
    return [Case("T = 1", (1,)), Case("T = 4", (4,)), Case("T = 7", (7,))]


@mistake("causal_mask", "query t may attend to keys 0..t, itself included: keep the diagonal")
def causal_without_diagonal(T):
    return np.tril(np.ones((T, T), dtype=bool), k=-1)


@mistake("causal_mask", "True must be on and below the diagonal (the past), not above it (the future)")
def causal_upper(T):
    return np.triu(np.ones((T, T), dtype=bool))


@mistake("causal_mask", "one step too far: query t must not see key t + 1")
def causal_one_ahead(T):
    return np.tril(np.ones((T, T), dtype=bool), k=1)


check_causal_mask = make_check("causal_mask")


@cases_for("padding_mask")
def padding_mask_cases():
    """Three lengths, one of them 0, and a single sequence."""
    return [Case("three lengths", (np.array([3, 5, 0]), 5)), Case("one sequence", (np.array([2]), 4))]


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


check_padding_mask = make_check("padding_mask")

# multi-head attention in matrix form --------------------------------------------------


@cases_for("multihead_attention", returns=OUT_AND_WEIGHTS)
def multihead_cases():
    """Padding, a causal mask, h = 1 without biases, and cross-attention with a masked row."""
    r = rng()
    X = r.standard_normal((3, 5, 6))
    return [
        Case("a batch with padding", (X,), {**attention_params(r, 6), "n_heads": 2,
                                             "mask": mn.padding_mask([5, 3, 1], 5)}),
        Case("causal, 3 heads", (X,), {**attention_params(r, 6), "n_heads": 3, "mask": mn.causal_mask(5)}),
        Case("h = 1, no biases", (X[0],), {**attention_params(r, 6, bias=False), "n_heads": 1}),
        Case("cross-attention with a masked row", (X[0],),
             {**attention_params(r, 6), "n_heads": 2, "context": r.standard_normal((4, 6)),
              "mask": a_masked_row(5, 4, 3)}),
    ]


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
    """A bias scaled like its weight matrix, or None."""
    return None if b is None else b * factor


def _mha_with(X, W_q, W_k, W_v, W_o, n_heads, kw, split=mn.split_heads, merge=mn.merge_heads):
    """multihead_attention with another split or merge of the heads."""
    source = X if kw.get("context") is None else kw["context"]
    Q, K, V = (mn.project(n, a, W, kw.get(b), "x") for n, a, W, b in
               (("W_q", X, W_q, "b_q"), ("W_k", source, W_k, "b_k"), ("W_v", source, W_v, "b_v")))
    out, w = mn.scaled_dot_product_attention(split(Q, n_heads), split(K, n_heads), split(V, n_heads),
                                             kw.get("mask"))
    return mn.project("W_o", merge(out), W_o, kw.get("b_o"), "x"), w


check_multihead_attention = make_check("multihead_attention")
