"""Chapter 2, one learned matrix W: the check of `symmetric_attention`, its cases
and its catalogued mistakes."""

import math

import numpy as np

import mha.numpy as mn
from mha.checks.inputs import rng, weights
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake


@cases_for("symmetric_attention", returns=OUT_AND_WEIGHTS)
def symmetric_attention_cases():
    """W narrower and wider than the inputs, with and without a batch, and T = 1."""
    r = rng()
    return [
        Case("W narrower than X", (r.standard_normal((5, 4)), weights(r, 4, 2))),
        Case("a batch, W wider than X", (r.standard_normal((2, 3, 3)), weights(r, 3, 5))),
        Case("T = 1", (r.standard_normal((1, 4)), weights(r, 4, 3))),
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


check_symmetric_attention = make_check("symmetric_attention")
