"""Chapter 3, queries, keys and values: the checks of `scaled_dot_product_attention`
and `head_attention`, their cases and their catalogued mistakes."""

import math

import numpy as np

import mha.numpy as mn
from mha.checks.inputs import a_masked_row, rng, weights
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake

# scaled dot-product attention ---------------------------------------------------------


@cases_for("scaled_dot_product_attention", returns=OUT_AND_WEIGHTS)
def sdpa_cases():
    """No mask, a query with nothing to attend to, batch and heads with a causal mask, T = 1."""
    r = rng()
    return [
        Case("no mask", (r.standard_normal((4, 3)), r.standard_normal((5, 3)), r.standard_normal((5, 2)))),
        Case("a query with nothing to attend to",
             (r.standard_normal((4, 3)), r.standard_normal((5, 3)), r.standard_normal((5, 2))),
             {"mask": a_masked_row(4, 5, 2)}),
        Case("batch and heads with a causal mask",
             tuple(r.standard_normal((2, 3, 4, 5)) for _ in range(3)), {"mask": mn.causal_mask(4)}),
        Case("T = 1", tuple(r.standard_normal((1, 3)) for _ in range(3))),
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


check_scaled_dot_product_attention = make_check("scaled_dot_product_attention")

# one head with W_q, W_k, W_v ----------------------------------------------------------


@cases_for("head_attention", returns=OUT_AND_WEIGHTS)
def head_attention_cases():
    """Without and with W_v, a batch with a masked row, and cross-attention to a context."""
    r = rng()
    X = r.standard_normal((5, 4))
    return [
        Case("no W_v: values are the inputs", (X, weights(r, 4, 2), weights(r, 4, 2))),
        Case("with W_v", (X, weights(r, 4, 3), weights(r, 4, 3), weights(r, 4, 2))),
        Case("a batch with a masked row",
             (r.standard_normal((2, 4, 4)), weights(r, 4, 2), weights(r, 4, 2), weights(r, 4, 3)),
             {"mask": a_masked_row(4, 4, 1)}),
        Case("context (cross-attention)",
             (X, weights(r, 4, 2), weights(r, 6, 2), weights(r, 6, 3)),
             {"context": r.standard_normal((3, 6))}),
    ]


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


check_head_attention = make_check("head_attention")
