"""Chapter 17, attention that remembers less: the checks of `absorbed_latent_decode`, `sink_softmax`,
`select_top_k_keys` and `route_tokens`, their cases and their catalogued mistakes.

Each first named case is built so that every catalogued mistake of its exercise answers otherwise, whatever the
seed: for the absorbed decode, r = d_nope = d_v (a transposed W_uk, or W_uk and W_uv swapped, still multiply) and a
scale that is not 1 / sqrt(d_nope + d_rope); for the sinks, as many heads as queries (a sink per query broadcasts
without an error); for the top-k keys, ties at the k-th score; for the router, experts whose order by score is not
their order by index. The choices (top-k keys, experts) are exact: the cases hold exact ties or scores at least
1e-3 apart, so that no rounding decides a choice.
"""

import numpy as np

from mha.checks.inputs import batch, causal, normal, sizes
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import ABSORBED_FORBIDS, ROUTER_FORBIDS, SINK_SOFTMAX_FORBIDS, TOP_K_KEYS_FORBIDS

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

# select_top_k_keys: each query's k best keys among the allowed ones ---------------------------------------------


TIED_KEYS = np.array([[3.0, 1.0, 3.0, 3.0, 0.0, 2.0],  # k = 2: keys 0 and 2
                      [5.0, 4.0, 4.0, 1.0, 0.0, -1.0],  # keys 0 and 1
                      [0.5, 2.0, -1.0, 2.0, 1.5, 0.0],  # keys 1 and 3
                      [1.0, 0.0, 1.0, 0.0, 1.0, 1.0],  # keys 0 and 2
                      [0.0, -2.0, 1.0, 1.0, 1.0, 2.0]])  # keys 5 and 2 (x86's vectorised default sort: 5 and 3)
TIED_LOGITS = np.array([[0.0, 1.0, -1.0, 1.0, 1.0, 2.0],  # top 3: experts 5, 1, 3
                        [-1.0, -1.0, -1.0, 1.0, 1.0, -1.0],  # experts 3, 4, 0
                        [2.0, 0.0, 2.0, 1.0, 0.0, 1.0],  # experts 0, 2, 3
                        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # experts 0, 1, 2
                        [1.0, 3.0, 1.0, 2.0, 2.0, 1.0]])  # experts 1, 3, 4


def default_sort_reorders_ties():
    """Whether NumPy's default argsort (not stable: vectorised on x86) chooses otherwise than a stable one among the
    ties of the named cases, here. Where it does, a solution that relies on it is wrong and gets its own hint; where it
    does not (a machine without those sorts), such a solution is right here, and no mistake stands for it."""
    return all(not np.array_equal(np.argsort(-rows, axis=-1)[:, :k], np.argsort(-rows, axis=-1, kind="stable")[:, :k])
               for rows, k in ((TIED_KEYS, 2), (TIED_LOGITS, 3)))


DEFAULT_SORT_REORDERS_TIES = default_sort_reorders_ties()


def tied_scores(r):
    """(5, 6) rows with ties at the k = 2nd score (the earlier keys win), moved and stretched by the seed (which
    changes no comparison)."""
    return TIED_KEYS * r.uniform(0.5, 2.0) + r.uniform(-3.0, 3.0)


