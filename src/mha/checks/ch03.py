"""Chapter 3, queries, keys and values: the checks of `scaled_dot_product_attention`
and `head_attention`, their cases and their catalogued mistakes."""

import math

import numpy as np

from mha.checks.common import head_with_own_softmax, sdpa_with_own_softmax
from mha.checks.inputs import (a_masked_row, batch, causal, different_sizes, far_apart, key_only_mask, normal,
                               sizes, weights, with_an_empty_row)
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import SDPA_RULES, HEAD_ATTENTION_RULES
from mha.checks.routes import HEAD_ATTENTION_FORBIDS, ONLY_SELF_ATTENTION, SDPA_FORBIDS  # noqa: F401
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for

# scaled dot-product attention ---------------------------------------------------------


@cases_for("scaled_dot_product_attention", returns=OUT_AND_WEIGHTS, may_use="NumPy and mnp.masked_softmax",
           forbids=SDPA_FORBIDS, rules=SDPA_RULES)
def sdpa_cases(r):
    """No mask, a query with nothing to attend to, batch and heads with a causal mask, T = 1, a mask of
    keys (B, 1, T_k) for 4 queries, a mask with batch and head axes, and scores above 1000 in one query's
    row and near 0 in the others'."""
    Q_far, K_far = far_apart(r, (2,), 3, 4, 3)
    return [
        Case("no mask", (r.standard_normal((4, 3)), r.standard_normal((5, 3)), r.standard_normal((5, 2)))),
        Case("a query with nothing to attend to",
             (r.standard_normal((4, 3)), r.standard_normal((5, 3)), r.standard_normal((5, 2))),
             {"mask": a_masked_row(4, 5, 2)}),
        Case("batch and heads with a causal mask",
             tuple(r.standard_normal((2, 3, 4, 5)) for _ in range(3)), {"mask": causal(4)}),
        Case("T = 1", tuple(r.standard_normal((1, 3)) for _ in range(3))),
        Case("a mask of keys (B, 1, T_k) for T_q = 4 queries: broadcast it to (B, T_q, T_k)",
             (r.standard_normal((2, 4, 3)), r.standard_normal((2, 5, 3)), r.standard_normal((2, 5, 2))),
             {"mask": key_only_mask(2, 5)}),
        Case("a mask with batch and head axes (B, h, T_q, T_k)",
             (r.standard_normal((2, 3, 4, 3)), r.standard_normal((2, 3, 5, 3)), r.standard_normal((2, 3, 5, 2))),
             {"mask": with_an_empty_row(r, (2, 3, 4, 5))}),
        Case("scores above 709 in one row, near 0 in the others", (Q_far, K_far, r.standard_normal((2, 4, 2)))),
    ]


@random_cases_for("scaled_dot_product_attention")
def sdpa_random_cases(r):
    """d_k != d_v and T_q != T_k throughout: batch and heads with an empty row, large logits, float32, T = 1."""
    T_q, T_k, d_k, d_v = different_sizes(r, 4, 1, 6)
    b, h = batch(r, 2)

    def qkv(lead=(), dtype=np.float64, scale=1.0, n_q=T_q, n_k=T_k):
        return (normal(r, lead + (n_q, d_k), dtype, scale), normal(r, lead + (n_k, d_k), dtype, scale),
                normal(r, lead + (n_k, d_v), dtype))

    return [
        Case("random: batch and heads, a query with nothing to attend to", qkv((b, h)),
             {"mask": with_an_empty_row(r, (b, 1, T_q, T_k))}),
        Case("random: large logits and a mask", qkv(scale=30), {"mask": with_an_empty_row(r, (T_q, T_k))}),
        Case("random: float32, a mask of keys", qkv((b,), np.float32), {"mask": r.random((b, 1, T_k)) < 0.6}),
        Case("random: one query and one key", qkv((h,), n_q=1, n_k=1)),
    ]


def softmax_rows(scores, mask=None, *, fill=-np.inf):
    """A softmax that is right apart from what the caller changes."""
    if mask is not None:
        scores = np.where(mask, scores, fill)
    return mn.softmax(scores)


@mistake("scaled_dot_product_attention", "divide the scores by sqrt(d_k) before the softmax")
def sdpa_unscaled(Q, K, V, mask=None):
    w = mn.masked_softmax(Q @ np.swapaxes(K, -1, -2), mask)
    return w @ V, w


@mistake("scaled_dot_product_attention", "the mask means True = may attend: keep the True entries")
def sdpa_mask_flipped(Q, K, V, mask=None):
    w = mn.masked_softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), None if mask is None else ~mask)
    return w @ V, w


@mistake("scaled_dot_product_attention", "divide by sqrt(d_k), the width of the queries and keys, "
         "not by sqrt(d_v), the width of the values")
def sdpa_scaled_by_value_width(Q, K, V, mask=None):
    w = mn.masked_softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(V.shape[-1]), mask)
    return w @ V, w


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


@mistake("scaled_dot_product_attention", "exp overflows on scores above 709: subtract each row's maximum before "
         "exponentiating (mnp.masked_softmax does)")
