"""Chapter 5, fused heads and masks: the checks of `split_heads`, `merge_heads`,
`causal_mask`, `padding_mask` and `multihead_attention`, their cases and their
catalogued mistakes."""

import math

import numpy as np

from mha.checks.common import (multihead_softmax_global_max, multihead_softmax_without_max,
                               multihead_with_own_softmax)
from mha.checks.inputs import (a_masked_row, attention_params, batch, cast, causal, far_apart, normal, padding,
                               sizes, with_an_empty_row)
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import HEADS_RULES, CAUSAL_MASK_RULES, PADDING_MASK_RULES
from mha.checks.routes import (CAUSAL_MASK_FORBIDS, MERGE_HEADS_FORBIDS, MULTIHEAD_ROUTES, PADDING_MASK_FORBIDS,
                               SPLIT_HEADS_FORBIDS)
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for

# split and merge heads ----------------------------------------------------------------


@cases_for("split_heads", may_use="NumPy slicing and np.stack", forbids=SPLIT_HEADS_FORBIDS, rules=HEADS_RULES)
def split_heads_cases(r):
    """With and without a batch, h = 1 and d_head = 1."""
    return [
        Case("one sequence, 2 heads", (r.standard_normal((5, 6)), 2)),
        Case("a batch, 3 heads", (r.standard_normal((2, 4, 6)), 3)),
        Case("h = 1", (r.standard_normal((3, 4)), 1)),
        Case("d_head = 1", (r.standard_normal((2, 3, 4)), 4)),
    ]


