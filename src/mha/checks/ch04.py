"""Chapter 4, several heads: the check of `multihead_attention_loop`, its cases and
its catalogued mistakes."""

import numpy as np

import mha.numpy as mn
from mha.checks.inputs import rng, weights
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake


@cases_for("multihead_attention_loop", returns=OUT_AND_WEIGHTS)
def loop_cases():
    """Narrow heads, wide heads on a batch with a causal mask, and one head."""
    r = rng()
    narrow = [(weights(r, 6, 3), weights(r, 6, 3), weights(r, 6, 3)) for _ in range(2)]
    wide = [(weights(r, 4, 4), weights(r, 4, 4), weights(r, 4, 4)) for _ in range(3)]
    return [
        Case("2 narrow heads", (r.standard_normal((5, 6)), narrow, weights(r, 6, 6))),
        Case("3 wide heads, a batch, causal", (r.standard_normal((2, 4, 4)), wide, weights(r, 12, 4)),
             {"mask": mn.causal_mask(4)}),
        Case("1 head", (r.standard_normal((3, 6)), narrow[:1], weights(r, 3, 6))),
    ]


@mistake("multihead_attention_loop", "the concatenated heads must go through W_o")
def loop_without_W_o(X, heads, W_o, *, context=None, mask=None):
    eye = np.eye(sum(W_v.shape[1] for _, _, W_v in heads))
    out, w = mn.multihead_attention_loop(X, heads, eye, context=context, mask=mask)
    return out[..., : W_o.shape[1]], w


check_multihead_attention_loop = make_check("multihead_attention_loop")
