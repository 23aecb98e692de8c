"""Chapter 9, the decoder side: the check of `decoder_block`, its cases and its
catalogued mistakes."""

import numpy as np

from mha.checks.common import multihead_softmax_global_max, multihead_softmax_without_max
from mha.checks.inputs import (attention_params, batch, cast, normal, padding, scores_far_apart, sizes, weights,
                               with_an_empty_row)
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import DECODER_BLOCK_RULES
from mha.checks.routes import DECODER_BLOCK_FORBIDS
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for


def decoder_block_params(r, d, d_ff, bias=True):
    """Every parameter of mha.numpy.decoder_block; with bias=False the biases and betas are None."""
    params = {f"{part}_{k}": v for part in ("self", "cross") for k, v in attention_params(r, d).items()}
    for i in (1, 2, 3):
        params[f"gamma_{i}"], params[f"beta_{i}"] = 1 + 0.3 * r.standard_normal(d), 0.3 * r.standard_normal(d)
    params.update({"W_1": weights(r, d, d_ff), "b_1": 0.3 * r.standard_normal(d_ff),
                   "W_2": weights(r, d_ff, d), "b_2": 0.3 * r.standard_normal(d)})
    if not bias:
        params.update({k: None for k in params if k.startswith(("self_b_", "cross_b_", "b_", "beta_"))})
    return params


@cases_for("decoder_block", returns=("out", ("self_weights", "cross_weights")),
           may_use="NumPy, mnp.multihead_attention, mnp.layer_norm and mnp.feed_forward (not mnp.causal_mask: "
                   "build the causal pattern yourself)",
           forbids=DECODER_BLOCK_FORBIDS, packages=("scipy",), rules=DECODER_BLOCK_RULES)  # feed_forward's GELU: erf
def decoder_block_cases(r):
    """Post-norm and pre-norm, causal masks given both ways, padding, a source with no real token, and
    self-attention scores above 709 in one row of a sequence and near 0 (2800 below) in another."""
    X, memory = r.standard_normal((2, 4, 6)), r.standard_normal((2, 5, 6))
    far = X.copy()
    far[0] = scores_far_apart(r, 6)  # with W_q = W_k = I: head 0's scores reach 2864 in row 0, about 0 in row 2
    return [
        Case("post-norm, causal, padded target and source", (X, memory, 2),
             {**decoder_block_params(r, 6, 10), "causal": True, "self_mask": mn.padding_mask([4, 3], 4),
              "memory_mask": mn.padding_mask([5, 2], 5)}),
        Case("pre-norm, gelu, one sequence, the causal mask given as self_mask", (X[0, :3], memory[0], 3),
             {**decoder_block_params(r, 6, 10), "norm_first": True, "activation": "gelu",
              "self_mask": mn.causal_mask(3)}),
        Case("no biases, a source with no real token, self-attention scores above 709 in one row and near 0 "
             "in another", (far, memory[:, :3], 2),
             {**decoder_block_params(r, 6, 8, bias=False), "self_W_q": np.eye(6), "self_W_k": np.eye(6),
              "causal": True, "eps": 0.1, "memory_mask": mn.padding_mask([3, 0], 3)}),
    ]


@random_cases_for("decoder_block")
def decoder_block_random_cases(r):
    """Post-norm on a 4-D batch with a target query that may attend to nothing and a source of padding
    only, pre-norm with GELU in float32 and the causal mask in self_mask, and T = 1 without biases."""
    (h, d_head), (T, T_k, d_ff), b = sizes(r, 2, 1, 3), sizes(r, 3, 2, 6), batch(r, 2)
    d = h * (d_head + 3)  # at least 4 features, for LayerNorm in float32 (see ch06)

    def sequences(lead, n_queries, dtype=np.float64):
        return normal(r, lead + (n_queries, d), dtype), normal(r, lead + (T_k, d), dtype), h

    return [
        Case("random: post-norm, causal, a 4-D batch, a source of padding only", sequences(b, T),
             {**decoder_block_params(r, d, d_ff), "causal": True, "self_mask": with_an_empty_row(r, (*b, 1, T, T)),
              "memory_mask": padding(r, b, T_k)}),
        Case("random: pre-norm, gelu, float32, the causal mask given as self_mask", sequences(b[:1], T, np.float32),
             {**cast(decoder_block_params(r, d, d_ff), np.float32), "norm_first": True, "activation": "gelu",
              "self_mask": mn.causal_mask(T)}),
        Case("random: T = 1, no biases", sequences(b[:1], 1),
             {**decoder_block_params(r, d, d_ff, bias=False), "causal": True, "eps": 0.3,
              "norm_first": bool(r.integers(2))}),
    ]


