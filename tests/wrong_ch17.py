"""Wrong solutions of chapter 17's exercises, as learners write them, for tests/test_checks_ch17.py: each with the
words of the hint it must get and the named case it must fail on (TRAPPED)."""

import numpy as np

from solutions_ch17 import CHAPTER_17

from mha.checks.registry import CHECKS, DTYPE_HINT

ABSORBED, SINKS, TOP_K, ROUTER = CHAPTER_17


def softmax(s, axis=-1):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def decode_written(*, fold=None, scale_of=None, rope=True, axis=-1, shift=True, W_out=True, weights_out=True):
    """An absorbed decode as a learner writes it, with one step changed."""
    def solution(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
        q_latent = fold(q_nope, W_uk) if fold else np.einsum("...hn,hrn->...hr", q_nope, W_uk)
        s = q_latent @ np.swapaxes(latents, -1, -2) + (q_rope @ np.swapaxes(rotary_keys, -1, -2) if rope else 0)
        s = s * (scale if scale_of is None else scale_of(q_nope, q_rope, scale))
        e = np.exp(s - s.max(axis=axis, keepdims=True) if shift else s)
        w = e / e.sum(axis=axis, keepdims=True)
        mixed = w @ latents
        return (np.einsum("...hr,hrv->...hv", mixed, W_uv) if W_out else mixed), (w if weights_out else s)
    return solution


def expanded_keys(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    keys = np.einsum("...tr,hrn->...htn", latents, W_uk)  # (..., h, T, d_nope)
    s = scale * (np.einsum("...hn,...htn->...ht", q_nope, keys) + q_rope @ np.swapaxes(rotary_keys, -1, -2))
    return np.einsum("...ht,...tr,hrv->...hv", softmax(s), latents, W_uv), softmax(s)


def sink_written(*, sink_of=lambda sinks: sinks[:, None, None], with_sink=True, shift="both", exp_sink="shifted"):
    def solution(scores, sinks):
        sink = sink_of(sinks)
        m = {"both": np.maximum(scores.max(-1, keepdims=True), sink), "scores": scores.max(-1, keepdims=True),
             "none": 0.0}[shift]
        e = np.exp(scores - m)
        extra = {"shifted": np.exp(sink - m), "raw": np.exp(sink)}[exp_sink] if with_sink else 0.0
        return e / (extra + e.sum(-1, keepdims=True))
    return solution


def concatenated(keep):
    def solution(scores, sinks):
        both = np.concatenate([scores, np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))], axis=-1)
        return softmax(both)[keep]
    return solution


def top_k_written(*, order_of, fill=-np.inf, and_mask=True, flip=False):
    def solution(scores, k, mask=None):
        given = None if mask is None else (~mask if flip else mask)
        allowed = np.ones(scores.shape, bool) if given is None else np.broadcast_to(given, scores.shape)
        picked = np.zeros(scores.shape, dtype=bool)
        np.put_along_axis(picked, order_of(np.where(allowed, scores, fill))[..., :k], True, axis=-1)
        return picked & allowed if and_mask else picked
    return solution


def top_k_at_least_kth(scores, k, mask=None):
    s = scores if mask is None else np.where(mask, scores, -np.inf)
    kth = np.sort(s, axis=-1)[..., ::-1][..., min(k, s.shape[-1]) - 1, None]
    return (s >= kth) & np.isfinite(s)


def by_the_default_sort(fn):
    fn.default_sort = True
    return fn


def top_k_indices(scores, k, mask=None):
    return np.argsort(-(scores if mask is None else np.where(mask, scores, -np.inf)), axis=-1, kind="stable")[..., :k]