def sdpa_softmax_without_max(Q, K, V, mask=None):
    return sdpa_with_own_softmax(Q, K, V, mask, None)


@mistake("scaled_dot_product_attention", "subtract each row's own maximum, not the maximum of all the scores: "
         "a row far below it underflows to 0 / 0")
def sdpa_softmax_global_max(Q, K, V, mask=None):
    return sdpa_with_own_softmax(Q, K, V, mask, "global")


check_scaled_dot_product_attention = make_check("scaled_dot_product_attention")

# one head with W_q, W_k, W_v ----------------------------------------------------------


@cases_for("head_attention", returns=OUT_AND_WEIGHTS, may_use="NumPy (np.einsum) and mnp.masked_softmax",
           forbids=HEAD_ATTENTION_FORBIDS, rules=HEAD_ATTENTION_RULES)
def head_attention_cases(r):
    """Without and with W_v, a batch with a masked row, cross-attention to a context, a mask of keys
    (B, 1, T_k) for 4 queries, and scores above 1000 in one query's row and near 0 in the others'
    (W_q = W_k = I: the queries and keys are X and the context themselves)."""
    X = r.standard_normal((5, 4))
    X_far, context_far = far_apart(r, (2,), 3, 4, 3)
    return [
        Case("no W_v: values are the inputs", (X, weights(r, 4, 2), weights(r, 4, 2))),
        Case("with W_v", (X, weights(r, 4, 3), weights(r, 4, 3), weights(r, 4, 2))),
        Case("a batch with a masked row",
             (r.standard_normal((2, 4, 4)), weights(r, 4, 2), weights(r, 4, 2), weights(r, 4, 3)),
             {"mask": a_masked_row(4, 4, 1)}),
        Case("context (cross-attention)",
             (X, weights(r, 4, 2), weights(r, 6, 2), weights(r, 6, 3)),
             {"context": r.standard_normal((3, 6))}),
        Case("a mask of keys (B, 1, T_k) for T_q = 4 queries: broadcast it to (B, T_q, T_k)",
             (r.standard_normal((2, 4, 4)), weights(r, 4, 2), weights(r, 4, 2), weights(r, 4, 3)),
             {"mask": key_only_mask(2, 4)}),
        Case("scores above 709 in one row, near 0 in the others",
             (X_far, np.eye(3), np.eye(3), weights(r, 3, 2)), {"context": context_far}),
    ]


@random_cases_for("head_attention")
def head_attention_random_cases(r):
    """d, d_c, d_head and d_v all different: cross-attention on a 4-D batch with a query that may attend to
    nothing, cross-attention without W_v in float32, T = 1, and large inputs."""
    d, d_c, d_head, d_v = different_sizes(r, 4, 1, 6)
    (T_q, T_k), (b1, b2) = sizes(r, 2, 2, 5), batch(r, 2)
    head = (weights(r, d, d_head), weights(r, d, d_head), weights(r, d, d_v))
    return [
        Case("random: cross-attention on a 4-D batch, a query with nothing to attend to",
             (normal(r, (b1, b2, T_q, d)), weights(r, d, d_head), weights(r, d_c, d_head), weights(r, d_c, d_v)),
             {"context": normal(r, (b1, b2, T_k, d_c)), "mask": with_an_empty_row(r, (b1, 1, T_q, T_k))}),
        Case("random: cross-attention without W_v, float32",
             (normal(r, (T_q, d), np.float32), weights(r, d, d_head, np.float32), weights(r, d_c, d_head, np.float32)),
             {"context": normal(r, (T_k, d_c), np.float32)}),
        Case("random: T = 1", (normal(r, (1, d)), *head)),
        Case("random: large inputs and a mask", (normal(r, (b1, T_q, d), scale=10), *head),
             {"mask": with_an_empty_row(r, (T_q, T_q))}),
    ]


@mistake("head_attention", "queries come from X with W_q and keys from the context with W_k: "
         "the roles of W_q and W_k look swapped")
def head_attention_swapped(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    source = X if context is None else context
    V = source if W_v is None else source @ W_v
    return mn.scaled_dot_product_attention(X @ W_k, source @ W_q, V, mask)


@mistake("head_attention", "divide by sqrt(d_head), the width of the queries, not by sqrt(d)")
def head_attention_scaled_by_input(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    source = X if context is None else context
    Q, K = X @ W_q, source @ W_k
    V = source if W_v is None else source @ W_v
    scale = math.sqrt(Q.shape[-1] / X.shape[-1])  # turns 1/sqrt(d_head) into 1/sqrt(d)
    return mn.scaled_dot_product_attention(Q * scale, K, V, mask)


@mistake("head_attention", "exp overflows on scores above 709: subtract each row's maximum before "
         "exponentiating (mnp.masked_softmax does)")
def head_attention_softmax_without_max(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    return head_with_own_softmax(X, W_q, W_k, W_v, context, mask, None)


@mistake("head_attention", "subtract each row's own maximum, not the maximum of all the scores: a row far "
         "below it underflows to 0 / 0")
def head_attention_softmax_global_max(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    return head_with_own_softmax(X, W_q, W_k, W_v, context, mask, "global")


check_head_attention = make_check("head_attention")