def masked_keys_first(r, lead, T_q, T_k):
    """scores (*lead, T_q, T_k) whose largest scores sit on the keys that a mask of keys (*lead[:-1], 1, 1, T_k)
    blocks (about a third of them), and that mask."""
    scores = normal(r, lead + (T_q, T_k))
    blocked = np.zeros(lead[:-1] + (1, 1, T_k), dtype=bool)
    blocked[..., r.permutation(T_k)[:T_k // 3 + 1]] = True
    return np.where(blocked, scores + 10.0, scores), ~blocked


@cases_for("select_top_k_keys", forbids=TOP_K_KEYS_FORBIDS,
           may_use="NumPy: np.argsort, np.sort or np.argpartition (not mnp.top_k_filter or mnp.route_tokens)")
def select_top_k_keys_cases(r):
    """Ties first, a causal mask (fewer allowed keys than k), a mask of keys over the best scores, a fully masked
    row, k above T_k, k = 1, T_q != T_k, float32."""
    few = causal(5)
    few[3] = False  # query 3 may attend to nothing
    blocked_best, keys = masked_keys_first(r, (2, 3), 4, 7)
    return [
        Case("ties at the k-th score, k = 2: the earlier keys win", (tied_scores(r), 2)),
        Case("a causal mask (5, 5) over a batch (2, 5, 5), k = 3: queries 0 and 1 have fewer than 3 allowed keys",
             (normal(r, (2, 5, 5)), 3), {"mask": causal(5)}),
        Case("a mask of keys (2, 1, 1, 7) blocking the highest scores, scores (2, 3, 4, 7), k = 2",
             (blocked_best, 2), {"mask": keys}),
        Case("a query with no allowed key selects none, k = 2", (normal(r, (5, 5)), 2), {"mask": few}),
        Case("k = 9 above T_k = 6: every allowed key", (normal(r, (3, 6)), 9), {"mask": r.random((3, 6)) < 0.6}),
        Case("k = 1: the best key alone", (normal(r, (2, 4, 5)), 1)),
        Case("T_q = 3 queries, T_k = 8 keys, k = 3", (normal(r, (3, 8)), 3)),
        Case("float32 scores, k = 4", (normal(r, (2, 3, 6), np.float32), 4)),
    ]


@random_cases_for("select_top_k_keys")
def select_top_k_keys_random_cases(r):
    """Whole-number scores (ties) in a 4-D batch with a random mask, and float32 with a causal mask; k from 1 to
    T_k + 1."""
    T_q, T_k = sizes(r, 2, 2, 8)
    lead = batch(r, 2)
    return [
        Case("random: a 4-D batch of whole-number scores (ties), a random mask",
             (np.round(normal(r, lead + (T_q, T_k), scale=2)), int(r.integers(1, T_k + 2))),
             {"mask": r.random(lead[:1] + (1, T_q, T_k)) < 0.7}),
        Case("random: float32, a causal mask", (normal(r, lead + (T_k, T_k), np.float32), int(r.integers(1, T_k))),
             {"mask": causal(T_k)}),
    ]


def chosen(order, k, shape, axis=-1):
    """A boolean array of `shape`, True at the first k indices of `order` along `axis`."""
    keep = np.zeros(shape, dtype=bool)
    taken = np.take(order, np.arange(min(k, order.shape[axis])), axis=axis)
    np.put_along_axis(keep, taken, True, axis=axis)
    return keep


def allowed_of(scores, mask):
    return np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)


def best_first(scores, mask, k, fill=-np.inf):
    """Right but where fewer than k keys are allowed: the k best of the scores with `fill` on the masked keys."""
    filled = np.where(allowed_of(scores, mask), scores, fill)
    return chosen(np.argsort(-filled, axis=-1, kind="stable"), k, scores.shape)


@mistake("select_top_k_keys", "exactly k keys per row, and on a tie the earlier key: np.argsort(-scores, "
         "kind='stable')[..., :k] keeps k; comparing with the k-th score (>=) keeps every key tied with it")
def top_k_keys_all_ties(scores, k, mask=None):
    allowed = allowed_of(scores, mask)
    filled = np.where(allowed, scores, -np.inf)
    kth = -np.sort(-filled, axis=-1)[..., min(k, scores.shape[-1]) - 1:][..., :1]
    return allowed & (filled >= kth)


@mistake("select_top_k_keys", "on a tie the EARLIER key wins: np.argsort(scores)[..., -k:] sorts ascending, so among "
         "equal scores it keeps later keys; sort -scores with kind='stable' and take the first k")
def top_k_keys_later_ties(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    order = np.argsort(filled, axis=-1)[..., ::-1]  # as learners write it: the default sort
    return chosen(order, k, scores.shape) & allowed_of(scores, mask)


def top_k_keys_unstable(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    return chosen(np.argsort(-filled, axis=-1), k, scores.shape) & allowed_of(scores, mask)


if DEFAULT_SORT_REORDERS_TIES:
    mistake("select_top_k_keys", "on a tie the earlier key wins, and np.argsort's default sort is not stable (equal "
            "scores come out in any order): np.argsort(-scores, axis=-1, kind='stable')[..., :k]")(top_k_keys_unstable)


@mistake("select_top_k_keys", "select the k HIGHEST scores: np.argsort sorts in ascending order, so its first k "
         "are the lowest")
def top_k_keys_smallest(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, np.inf)
    return chosen(np.argsort(filled, axis=-1, kind="stable"), k, scores.shape) & allowed_of(scores, mask)


@mistake("select_top_k_keys", "a masked key is never selected (mask True = may attend): choose among the allowed "
         "keys only")
def top_k_keys_mask_ignored(scores, k, mask=None):
    return best_first(scores, None, k)


@mistake("select_top_k_keys", "where fewer than k keys are allowed, select those and no more: a masked key set to "
         "-inf (or -1e9) is still among the k largest of its row; keep `& mask` at the end")
def top_k_keys_masked_fill(scores, k, mask=None):
    return best_first(scores, mask, k)


@mistake("select_top_k_keys", "mask True means the key MAY be attended to (as everywhere in the course): choose "
         "among the True keys, not the False ones")
def top_k_keys_mask_flipped(scores, k, mask=None):
    flipped = None if mask is None else ~np.asarray(mask)
    return best_first(scores, flipped, k) & allowed_of(scores, flipped)


@mistake("select_top_k_keys", "each QUERY keeps its k best keys: sort along the last axis (the keys), not along "
         "the queries")
def top_k_keys_over_queries(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    return chosen(np.argsort(-filled, axis=-2, kind="stable"), k, scores.shape, axis=-2) & allowed_of(scores, mask)


@mistake("select_top_k_keys", "return a boolean array shaped like the scores, (..., T_q, T_k), True at the selected "
         "keys, not the indices of the keys")
def top_k_keys_indices(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    return np.argsort(-filled, axis=-1, kind="stable")[..., :k]


check_select_top_k_keys = make_check("select_top_k_keys")

# route_tokens: each token's top_k experts and their weights ---------------------------------------------------


def clear_choices(r, draw, top_k, gap=1e-3):
    """draw() -> (logits, bias, scoring), drawn again until the top_k + 1 largest choice scores of every token are
    at least `gap` apart (or exactly tied): no rounding can change the choice."""
    while True:
        logits, bias, scoring = draw()
        scores = 1 / (1 + np.exp(-logits.astype(np.float64))) if scoring == "sigmoid" else stable_softmax(
            logits.astype(np.float64))
        choice = -np.sort(-(scores + (0 if bias is None else bias)), axis=-1)[..., :top_k + 1]
        steps = -np.diff(choice, axis=-1)
        if np.all((steps == 0) | (steps >= gap)):
            return logits, bias


def router_case(label, r, lead, n_experts, top_k, scoring="softmax", normalize=False, bias=False, dtype=np.float64,
                scale=1.5, whole=False, offset=0.0):
    """A Case of route_tokens: logits (*lead, n_experts) (whole numbers: ties) plus `offset`, a bias of -0.3 .. 0.3
    if asked."""
    def draw():
        logits = normal(r, lead + (n_experts,), np.float64, scale)
        logits = (np.round(logits) if whole else logits).astype(dtype)
        return logits, (r.uniform(-0.3, 0.3, n_experts).astype(dtype) if bias else None), scoring
    logits, drawn_bias = clear_choices(r, draw, top_k)
    kwargs = {"scoring": scoring, "normalize": normalize} | ({"bias": drawn_bias} if bias else {})
    return Case(label, (logits + dtype(offset), top_k), kwargs)


def tied_logits(r):
    """(5, 6) whole-number logits with ties inside and at the edge of the top 3, stretched and moved by the seed (the
    scores keep the ties). The reversed ascending sort, and x86's vectorised default sort, choose otherwise in the
    first two rows."""
    return TIED_LOGITS * r.uniform(0.8, 1.5) + r.uniform(-2.0, 2.0)


def bias_that_turns_the_choice(r):
    """Sigmoid routing of 3 tokens over 5 experts where the bias changes the choice, and where it is added matters:
    in token 0, expert 1's logit 3 (score 0.95) loses to expert 3's logit 0 (score 0.5) with bias 0.6, where logits +
    bias would keep expert 1 (2.95 against 0.6); in token 1, expert 3 (logit 0.8) beats expert 0 (logit 1) on
    logits + bias too, so that adding the bias to the logits answers otherwise than leaving it out."""
    logits = np.array([[1.0, 3.0, -1.0, 0.0, -2.0], [1.0, 2.5, -0.5, 0.8, -1.0], [-1.0, 2.0, 0.1, -0.4, 0.8]])
    bias = np.array([0.0, -0.05, 0.1, 0.6, 0.05])
    shift = r.uniform(-0.1, 0.1, logits.shape)
    return (logits + shift, 2), {"scoring": "sigmoid", "normalize": True, "bias": bias + r.uniform(-0.01, 0.01, 5)}


@cases_for("route_tokens", returns=("weights", "experts"), forbids=ROUTER_FORBIDS, float32_promised=True,
           may_use="NumPy, nothing from mha")
def route_tokens_cases(r):
    """Softmax scores not normalised first, DeepSeek's sigmoid with a bias, normalised softmax scores, sigmoid alone,
    ties, logits near 1000, every expert, one expert, float32; last, an unknown scoring (ValueError)."""
    args, kwargs = bias_that_turns_the_choice(r)
    return [
        router_case("softmax scores, top_k = 2 of 6 experts, not normalised, a batch of tokens (2, 3, 6)",
                    r, (2, 3), 6, 2),
        Case("sigmoid scores and a bias that changes the choice (DeepSeek-V3), normalize=True", args, kwargs),
        router_case("softmax, normalize=True: the chosen scores divided by their sum, top_k = 3 of 5", r, (4,), 5, 3,
                    normalize=True),
        router_case("sigmoid scores, no bias, not normalised, top_k = 2 of 4", r, (3,), 4, 2, scoring="sigmoid"),
        Case("whole-number logits: tied experts go lower index first, top_k = 3 of 6", (tied_logits(r), 3)),
        router_case("logits of about 1000 (exp overflows without the maximum), softmax, top_k = 2", r, (2, 3), 6, 2,
                    offset=1000.0),
        router_case("top_k = 6 of 6 experts: all of them, best first", r, (2,), 6, 6, normalize=True),
        router_case("top_k = 1, normalize=True: a weight of 1", r, (3,), 4, 1, scoring="sigmoid", normalize=True,
                    bias=True),
        router_case("float32 logits and bias, sigmoid", r, (2, 2), 5, 2, scoring="sigmoid", bias=True,
                    dtype=np.float32),
        Case("scoring='relu': raise ValueError", (normal(r, (2, 4)), 2), {"scoring": "relu"}, raises=ValueError),
    ]


@random_cases_for("route_tokens")
def route_tokens_random_cases(r):
    """A 4-D batch with a random scoring, normalisation and bias; float32 whole-number logits (ties)."""
    n = int(r.integers(3, 9))
    lead = batch(r, 2) + (int(r.integers(1, 4)),)
    return [
        router_case("random: a 4-D batch", r, lead, n, int(r.integers(1, n + 1)),
                    scoring=str(r.choice(["softmax", "sigmoid"])), normalize=bool(r.integers(2)),
                    bias=bool(r.integers(2))),
        router_case("random: float32 whole-number logits (ties)", r, lead[1:], n, int(r.integers(1, n)),
                    normalize=bool(r.integers(2)), dtype=np.float32, whole=True),
    ]


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def routed(logits, top_k, scoring="softmax", normalize=False, bias=None, *, score=None, choose_by=None,
           order="best", weigh=None, divide_by=None):
    """route_tokens, right with the defaults; each keyword changes one step as a mistake does: score(logits) gives
    the scores, choose_by(scores, logits, bias) what the experts are chosen by, order how the choice is sorted
    ("best", "ascending", "index", "later ties", "unstable"), weigh(scores, choice) what the weights are taken from, and
    divide_by(weights, scores) what they are divided by."""
    scores = (score or (stable_softmax if scoring == "softmax" else sigmoid))(logits)
    b = 0 if bias is None else bias
    choice = choose_by(scores, logits, b) if choose_by else scores + b
    by_score = np.argsort(-choice, axis=-1, kind="stable")[..., :top_k]
    experts = {"best": by_score, "index": np.sort(by_score, axis=-1), "ascending": by_score[..., ::-1],
               "later ties": np.argsort(choice, axis=-1)[..., ::-1][..., :top_k],  # the default sorts, as learners
               "unstable": np.argsort(-choice, axis=-1)[..., :top_k]}[order]  # write them
    weights = np.take_along_axis(weigh(scores, choice) if weigh else scores, experts, axis=-1)
    if divide_by is not None:
        weights = weights / divide_by(weights, scores)
    elif normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, experts


@mistake("route_tokens", "the bias moves the choice only: the weights are the chosen experts' scores WITHOUT the "
         "bias (DeepSeek-V3 balances the load with it, it changes no output)")
def router_bias_in_the_weights(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, weigh=lambda scores, choice: choice)


@mistake("route_tokens", "choose the experts by scores + bias: the bias is there to change the choice")
def router_bias_ignored(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, None)


@mistake("route_tokens", "add the bias to the SCORES (after the sigmoid), not to the logits: the choice is the top_k "
         "of sigmoid(logits) + bias")
def router_bias_on_the_logits(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, choose_by=lambda scores, lg, b: lg + b)


@mistake("route_tokens", "normalise after choosing: divide the chosen experts' scores by THEIR sum, not by the sum "
         "over all the experts")
def router_normalised_before_choosing(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    over_all = (lambda w, scores: scores.sum(axis=-1, keepdims=True)) if normalize else None
    return routed(logits, top_k, scoring, normalize, bias, divide_by=over_all)


@mistake("route_tokens", "with normalize=False the weights are the chosen scores as they are, softmax(logits) over "
         "ALL the experts taken at the chosen ones: divide by their sum only when normalize=True (a softmax over the "
         "chosen logits alone is that normalised form, gpt-oss's)")
def router_always_normalised(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, True, bias)


@mistake("route_tokens", "with normalize=True divide the chosen scores by their sum, so that a token's weights sum "
         "to 1")
def router_never_normalised(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, False, bias)


@mistake("route_tokens", "scoring='sigmoid' scores each expert on its own, 1 / (1 + exp(-logit)): not a softmax "
         "over the experts")
def router_always_softmax(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, "softmax", normalize, bias)


@mistake("route_tokens", "scoring='softmax' is a softmax over the experts (each token's scores sum to 1): not a "
         "sigmoid per expert")
def router_always_sigmoid(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, "sigmoid", normalize, bias)


@mistake("route_tokens", "order the chosen experts by their choice score, the best first: np.argsort(-choice) "
         "[..., :top_k], not the ascending order of np.argsort(choice)[..., -top_k:]")
def router_ascending(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="ascending")


@mistake("route_tokens", "order the chosen experts by their choice score, the best first, not by their index")
def router_in_index_order(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="index")


@mistake("route_tokens", "on a tie the LOWER index comes first: np.argsort(-choice, kind='stable'), not "
         "np.argsort(choice)[..., ::-1], which puts equal scores in another order")
def router_later_ties_first(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="later ties")


def router_unstable_sort(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="unstable")


if DEFAULT_SORT_REORDERS_TIES:
    mistake("route_tokens", "on a tie the lower index comes first, and np.argsort's default sort is not stable (equal "
            "scores come out in any order): np.argsort(-choice, axis=-1, kind='stable')[..., :top_k]")(
        router_unstable_sort)


@mistake("route_tokens", "the softmax runs over each token's experts (the last axis), not over the tokens")
def router_softmax_over_tokens(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias,
                  score=None if scoring != "softmax" else (lambda lg: stable_softmax(lg, axis=0)))


@mistake("route_tokens", "subtract each token's largest logit before exp: logits above 709 overflow to inf, and "
         "inf / inf is NaN")
def router_softmax_without_max(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    def overflowing(lg):
        e = np.exp(lg)
        return e / e.sum(axis=-1, keepdims=True)
    return routed(logits, top_k, scoring, normalize, bias, score=None if scoring != "softmax" else overflowing)


check_route_tokens = make_check("route_tokens")