def router_written(*, score=None, choose=None, weigh=None, order=None, always_normalise=False, by_index=False):
    def solution(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
        scores = (score or (softmax if scoring == "softmax" else lambda x: 1 / (1 + np.exp(-x))))(logits)
        b = 0.0 if bias is None else bias
        choice = choose(scores, logits, b) if choose else scores + b
        experts = (order or (lambda c: np.argsort(-c, axis=-1, kind="stable")[..., :top_k]))(choice)
        experts = np.sort(experts[..., :top_k], axis=-1) if by_index else experts[..., :top_k]
        weights = np.take_along_axis(weigh(scores, b) if weigh else scores, experts, axis=-1)
        if normalize or always_normalise:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return weights, experts
    return solution


FIRST_A, FIRST_S, FIRST_K, FIRST_R = (CHECKS[n].named_cases(0)[0].label for n in CHAPTER_17)
BIAS = "sigmoid scores and a bias"
# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    (ABSORBED, decode_written(fold=lambda q, W: np.einsum("...hr,hrn->...hn", q, W)), "not its r axis", FIRST_A),
    (ABSORBED, decode_written(scale_of=lambda q, qr, scale: 1.0), "multiply both parts", FIRST_A),
    (ABSORBED, decode_written(scale_of=lambda q, qr, scale: 1 / np.sqrt(q.shape[-1] + qr.shape[-1])),
     "do not compute your own", FIRST_A),
    (ABSORBED, decode_written(rope=False), "add the rotary part", FIRST_A),
    (ABSORBED, decode_written(axis=-2), "not over the heads", FIRST_A),
    (ABSORBED, decode_written(shift=False), "subtract each row's maximum", "scores of 1050"),
    (ABSORBED, decode_written(W_out=False), "finish with W_uv", FIRST_A),
    (ABSORBED, decode_written(weights_out=False), "not the scores", FIRST_A),
    (ABSORBED, decode_written(scale_of=lambda q, qr, scale: np.float64(scale)), DTYPE_HINT, "float32 inputs"),
    (SINKS, sink_written(with_sink=False), "add exp(sink - m)", FIRST_S),
    (SINKS, sink_written(sink_of=lambda sinks: sinks[:, None]), "one logit per HEAD", FIRST_S),
    (SINKS, sink_written(exp_sink="raw"), "not exp(sink)", FIRST_S),
    (SINKS, sink_written(shift="scores"), "AND the sink", "a causal mask"),
    (SINKS, sink_written(shift="none"), "subtract the row's maximum", "scores of about 1000"),
    (SINKS, concatenated((Ellipsis, slice(1, None))), "slicing off the first", FIRST_S),
    (SINKS, concatenated(Ellipsis), "drop the sink's column", FIRST_S),
    (TOP_K, top_k_written(order_of=lambda s: np.argsort(s, axis=-1)[..., ::-1]), "EARLIER key wins", FIRST_K),
    (TOP_K, by_the_default_sort(top_k_written(order_of=lambda s: np.argsort(-s, axis=-1))), "kind='stable'",
     FIRST_K),
    (TOP_K, top_k_at_least_kth, "exactly k keys", FIRST_K),
    (TOP_K, top_k_written(order_of=lambda s: np.argsort(s, axis=-1), fill=np.inf), "k HIGHEST", FIRST_K),
    (TOP_K, top_k_written(order_of=lambda s: np.argsort(-s, axis=-1, kind="stable"), and_mask=False),
     "fewer than k keys", "a causal mask"),
    (TOP_K, top_k_written(order_of=lambda s: np.argsort(-s, axis=-1, kind="stable"), flip=True), "True means",
     "a causal mask"),
    (TOP_K, top_k_indices, "not the indices", FIRST_K),
    (ROUTER, router_written(weigh=lambda scores, b: scores + b), "WITHOUT the bias", BIAS),
    (ROUTER, router_written(choose=lambda scores, logits, b: scores), "by scores + bias", BIAS),
    (ROUTER, router_written(choose=lambda scores, logits, b: logits + b), "not to the logits", BIAS),
    (ROUTER, router_written(always_normalise=True), "only when normalize=True", FIRST_R),
    (ROUTER, router_written(score=lambda x: 1 / (1 + np.exp(-x))), "not a sigmoid per expert", FIRST_R),
    (ROUTER, router_written(order=lambda c: np.argsort(c, axis=-1)[..., ::-1]), "kind='stable'",
     "whole-number logits"),
    (ROUTER, by_the_default_sort(router_written(order=lambda c: np.argsort(-c, axis=-1))), "kind='stable'",
     "whole-number logits"),
    (ROUTER, router_written(by_index=True), "not by their index", FIRST_R),
]
