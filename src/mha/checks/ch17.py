"""Chapter 17, attention that remembers less: the checks of `absorbed_latent_decode` and `sink_softmax`, their
cases and their catalogued mistakes (those of `select_top_k_keys` and `route_tokens` are in
`mha.checks.ch17_choices`).

Each first named case is built so that every catalogued mistake of its exercise answers otherwise, whatever the
seed: for the absorbed decode, r = d_nope = d_v (a transposed W_uk, or W_uk and W_uv swapped, still multiply) and a
scale that is not 1 / sqrt(d_nope + d_rope); for the sinks, as many heads as queries (a sink per query broadcasts
without an error).
"""

import numpy as np

from mha.checks.inputs import batch, normal, sizes
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import ABSORBED_FORBIDS, SINK_SOFTMAX_FORBIDS

# absorbed_latent_decode: one new token against a cache of latents ---------------------------------------------

# The memory case: T = 8192 cached tokens, h = 4 heads, r = 4, d_rope = 2, d_nope = d_v = 2048. The cache takes 0.4
# MiB, every head's scores 0.25 MiB; ONE head's keys latents @ W_uk[i] take 128 MiB (and its values as much): far more
# than the 48 MiB a call may take beyond its inputs, with room for what the grader's worker counts as well (its copies
# of the inputs and of the answer on their way: 14 MiB measured here, where a right solution takes 3 MiB).
LONG_T, LONG_H, LONG_R, LONG_ROPE, LONG_D = 8192, 4, 4, 2, 2048
LONG_PEAK_BYTES = 48 * 2**20


def latent_inputs(r, lead, h, T, rank, d_nope, d_rope, d_v, dtype=np.float64, query_scale=1.0):
    """(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale) of a decode step: queries (*lead, h, d), a cache
    (*lead, T, ...), up-projections (h, r, d) of scale 1 / sqrt(r), and a scale 1.3 to 1.9 times 1 / sqrt(d_nope +
    d_rope) (DeepSeek's YaRN factor moves it off that formula)."""
    q_nope = normal(r, lead + (h, d_nope), dtype, query_scale)
    q_rope = normal(r, lead + (h, d_rope), dtype, query_scale)
    latents, rotary_keys = normal(r, lead + (T, rank), dtype), normal(r, lead + (T, d_rope), dtype)
    W_uk, W_uv = normal(r, (h, rank, d_nope), dtype, rank ** -0.5), normal(r, (h, rank, d_v), dtype, rank ** -0.5)
    scale = float(r.uniform(1.3, 1.9)) / (d_nope + d_rope) ** 0.5
    return q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale


def far_scores(r):
    """A decode step whose scores reach 1000 to 1500 (exp overflows past 709 without the row's maximum)."""
    q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale = latent_inputs(r, (2,), 2, 4, 3, 3, 2, 2)
    q_rope[..., 0] = 700.0 / scale  # rotary_keys[..., 0] in 1.5 .. 2: scores 1050 .. 1400
    rotary_keys[..., 0] = r.uniform(1.5, 2.0, rotary_keys.shape[:-1])
    return q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale


@cases_for("absorbed_latent_decode", returns=OUT_AND_WEIGHTS, forbids=ABSORBED_FORBIDS, float32_promised=True,
           may_use="NumPy, nothing from mha")
def absorbed_latent_decode_cases(r):
    """r = d_nope = d_v and an unusual scale first, sizes all different, two batch axes, T = 1, scores near 1000,
    float32, and a long cache in bounded memory."""
    long = latent_inputs(r, (), LONG_H, LONG_T, LONG_R, LONG_D, LONG_ROPE, LONG_D)
    return [
        Case("a batch of 2, h = 3 heads, T = 5 cached tokens, r = d_nope = d_v = 4, d_rope = 2, scale = 1.3 .. 1.9 "
             "over sqrt(d_nope + d_rope)", latent_inputs(r, (2,), 3, 5, 4, 4, 2, 4)),
        Case("no batch axis, sizes all different: h = 2, T = 6, r = 7, d_nope = 3, d_rope = 4, d_v = 5",
             latent_inputs(r, (), 2, 6, 7, 3, 4, 5)),
        Case("two batch axes (2, 3), h = 4, T = 7, r = 5, d_nope = 2, d_rope = 2, d_v = 3",
             latent_inputs(r, (2, 3), 4, 7, 5, 2, 2, 3)),
        Case("T = 1: one cached token, every weight is 1", latent_inputs(r, (3,), 2, 1, 4, 3, 2, 2)),
        Case("scores of 1050 to 1400 (exp overflows without the row's maximum)", far_scores(r)),
        Case("float32 inputs: float32 answers", latent_inputs(r, (2,), 3, 5, 6, 4, 2, 3, np.float32)),
        Case(f"a long cache: T = {LONG_T}, h = {LONG_H}, r = {LONG_R}, d_rope = {LONG_ROPE}, d_nope = d_v = {LONG_D}, "
             f"at most {LONG_PEAK_BYTES // 2**20} MiB (one head's keys alone would take "
             f"{8 * LONG_T * LONG_D / 2**20:.0f} MiB)", long, peak_bytes=LONG_PEAK_BYTES,
             too_much="never form the keys (or the values) of the cached tokens: fold W_uk into the query and W_uv "
                      "into the output, and attend over the latents themselves"),
    ]


