"""Chapter 1, attention as a weighted average: the checks of `softmax` and
`self_attention`, their cases and their catalogued mistakes."""

import math

import numpy as np

from mha.checks.common import naive_softmax
from mha.checks.inputs import batch, normal, scores_far_apart, sizes
from mha.checks.reference import NUMPY as mn
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.rules import SOFTMAX_RULES, SELF_ATTENTION_RULES
from mha.checks.routes import SELF_ATTENTION_FORBIDS, SOFTMAX_FORBIDS


# softmax ------------------------------------------------------------------------------


def large_logits(r):
    """(3, 3) logits above 709, where exp overflows, in rows thousands apart: a maximum taken over the whole
    array (1002 and more) underflows the last row (about 3000 below it) to 0 / 0. The rows move by an offset
    drawn from `r` (0 to 500), and each logit by up to 1/2."""
    rows = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0], [-3000.0, -2999.0, -2998.0]])
    return rows + r.uniform(0.0, 500.0) + r.uniform(-0.5, 0.5, rows.shape)


@cases_for("softmax", may_use="NumPy only (no library softmax: not mnp.softmax, mnp.masked_softmax or "
                              "mnp.log_softmax)", forbids=SOFTMAX_FORBIDS, rules=SOFTMAX_RULES)
def softmax_cases(r):
    """A vector, rows, other axes, every negative axis of a 4-D array, and logits so large that exp
    overflows (above 709), in rows, then in columns, thousands apart; in float32, above 88."""
    four_d, large = r.standard_normal((2, 3, 4, 5)), large_logits(r)
    return [
        Case("a vector", (r.standard_normal(5),)),
        Case("rows of a matrix", (3 * r.standard_normal((3, 5)),)),
        Case("axis=0 of a matrix", (r.standard_normal((4, 3)),), {"axis": 0}),
        Case("axis=1 of a 3-D array", (r.standard_normal((2, 3, 4)),), {"axis": 1}),
        *[Case(f"axis={axis} of a 4-D array", (four_d,), {"axis": axis}) for axis in (-2, -3, -4)],
        Case("large logits", (large,)),
        Case("large logits, columns far apart, axis=0", (large_logits(r).T.copy(),), {"axis": 0}),
        Case("float32 logits above 88, rows far apart", ((large_logits(r) / 10).astype(np.float32),)),
    ]


@random_cases_for("softmax")
def softmax_random_cases(r):
    """A 4-D array along an axis before the last, rows and columns thousands apart (so that one row's
    maximum is far above another's), float32, and an axis of length 1."""
    far = normal(r, sizes(r, 2, 2, 5), scale=3)
    far += 1000.0 * r.choice([-4, -3, -2, 1, 2], size=(len(far), 1))
    far[int(r.integers(len(far)))] -= 5000.0  # one row far below every other row's maximum
    return [
        Case("random: a 4-D array along an axis before the last", (normal(r, sizes(r, 4, 2, 4)),),
             {"axis": int(r.choice([-4, -3, -2, 0, 1, 2]))}),
        Case("random: rows far apart", (far,)),
        Case("random: columns far apart, axis=0", (far.T.copy(),), {"axis": 0}),
        Case("random: float32", (normal(r, sizes(r, 3, 2, 4), np.float32, 3),), {"axis": int(r.integers(-3, 3))}),
        Case("random: an axis of length 1", (normal(r, (sizes(r, 1, 2, 4)[0], 1)),), {"axis": 1}),
    ]


def softmax_along(x, axis):
    """A right softmax along `axis`, for the mistakes below to get wrong in one place each."""
    x = np.asarray(x, dtype=float)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax", "a negative axis counts from the end: axis=-2 is the second-to-last axis, not the last; "
         "hand `axis` as it is to np.max and np.sum")
def softmax_negative_axis_as_last(x, axis=-1):
    return softmax_along(x, -1 if axis < 0 else axis)


@mistake("softmax", "the softmax is taken over the wrong axis: normalise along `axis`")
def softmax_wrong_axis(x, axis=-1):
    x = np.asarray(x, dtype=float)
    other = 0 if x.ndim > 1 and axis in (-1, x.ndim - 1) else -1
    return softmax_along(x, other)


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


@mistake("softmax", "subtract each row's own maximum (the maximum along `axis`, with keepdims=True), "
         "not the maximum of the whole array: a row far below it underflows to 0 / 0 = NaN")
def softmax_global_max(x, axis=-1):
    x = np.asarray(x, dtype=float)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max())
        return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax", "the log-sum-exp overflows: compute it as m + log(sum(exp(x - m))), with m the maximum "
         "along `axis` (keepdims=True)")