def _decoder(X, memory, n_heads, *, wrong, self_mask=None, memory_mask=None, causal=False, norm_first=False,
             eps=1e-5, activation="relu", **params):
    """mha.numpy.decoder_block with one step done `wrong`: "cross_from_target", "ignore_causal",
    "norm_memory", "flip_norm", or the attention's softmax written by hand, "softmax_without_max" or
    "softmax_global_max" (see mha.checks.common.naive_softmax)."""
    p = {k: params.get(k) for k in mn.DECODER_BLOCK_PARAMS}
    attention = {"softmax_without_max": multihead_softmax_without_max,
                 "softmax_global_max": multihead_softmax_global_max}.get(wrong, mn.multihead_attention)

    def attend(part, x, context, mask):
        return attention(x, n_heads=n_heads, context=context, mask=mask,
                         **{k: p[f"{part}_{k}"] for k in mn.ATTENTION_PARAMS})

    def ln(x, i):
        return mn.layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    def ff(x):
        return mn.feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"], activation)

    if causal and wrong != "ignore_causal":
        self_mask = mn.causal_mask(X.shape[-2]) & (True if self_mask is None else self_mask)
    if wrong == "cross_from_target":  # keys and values from the target, so the source's padding no longer fits
        memory, memory_mask = None, None
    if norm_first != (wrong == "flip_norm"):
        a, w_self = attend("self", ln(X, 1), None, self_mask)
        X = X + a
        source = ln(memory, 2) if wrong == "norm_memory" and memory is not None else memory
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
def decoder_cross_from_target(X, memory, n_heads, **options):
    return _decoder(X, memory, n_heads, wrong="cross_from_target", **options)


@mistake("decoder_block", "with causal=True, combine self_mask with the causal mask (both must allow a key): "
         "position t may not attend to later positions")
def decoder_without_causal(X, memory, n_heads, **options):
    return _decoder(X, memory, n_heads, wrong="ignore_causal", **options)


@mistake("decoder_block", "in pre-norm, LN_2 normalises the target before the cross-attention; "
         "`memory` goes in as it is")
def decoder_normalises_memory(X, memory, n_heads, **options):
    return _decoder(X, memory, n_heads, wrong="norm_memory", **options)


@mistake("decoder_block", "check where the LayerNorms go: post-norm (norm_first=False) is "
         "LN(x + sublayer(x)); pre-norm is x + sublayer(LN(x))")
def decoder_norm_swapped(X, memory, n_heads, **options):
    return _decoder(X, memory, n_heads, wrong="flip_norm", **options)


@mistake("decoder_block", "the attention's softmax overflows on scores above 709: subtract each row's maximum "
         "before exponentiating (mnp.multihead_attention does)")
def decoder_softmax_without_max(X, memory, n_heads, **options):
    return _decoder(X, memory, n_heads, wrong="softmax_without_max", **options)


@mistake("decoder_block", "in the attention's softmax, subtract each row's own maximum, not the maximum of all "
         "the scores: a row far below it underflows to 0 / 0")
def decoder_softmax_global_max(X, memory, n_heads, **options):
    return _decoder(X, memory, n_heads, wrong="softmax_global_max", **options)


check_decoder_block = make_check("decoder_block")