@random_cases_for("absorbed_latent_decode")
def absorbed_latent_decode_random_cases(r):
    """A 4-D batch of random sizes, and float32 without a batch axis."""
    h, T, rank, d_nope, d_rope, d_v = sizes(r, 6, 1, 6)
    return [
        Case("random: a 4-D batch (B, B', h, d)", latent_inputs(r, batch(r, 2), h, T, rank, d_nope, d_rope, d_v,
                                                                query_scale=float(r.uniform(0.5, 3)))),
        Case("random: float32, no batch axis", latent_inputs(r, (), h, T + 1, rank, d_nope, d_rope, d_v, np.float32)),
    ]


def stable_softmax(s, axis=-1):
    """softmax along `axis`, the maximum subtracted: the mistakes' own, never the learner's library."""
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, *, absorb="hrn,...hn->...hr", rope_scale=None,
           rope=True, softmax=stable_softmax, axis=-1, W_out=None, weights_of=None):
    """The absorbed decode, right with the defaults; each keyword changes one step as a mistake does."""
    q_latent = np.einsum(absorb, W_uk, q_nope)  # (..., h, r)
    nope = np.einsum("...hr,...tr->...ht", q_latent, latents)  # (..., h, T)
    rotary = np.einsum("...hd,...td->...ht", q_rope, rotary_keys) if rope else 0  # (..., h, T)
    scores = scale * nope + (scale if rope_scale is None else rope_scale) * rotary
    w = softmax(scores, axis=axis)  # (..., h, T)
    mixed = np.einsum("...ht,...tr->...hr", w, latents)  # (..., h, r)
    out = mixed if W_out is False else np.einsum("...hr,hrv->...hv", mixed, W_uv if W_out is None else W_out)
    return out, (w if weights_of is None else weights_of(scores))


@mistake("absorbed_latent_decode", "fold W_uk into the query as q_latent_i = W_uk[i] @ q_nope_i (r numbers): W_uk "
         "(h, r, d_nope) maps the latent to the key, so the query meets it on its d_nope axis, not its r axis")
def absorbed_W_uk_transposed(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, absorb="hnr,...hn->...hr")


@mistake("absorbed_latent_decode", "W_uk makes the keys (it goes into the query) and W_uv the values (it goes into "
         "the output): not the other way round")
def absorbed_up_projections_swapped(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uv, W_uv, scale, W_out=W_uk)


@mistake("absorbed_latent_decode", "multiply both parts of the score by `scale`: score = scale * (q_latent . c_j + "
         "q_rope . k_rope_j)")
def absorbed_scale_forgotten(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, 1.0)


@mistake("absorbed_latent_decode", "apply `scale` once: score = scale * (q_latent . c_j + q_rope . k_rope_j), not "
         "scale times that again (scaling the query and the scores both)")
def absorbed_scale_twice(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale * scale)


@mistake("absorbed_latent_decode", "the scale multiplies the rotary part too: score = scale * (q_latent . c_j + "
         "q_rope . k_rope_j), not scale * q_latent . c_j + q_rope . k_rope_j")
def absorbed_scale_on_the_latent_part_only(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, rope_scale=1.0)


@mistake("absorbed_latent_decode", "use the `scale` you are given: it is not 1 / sqrt(d_nope + d_rope) (DeepSeek's "
         "YaRN scaling multiplies it), so do not compute your own")