@random_cases_for("split_heads")
def split_heads_random_cases(r):
    """A 4-D batch, float32 with T = 1, and d_head = 1 on a batch."""
    h, d_head, T = sizes(r, 3, 2, 4)
    return [
        Case("random: a 4-D batch", (normal(r, batch(r, 2) + (T, h * d_head)), h)),
        Case("random: float32, T = 1", (normal(r, (1, h * d_head), np.float32), h)),
        Case("random: d_head = 1", (normal(r, batch(r, 1) + (T, h)), h)),
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


@cases_for("merge_heads", may_use="NumPy slicing and np.concatenate", forbids=MERGE_HEADS_FORBIDS, rules=HEADS_RULES)
def merge_heads_cases(r):
    """Heads with and without a batch, and h = 1."""
    return [
        Case("2 heads", (r.standard_normal((2, 4, 3)),)),
        Case("a batch, 3 heads", (r.standard_normal((2, 3, 5, 2)),)),
        Case("h = 1", (r.standard_normal((1, 3, 4)),)),
    ]


@random_cases_for("merge_heads")
def merge_heads_random_cases(r):
    """A 4-D batch of heads, float32 with T = 1, and d_head = 1."""
    h, d_head, T = sizes(r, 3, 2, 4)
    return [
        Case("random: a batch of heads", (normal(r, batch(r, 2) + (h, T, d_head)),)),
        Case("random: float32, T = 1", (normal(r, (h, 1, d_head), np.float32),)),
        Case("random: d_head = 1", (normal(r, (h, T, 1)),)),
    ]


@mistake("merge_heads", "swap the h and T axes back before the reshape to (..., T, h * d_head)")
def merge_without_transpose(X):
    *batch, h, T, d_head = X.shape
    return X.reshape(*batch, T, h * d_head)


check_merge_heads = make_check("merge_heads")

# masks --------------------------------------------------------------------------------


@cases_for("causal_mask", may_use="NumPy: compare positions, without np.tril or np.triu",
           forbids=CAUSAL_MASK_FORBIDS, rules=CAUSAL_MASK_RULES)
def causal_mask_cases(r):
    """One token and two longer sequences."""
    return [Case("T = 1", (1,)), Case("T = 4", (4,)), Case("T = 7", (7,))]


@random_cases_for("causal_mask")
def causal_mask_random_cases(r):
    """Lengths that the named cases do not try: a short one, a middling one and a long one, so that no
    table of answers recorded for some lengths can cover them."""
    short = int(r.choice([2, 3, 5, 6, 8, 9, 10, 11, 12]))
    return [Case(f"random: T = {T}", (T,)) for T in (short, int(r.integers(13, 41)), int(r.integers(41, 121)))]


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


@cases_for("padding_mask", forbids=PADDING_MASK_FORBIDS, rules=PADDING_MASK_RULES)
def padding_mask_cases(r):
    """Three lengths, one of them 0, a single sequence, and lengths in a Python list, as the chapter
    passes them (mnp.padding_mask([5, 3, 1], 5))."""
    return [Case("three lengths", (np.array([3, 5, 0]), 5)), Case("one sequence", (np.array([2]), 4)),
            Case("lengths in a Python list: make an array of them first", ([4, 0, 2, 1], 4))]


@random_cases_for("padding_mask")
def padding_mask_random_cases(r):
    """Lengths from 0 to T, among them 0 and T; a single sequence; and T = 1."""
    B, T = sizes(r, 2, 2, 8)
    lengths = np.append(r.integers(0, T + 1, size=B), [0, T])
    return [
        Case("random: lengths from 0 to T", (r.permutation(lengths), T)),
        Case("random: one sequence", (r.integers(0, T + 1, size=1), T)),
        Case("random: T = 1", (r.integers(0, 2, size=B), 1)),
    ]


def real_tokens(lengths, T):
    """(B, T) boolean: True at the real tokens, for the mistakes below to place wrongly."""
    return np.arange(T) < np.asarray(lengths)[:, None]


@mistake("padding_mask", "padding hides keys, so the mask must have shape (B, 1, 1, T): "
         "it looks like padding was applied to queries, (B, 1, T, 1)")
def padding_on_queries(lengths, T):
    return real_tokens(lengths, T)[:, None, :, None]


@mistake("padding_mask", "True marks real tokens (may attend) and False marks padding")
def padding_flipped(lengths, T):
    return ~real_tokens(lengths, T)[:, None, None, :]


@mistake("padding_mask", "position t is real when t < length: the last real token is at length - 1")
def padding_off_by_one(lengths, T):
    real = np.arange(T) <= np.asarray(lengths)[:, None]
    return real[:, None, None, :]


check_padding_mask = make_check("padding_mask")

# multi-head attention in matrix form --------------------------------------------------


@cases_for("multihead_attention", returns=OUT_AND_WEIGHTS, may_use="NumPy, nothing from mha",
           forbids=MULTIHEAD_ROUTES)
def multihead_cases(r):
    """Padding, a causal mask, h = 1 without biases, cross-attention with a masked row, where W_q maps
    the inputs' width 6 to 8 (two heads of 4) and W_o maps 8 to 5, a mask of its own for each sequence
    and head, and scores above 1000 in one query's row and near 0 in the others' (W_q = W_k = [I I])."""
    X = r.standard_normal((3, 5, 6))
    X_far, context_far = far_apart(r, (2,), 3, 4, 3)
    far = {"W_q": np.hstack([np.eye(3)] * 2), "W_k": np.hstack([np.eye(3)] * 2),
           "W_v": r.standard_normal((3, 6)), "W_o": r.standard_normal((6, 4)), "b_o": r.standard_normal(4)}
    return [
        Case("a batch with padding", (X,), {**attention_params(r, 6), "n_heads": 2,
                                             "mask": mn.padding_mask([5, 3, 1], 5)}),
        Case("causal, 3 heads", (X,), {**attention_params(r, 6), "n_heads": 3, "mask": causal(5)}),
        Case("h = 1, no biases", (X[0],), {**attention_params(r, 6, bias=False), "n_heads": 1}),
        Case("cross-attention with a masked row", (X[0],),
             {**attention_params(r, 6, width=8, d_out=5), "n_heads": 2, "context": r.standard_normal((4, 6)),
              "mask": a_masked_row(5, 4, 3)}),
        Case("a mask per sequence and head (B, h, T_q, T_k)", (X,),
             {**attention_params(r, 6), "n_heads": 2, "mask": with_an_empty_row(r, (3, 2, 5, 5))}),
        Case("scores above 709 in one row, near 0 in the others", (X_far,),
             {**far, "n_heads": 2, "context": context_far}),
    ]


def head_sizes(r):
    """(d, h, d_head, d_out) with d != h * d_head, d // h != d_head and d_out apart from both: projections
    that are not square, so that every width the learner could scale by gives another answer."""
    while True:
        d, h, d_head, d_out = sizes(r, 4, 1, 6)
        if len({d, h * d_head, d_out}) == 3 and d // h != d_head:
            return d, h, d_head, d_out


@random_cases_for("multihead_attention")
def multihead_random_cases(r):
    """Projections that are not square, on a 4-D batch with a query that may attend to nothing, in
    cross-attention in float32 without biases, with T = 1, and with large inputs and a causal mask."""
    d, h, d_head, d_out = head_sizes(r)
    (b1, b2), (T_q, T_k) = batch(r, 2), sizes(r, 2, 2, 5)

    def params(bias=True):
        return {**attention_params(r, d, bias, width=h * d_head, d_out=d_out), "n_heads": h}

    return [
        Case("random: a 4-D batch, a query with nothing to attend to", (normal(r, (b1, b2, T_q, d)),),
             {**params(), "mask": with_an_empty_row(r, (b1, b2, 1, T_q, T_q))}),
        Case("random: cross-attention, float32, no biases", (normal(r, (b1, T_q, d), np.float32),),
             {**cast(params(bias=False), np.float32), "context": normal(r, (b1, T_k, d), np.float32),
              "mask": padding(r, (b1,), T_k)}),
        Case("random: T = 1", (normal(r, (1, d)),), params()),
        Case("random: large inputs, causal", (normal(r, (T_q, d), scale=10),), {**params(), "mask": causal(T_q)}),
    ]


def _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, *, split=mn.split_heads, merge=mn.merge_heads,
           scale_by=None, biases=True, project_out=True, flip_mask=False, nan_when_empty=False):
    """Multi-head attention with one step changed, as the keywords say; `scale_by(X, Q, n_heads)` is
    the width whose square root divides the scores (default d_head). (A softmax written by hand:
    mha.checks.common.multihead_with_own_softmax.)"""
    bias = {b: kw.get(b) if biases else None for b in ("b_q", "b_k", "b_v", "b_o")}
    source = X if kw.get("context") is None else kw["context"]
    Q, K, V = (split(a @ W + (0 if bias[b] is None else bias[b]), n_heads)
               for a, W, b in ((X, W_q, "b_q"), (source, W_k, "b_k"), (source, W_v, "b_v")))
    width = Q.shape[-1] if scale_by is None else scale_by(X, Q, n_heads)
    scores, mask = Q @ np.swapaxes(K, -1, -2) / math.sqrt(width), kw.get("mask")
    mask = None if mask is None else (~np.asarray(mask) if flip_mask else mask)
    if nan_when_empty:
        with np.errstate(invalid="ignore"):
            w = mn.softmax(scores if mask is None else np.where(mask, scores, -np.inf))
    else:
        w = mn.masked_softmax(scores, mask)
    out = merge(w @ V)
    if not project_out:
        return out, w
    return out @ W_o + (0 if bias["b_o"] is None else bias["b_o"]), w