def softmax_log_sum_exp_without_max(x, axis=-1):
    x = np.asarray(x, dtype=float)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.exp(x - np.log(np.exp(x).sum(axis=axis, keepdims=True)))


@mistake("softmax", "in the log-sum-exp, m is the maximum of each slice along `axis` (keepdims=True), not of the "
         "whole array: a slice far below it gets log(0)")
def softmax_log_sum_exp_global_max(x, axis=-1):
    x = np.asarray(x, dtype=float)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        lse = x.max() + np.log(np.exp(x - x.max()).sum(axis=axis, keepdims=True))
        return np.exp(x - lse)


check_softmax = make_check("softmax")

# self-attention -----------------------------------------------------------------------


@cases_for("self_attention", returns=OUT_AND_WEIGHTS, may_use="NumPy, mnp.softmax and mnp.masked_softmax",
           forbids=SELF_ATTENTION_FORBIDS, rules=SELF_ATTENTION_RULES)
def self_attention_cases(r):
    """With and without a batch, with exclude_self, one token that may attend to nothing, and scores
    above 2000 in one row and near 0 in another."""
    return [
        Case("one sequence", (r.standard_normal((4, 3)),)),
        Case("a batch", (r.standard_normal((2, 5, 3)),)),
        Case("exclude_self", (r.standard_normal((4, 6)),), {"exclude_self": True}),
        Case("T = 1 with exclude_self", (r.standard_normal((1, 3)),), {"exclude_self": True}),
        Case("scores above 709 in one row, near 0 in another", (scores_far_apart(r, 4),)),
    ]


@random_cases_for("self_attention")
def self_attention_random_cases(r):
    """A 4-D batch, exclude_self in float32, T = 1, and inputs large enough to saturate the softmax."""
    T, d = sizes(r, 2, 2, 5)
    return [
        Case("random: a 4-D batch", (normal(r, batch(r, 2) + (T, d)),)),
        Case("random: exclude_self, float32", (normal(r, batch(r, 1) + (T, d), np.float32),), {"exclude_self": True}),
        Case("random: T = 1", (normal(r, (1, d)),), {"exclude_self": bool(r.integers(2))}),
        Case("random: large inputs, exclude_self", (normal(r, (T, d), scale=10),), {"exclude_self": True}),
    ]


def _self_attention(X, exclude_self, *, scaled=True, excluded=True, axis=-1, nan_when_empty=False, shift="row"):
    """Self-attention with one step changed, as the flags say (shift: see naive_softmax; "row" is right)."""
    scores = X @ np.swapaxes(X, -1, -2) / (math.sqrt(X.shape[-1]) if scaled else 1.0)
    mask = ~np.eye(X.shape[-2], dtype=bool) if exclude_self and excluded else None
    if shift != "row":
        w = naive_softmax(scores, mask, shift=shift)
    elif axis == -1 and not nan_when_empty:
        w = mn.masked_softmax(scores, mask)
    else:
        with np.errstate(invalid="ignore"):
            w = mn.softmax(scores if mask is None else np.where(mask, scores, -np.inf), axis=axis)
    return w @ X, w


@mistake("self_attention", "divide the scores by sqrt(d) before the softmax")
def self_attention_unscaled(X, exclude_self=False):
    return _self_attention(X, exclude_self, scaled=False)


@mistake("self_attention", "with exclude_self=True a token must not attend to itself: mask the diagonal")
def self_attention_ignores_exclude(X, exclude_self=False):
    return _self_attention(X, exclude_self, excluded=False)


@mistake("self_attention", "with T = 1 and exclude_self=True a token has nothing to attend to: "
         "give it zero weights and a zero output, not NaN")
def self_attention_nan_when_alone(X, exclude_self=False):
    return _self_attention(X, exclude_self, nan_when_empty=True)


@mistake("self_attention", "normalise each row (over keys, the last axis), not each column")
def self_attention_column_softmax(X, exclude_self=False):
    return _self_attention(X, exclude_self, axis=-2)


@mistake("self_attention", "exp overflows on scores above 709: subtract each row's maximum before "
         "exponentiating (mnp.softmax and mnp.masked_softmax do)")
def self_attention_softmax_without_max(X, exclude_self=False):
    return _self_attention(X, exclude_self, shift=None)


@mistake("self_attention", "subtract each row's own maximum, not the maximum of all the scores: a row far "
         "below it underflows to 0 / 0")
def self_attention_softmax_global_max(X, exclude_self=False):
    return _self_attention(X, exclude_self, shift="global")


check_self_attention = make_check("self_attention")
