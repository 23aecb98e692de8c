"""Chapter 2, one learned matrix W: the check of `symmetric_attention`, its cases
and its catalogued mistakes."""

import math

import numpy as np

from mha.checks.common import naive_softmax
from mha.checks.inputs import batch, different_sizes, normal, scores_far_apart, sizes, weights
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import SYMMETRIC_ATTENTION_RULES
from mha.checks.routes import SYMMETRIC_ATTENTION_FORBIDS
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for


@cases_for("symmetric_attention", returns=OUT_AND_WEIGHTS, may_use="np.einsum and mnp.softmax",
           forbids=SYMMETRIC_ATTENTION_FORBIDS, rules=SYMMETRIC_ATTENTION_RULES)
def symmetric_attention_cases(r):
    """W narrower and wider than the inputs, with and without a batch, T = 1, and scores above 2000 in one
    row and near 0 in another (W twice the identity, then wider: scores (XW)(XW)^T / sqrt(d_embed))."""
    X = scores_far_apart(r, 4)
    return [
        Case("W narrower than X", (r.standard_normal((5, 4)), weights(r, 4, 2))),
        Case("a batch, W wider than X", (r.standard_normal((2, 3, 3)), weights(r, 3, 5))),
        Case("T = 1", (r.standard_normal((1, 4)), weights(r, 4, 3))),
        Case("scores above 709 in one row, near 0 in another", (X, np.eye(4, 6) * 2 ** 0.5)),
    ]


@random_cases_for("symmetric_attention")
def symmetric_attention_random_cases(r):
    """W of other widths than X on a 4-D batch, in float32, with T = 1, and with large inputs."""
    d, e = different_sizes(r, 2, 1, 6)
    T = sizes(r, 1, 2, 5)[0]
    return [
        Case("random: a 4-D batch", (normal(r, batch(r, 2) + (T, d)), weights(r, d, e))),
        Case("random: float32", (normal(r, (T, e), np.float32), weights(r, e, d, np.float32))),
        Case("random: T = 1", (normal(r, (1, d)), weights(r, d, e))),
        Case("random: large inputs", (normal(r, batch(r, 1) + (T, d), scale=5), weights(r, d, e))),
    ]


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


def symmetric_with_own_softmax(X, W, shift):
    """Symmetric attention, right but for a softmax written by hand (see naive_softmax)."""
    E = X @ W
    w = naive_softmax(E @ np.swapaxes(E, -1, -2) / math.sqrt(W.shape[1]), shift=shift)
    return w @ X, w


@mistake("symmetric_attention", "exp overflows on scores above 709: subtract each row's maximum before "
         "exponentiating (mnp.softmax does)")
def symmetric_softmax_without_max(X, W):
    return symmetric_with_own_softmax(X, W, None)


@mistake("symmetric_attention", "subtract each row's own maximum, not the maximum of all the scores: a row far "
         "below it underflows to 0 / 0")
def symmetric_softmax_global_max(X, W):
    return symmetric_with_own_softmax(X, W, "global")


check_symmetric_attention = make_check("symmetric_attention")