@mistake("multihead_attention", "divide the scores by sqrt(d_head) = sqrt(d_model / n_heads)")
def mha_unscaled(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, scale_by=lambda X, Q, h: 1)


@mistake("multihead_attention", "scale by sqrt(d_head), the width of one head, not sqrt(d_model)")
def mha_scaled_by_d_model(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, scale_by=lambda X, Q, h: h * Q.shape[-1])


@mistake("multihead_attention", "the scale is 1/sqrt(d_head), the width of one head's queries "
         "(W_q.shape[1] // n_heads), not of the input (X.shape[-1] // n_heads): they differ as soon "
         "as W_q is not square")
def mha_scaled_by_input_width(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, scale_by=lambda X, Q, h: X.shape[-1] // h)


@mistake("multihead_attention", "split heads with a reshape AND a transpose: (..., T, h, d_head) "
         "then (..., h, T, d_head)")
def mha_split_without_transpose(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, split=split_without_transpose)


@mistake("multihead_attention", "merge heads by swapping h and T back before the reshape")
def mha_merge_without_transpose(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, merge=merge_without_transpose)


@mistake("multihead_attention", "the merged heads must go through W_o (and b_o)")
def mha_without_W_o(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, project_out=False)


@mistake("multihead_attention", "the mask means True = may attend: keep the True entries")
def mha_mask_flipped(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, flip_mask=True)


@mistake("multihead_attention", "add the biases b_q, b_k, b_v and b_o")
def mha_ignores_biases(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, biases=False)


@mistake("multihead_attention", "a query whose row of the mask is all False gets zero weights and a zero "
         "output, not NaN: once its scores are all -inf, subtract 0 instead of their maximum")
def mha_nan_on_a_masked_row(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return _fused(X, W_q, W_k, W_v, W_o, n_heads, kw, nan_when_empty=True)


@mistake("multihead_attention", "exp overflows on scores above 709: subtract each row's maximum (over its "
         "allowed keys) before exponentiating")
def mha_softmax_without_max(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return multihead_softmax_without_max(X, W_q, W_k, W_v, W_o, n_heads, **kw)


@mistake("multihead_attention", "subtract each row's own maximum, not the maximum of all the scores (every row, "
         "head and sequence): a row far below it underflows to 0 / 0")
def mha_softmax_global_max(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return multihead_softmax_global_max(X, W_q, W_k, W_v, W_o, n_heads, **kw)


@mistake("multihead_attention", "subtract each row's own maximum, not the maximum of all the scores (every row, "
         "head and sequence): a row far below it underflows to all-zero weights, as if it had no key to attend to")
def mha_softmax_global_max_guarded(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return multihead_with_own_softmax(X, W_q, W_k, W_v, W_o, n_heads, shift="global", zero_when_empty=True, **kw)


check_multihead_attention = make_check("multihead_attention")
