"""Chapter 1, attention as a weighted average: the checks of `softmax` and
`self_attention`, their cases and their catalogued mistakes."""

import math

import numpy as np

import mha.numpy as mn
from mha.checks.inputs import rng
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake

# softmax ------------------------------------------------------------------------------


@cases_for("softmax")
def softmax_cases():
    """A vector, rows, other axes, and logits so large that exp overflows."""
    r = rng()
    return [
        Case("a vector", (r.standard_normal(5),)),
        Case("rows of a matrix", (3 * r.standard_normal((3, 5)),)),
        Case("axis=0 of a matrix", (r.standard_normal((4, 3)),), {"axis": 0}),
        Case("axis=1 of a 3-D array", (r.standard_normal((2, 3, 4)),), {"axis": 1}),
        Case("large logits", (np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]]),)),
    ]


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


check_softmax = make_check("softmax")

# self-attention -----------------------------------------------------------------------


@cases_for("self_attention", returns=OUT_AND_WEIGHTS)
def self_attention_cases():
    """With and without a batch, with exclude_self, and one token that may attend to nothing."""
    r = rng()
    return [
        Case("one sequence", (r.standard_normal((4, 3)),)),
        Case("a batch", (r.standard_normal((2, 5, 3)),)),
        Case("exclude_self", (r.standard_normal((4, 6)),), {"exclude_self": True}),
        Case("T = 1 with exclude_self", (r.standard_normal((1, 3)),), {"exclude_self": True}),
    ]


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


check_self_attention = make_check("self_attention")