def absorbed_own_scale(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    own = (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, own)


@mistake("absorbed_latent_decode", "use the `scale` you are given, not 1 / sqrt(d_nope), the no-RoPE part's width")
def absorbed_scale_of_d_nope(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, q_nope.shape[-1] ** -0.5)


@mistake("absorbed_latent_decode", "add the rotary part of the score: q_rope_i . k_rope_j, the query's rotated part "
         "against the rotary key shared by every head")
def absorbed_without_rope(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, rope=False)


@mistake("absorbed_latent_decode", "normalise each head's scores over the cached tokens (the last axis, T), not "
         "over the heads")
def absorbed_softmax_over_heads(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, axis=-2)


@mistake("absorbed_latent_decode", "subtract each row's maximum score before exp: scores above 709 overflow to inf, "
         "and inf / inf is NaN")
def absorbed_softmax_without_max(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    def overflowing(s, axis=-1):
        e = np.exp(s)
        return e / e.sum(axis=axis, keepdims=True)
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, softmax=overflowing)


@mistake("absorbed_latent_decode", "finish with W_uv: head i's output is (sum_j w_ij c_j) @ W_uv[i], of d_v numbers, "
         "not the mixed latent itself")
def absorbed_without_W_uv(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, W_out=False)


@mistake("absorbed_latent_decode", "return the weights, softmax(scores) over the cached tokens, not the scores")
def absorbed_returns_scores(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    return decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, weights_of=lambda s: s)


check_absorbed_latent_decode = make_check("absorbed_latent_decode")

# sink_softmax: a learned logit per head in the denominator -----------------------------------------------------


def sink_inputs(r, lead, h, T_q, T_k, dtype=np.float64, scale=2.0):
    """scores (*lead, h, T_q, T_k) and sinks (h,) of both signs (with h > 1), 0.3 to 2.5 from 0, no two equal."""
    signs = r.permutation(np.where(np.arange(h) % 2, -1.0, 1.0))
    sinks = signs * (np.sort(r.uniform(0.3, 2.4, h)) + np.arange(h) * 0.01)  # distinct magnitudes
    return normal(r, lead + (h, T_q, T_k), dtype, scale), sinks.astype(dtype)


def masked(scores, r, causal_rows=True):
    """A copy of scores (..., h, T_q, T_k) with -inf above the diagonal and one query row masked whole."""
    out = scores.copy()
    T_q, T_k = out.shape[-2:]
    if causal_rows:
        out[..., ~np.tril(np.ones((T_q, T_k), dtype=bool))] = -np.inf
    out[(0,) * (out.ndim - 3) + (int(r.integers(out.shape[-3])), int(r.integers(T_q)))] = -np.inf
    return out


@cases_for("sink_softmax", forbids=SINK_SOFTMAX_FORBIDS, float32_promised=True, may_use="NumPy, nothing from mha")
def sink_softmax_cases(r):
    """As many heads as queries first, masked keys and a fully masked row, scores near 1000, sinks far above and far
    below, one head without a batch axis, float32."""
    far, far_sinks = sink_inputs(r, (2,), 2, 3, 4)
    far[..., 0, :] += 1000.0  # query 0 of each head: scores about 1000, its sink about 0
    high, high_sinks = sink_inputs(r, (), 3, 2, 5)
    scores, sinks = sink_inputs(r, (2,), 4, 5, 5)
    return [
        Case("a batch of 2, h = 3 heads and T_q = 3 queries, T_k = 5 keys, sinks of both signs",
             sink_inputs(r, (2,), 3, 3, 5)),
        Case("a causal mask (-inf) and a query row masked whole: its weights are all 0", (masked(scores, r), sinks)),
        Case("scores of about 1000 in query 0, sinks near 0 (exp overflows without the row's maximum)",
             (far, far_sinks)),
        Case("sinks of about 20, far above the scores (N(0, 2)): each row sums to almost 0", (high, high_sinks + 20)),
        Case("one head, no batch axis: scores (1, 4, 6), sinks (1,)", sink_inputs(r, (), 1, 4, 6)),
        Case("float32 scores and sinks", sink_inputs(r, (3,), 2, 4, 3, np.float32)),
    ]


@random_cases_for("sink_softmax")
def sink_softmax_random_cases(r):
    """A 4-D batch with masked keys and a masked row, float32, and a sink far below the scores (a plain softmax)."""
    h, T_q, T_k = sizes(r, 3, 1, 5)
    scores, sinks = sink_inputs(r, batch(r, 1), h, T_q, T_k + 1, scale=float(r.uniform(0.5, 4)))
    low, low_sinks = sink_inputs(r, (), h, T_q, T_k)
    return [
        Case("random: a 4-D batch with masked keys and a masked row", (masked(scores, r, bool(r.integers(2))), sinks)),
        Case("random: float32, a 4-D batch", sink_inputs(r, batch(r, 1), h, T_q, T_k, np.float32)),
        Case("random: sinks of about -50, far below the scores", (low, low_sinks - 50)),
    ]


def with_sink(scores, sinks, *, per="head", shift=True, sink_shift=True, exp_sink=True, on_top=False, axis=-1):
    """The sink softmax, right with the defaults; each keyword changes one step as a mistake does. per="query"
    lines the sinks up with the queries, shift=False takes no maximum, shift="scores" the scores' alone."""
    sink = sinks[:, None, None] if per == "head" else sinks[:, None]  # (h, 1, 1), or (T_q, 1) per query
    top = np.max(scores, axis=axis, keepdims=True)
    m = (np.maximum(top, sink) if shift is True else top) if shift else 0.0
    e = np.exp(scores - m)
    extra = (np.exp(sink - m) if sink_shift else np.exp(sink)) if exp_sink else sink
    return (e + (extra if on_top else 0)) / (extra + e.sum(axis=axis, keepdims=True))


@mistake("sink_softmax", "add exp(sink - m) to the denominator: without the sink this is a plain softmax, whose "
         "rows sum to 1; with it a head can give a query little or no attention")
def sink_ignored(scores, sinks):
    return stable_softmax(scores)


@mistake("sink_softmax", "the sink joins the denominator only: w_k = exp(s_k - m) / (exp(sink - m) + sum_j "
         "exp(s_j - m)); adding exp(sink - m) to every numerator too gives weights that are no key's")
def sink_in_the_numerator(scores, sinks):
    return with_sink(scores, sinks, on_top=True)


@mistake("sink_softmax", "subtract the same m from the sink as from the scores: exp(sink - m), not exp(sink), next "
         "to exp(s_k - m)")
def sink_not_shifted(scores, sinks):
    return with_sink(scores, sinks, sink_shift=False)


@mistake("sink_softmax", "the sink is a logit, like a score: it adds exp(sink - m) to the denominator, not the "
         "number sink itself")
def sink_not_exponentiated(scores, sinks):
    return with_sink(scores, sinks, exp_sink=False)


@mistake("sink_softmax", "sinks has one logit per HEAD: line it up with the head axis, sinks[:, None, None] "
         "against (..., h, T_q, T_k); sinks[:, None] pairs sink i with query i instead")
def sink_per_query(scores, sinks):
    return with_sink(scores, sinks, per="query")


@mistake("sink_softmax", "take the maximum over the scores AND the sink, m = max(sink, max_k s_k): a row whose "
         "keys are all masked has max -inf, and -inf - (-inf) is NaN; with the sink, m is finite and the row is 0")
def sink_max_without_the_sink(scores, sinks):
    return with_sink(scores, sinks, shift="scores")


@mistake("sink_softmax", "subtract the row's maximum (with the sink) before exp: scores above 709 overflow to inf, "
         "and inf / inf is NaN")
def sink_without_max(scores, sinks):
    return with_sink(scores, sinks, shift=False)


@mistake("sink_softmax", "normalise each query's row over its keys (the last axis, T_k), not over the queries")
def sink_softmax_over_queries(scores, sinks):
    return with_sink(scores, sinks, axis=-2)


@mistake("sink_softmax", "with the sink as an extra column, keep the T_k keys' weights and drop the sink's: "
         "slicing off the other end keeps the sink's weight and loses the last key's")
def sink_column_kept(scores, sinks):
    column = np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))  # (..., h, T_q, 1)
    return stable_softmax(np.concatenate([column, scores], axis=-1))[..., :-1]


@mistake("sink_softmax", "with the sink as the LAST column, drop that column ([..., :-1]): slicing off the first "
         "one ([..., 1:]) loses key 0 and keeps the sink's weight in the last place")
def sink_first_key_dropped(scores, sinks):
    column = np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))  # (..., h, T_q, 1)
    return stable_softmax(np.concatenate([scores, column], axis=-1))[..., 1:]


@mistake("sink_softmax", "return the keys' weights only, (..., h, T_q, T_k): drop the sink's column, whose weight "
         "is no key's")
def sink_column_returned(scores, sinks):
    column = np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))  # (..., h, T_q, 1)
    return stable_softmax(np.concatenate([scores, column], axis=-1))


check_sink_softmax = make_check("sink_softmax")
