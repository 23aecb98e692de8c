"""Chapter 14, a model that writes: the checks of `apply_temperature`, `top_k_filter`, `top_p_filter` and
`loss_to_bits_per_character`, their cases and their catalogued mistakes.

The filters answer logits of shape (..., V), with -inf on every token they rule out. No case of top-p puts
tied tokens on both sides of its cut (there transformers' choice follows the order of torch.sort, which is
not stable). Its one exact boundary uses probabilities 1/2, 1/4, 1/8, 1/8, which the usual softmaxes compute
without rounding; in every other case, p stays at least 1e-3 away from the mass above each token (but the
most probable, which has exactly 0 above it), so that float32 rounding decides nothing. The comparison needs
-inf where the reference has -inf: 0 or -1e9 there is wrong.
"""

import math

import numpy as np

from mha.checks.inputs import batch, normal, sizes
from mha.checks.routes import BITS_FORBIDS, FILTER_ROUTES
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for

LN2 = math.log(2)


def probabilities(logits, axis=-1):
    """softmax(logits) along `axis`, shifted by the maximum: the mistakes' own, never the learner's library."""
    e = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def with_masked_tokens(logits, r, n_masked=1):
    """A copy of `logits` (..., V) with `n_masked` tokens of each row set to -inf, as a mask leaves them."""
    masked = logits.copy()
    for row in np.ndindex(logits.shape[:-1]):
        masked[row + (r.choice(logits.shape[-1], size=n_masked, replace=False),)] = -np.inf
    return masked


# apply_temperature: logits / temperature ---------------------------------------------------------------


@cases_for("apply_temperature", may_use="NumPy (not mnp.filter_logits)", forbids=FILTER_ROUTES)
def apply_temperature_cases(r):
    """Temperatures below, at and above 1, a masked token, logits near 1000, float32, and an integer temperature."""
    return [
        Case("a batch (B, T, V) = (2, 3, 7), temperature 0.5: sharper", (3 * r.standard_normal((2, 3, 7)), 0.5)),
        Case("temperature 2: flatter", (3 * r.standard_normal((4, 5)), 2.0)),
        Case("temperature 1 changes nothing", (r.standard_normal(6), 1.0)),
        Case("a masked token: -inf already in the logits", (with_masked_tokens(r.standard_normal((3, 5)), r), 0.7)),
        Case("logits of about 1000, temperature 0.1", (1000 + r.standard_normal((2, 5)), 0.1)),
        Case("float32 logits, temperature 0.8", ((2 * r.standard_normal((3, 6))).astype(np.float32), 0.8)),
        Case("an integer temperature (3)", (4 * r.standard_normal((2, 4)), 3)),
    ]


@random_cases_for("apply_temperature")
def apply_temperature_random_cases(r):
    """A 4-D batch, float32 logits, and one row (V,) with a masked token, each with a temperature from 0.2 to 4."""
    def temperature():
        return float(r.choice([0.2, 0.6, 0.9, 1.5, 4.0]))
    V = int(r.integers(2, 9))
    return [
        Case("random: a 4-D batch", (normal(r, batch(r, 2) + (int(r.integers(1, 4)), V), scale=3), temperature())),
        Case("random: float32", (normal(r, sizes(r, 2, 1, 4) + (V,), np.float32, 2), temperature())),
        Case("random: one row (V,) with a masked token", (with_masked_tokens(normal(r, V + 1, scale=2), r),
                                                          temperature())),
    ]


@mistake("apply_temperature", "divide the logits by the temperature, z / T: multiplying by T sharpens where "
         "T > 1 should flatten")
def temperature_multiplied(logits, temperature):
    return logits * temperature


@mistake("apply_temperature", "the temperature divides the logits, before any softmax: probabilities divided "
         "by T are the same probabilities once they are normalised again, and they are not logits")
def temperature_after_softmax(logits, temperature):
    return probabilities(logits) / temperature


@mistake("apply_temperature", "return logits (any sign, -inf for a ruled-out token), not probabilities: the "
         "softmax comes later, when a token is drawn")
def temperature_returns_probabilities(logits, temperature):
    return probabilities(logits / temperature)


@mistake("apply_temperature", "the temperature divides the logits, z / T; raising to the power 1 / T is what "
         "it does to the probabilities (p^(1/T), normalised again), not to the logits")
def temperature_as_power(logits, temperature):
    with np.errstate(invalid="ignore"):
        return logits ** (1 / temperature)


check_apply_temperature = make_check("apply_temperature")

# top_k_filter: the k largest logits, and every tie at the k-th --------------------------------------------


@cases_for("top_k_filter", may_use="NumPy: np.sort, np.partition or np.argsort (not mnp.filter_logits)",
           forbids=FILTER_ROUTES, fresh=True)  # "Return a new array: leave `logits` as it was."
def top_k_filter_cases(r):
    """Ties at the k-th value, k = 1, k = V and k > V, a batch, masked tokens, logits near 1e4, float32."""
    ties = np.array([[3.0, 1.0, 3.0, 3.0, 0.0, 2.0],  # k = 2: the three 3s stay
                     [5.0, 4.0, 4.0, 1.0, 0.0, -1.0],  # the 5 and both 4s stay
                     [0.5, 2.0, -1.0, 2.0, 1.5, 0.0]])  # both 2s, and nothing else
    masked = with_masked_tokens(r.standard_normal((2, 6)), r, n_masked=4)  # two finite logits per row
    return [
        Case("ties at the k-th value, k = 2", (ties, 2)),
        Case("k = 1: the largest logit alone", (r.standard_normal((2, 7)), 1)),
        Case("k = V = 5 keeps every token", (r.standard_normal((3, 5)), 5)),
        Case("k = 8, more than V = 5, keeps every token", (r.standard_normal((2, 5)), 8)),
        Case("a batch (B, T, V) = (2, 3, 8), k = 3", (2 * r.standard_normal((2, 3, 8)), 3)),
        Case("masked tokens (-inf), k = 3 above the 2 finite logits of each row", (masked, 3)),
        Case("logits of about 1e4, k = 2", (1e4 + r.standard_normal((2, 6)), 2)),
        Case("float32 logits, k = 4", ((2 * r.standard_normal((3, 7))).astype(np.float32), 4)),
    ]


@random_cases_for("top_k_filter")
def top_k_filter_random_cases(r):
    """Whole-number logits (ties at the k-th value are likely) in a 4-D batch, float32, and one row with a masked
    token, with k from 1 to V + 1."""
    V = int(r.integers(3, 10))
    return [
        Case("random: a 4-D batch of whole-number logits (ties)",
             (np.round(normal(r, batch(r, 2) + (int(r.integers(1, 4)), V), scale=2)), int(r.integers(1, V + 2)))),
        Case("random: float32", (normal(r, sizes(r, 2, 1, 4) + (V,), np.float32, 2), int(r.integers(1, V + 2)))),
        Case("random: one row (V,) with a masked token", (with_masked_tokens(normal(r, V), r), int(r.integers(1, V)))),
    ]


def kth_largest(logits, k):
    """The k-th largest logit of each row, (..., 1), for k <= V."""
    return np.sort(logits, axis=-1)[..., -k:][..., :1]


@mistake("top_k_filter", "keep every token tied with the k-th largest logit: np.argsort(...)[..., -k:] keeps "
         "exactly k and drops a tie at random; compare each logit with the k-th largest value instead")
def top_k_without_ties(logits, k):
    keep = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(keep, np.argsort(logits, axis=-1, kind="stable")[..., -k:], True, axis=-1)
    return np.where(keep, logits, -np.inf)


@mistake("top_k_filter", "the threshold is the k-th largest logit, np.sort(logits)[..., -k], not the "
         "(k + 1)-th: the token just below the k-th must go")
def top_k_keeps_one_more(logits, k):
    threshold = kth_largest(logits, min(k + 1, logits.shape[-1]))
    return np.where(logits < threshold, -np.inf, logits)


@mistake("top_k_filter", "keep the logits at least as large as the k-th largest (>=): keeping only those "
         "strictly above it drops the k-th token itself")
def top_k_keeps_one_fewer(logits, k):
    threshold = kth_largest(logits, min(k, logits.shape[-1]))
    return np.where(logits > threshold, logits, -np.inf)


@mistake("top_k_filter", "a ruled-out token gets -np.inf, not 0: a logit of 0 is an ordinary token, as likely "
         "as any other logit of 0")
def top_k_zero_instead_of_inf(logits, k):
    return np.where(logits < kth_largest(logits, min(k, logits.shape[-1])), 0.0, logits)


@mistake("top_k_filter", "a ruled-out token gets -np.inf, not a large negative number such as -1e9: the "
         "answer is the logits themselves, and -1e9 is still a logit")
def top_k_large_negative(logits, k):
    return np.where(logits < kth_largest(logits, min(k, logits.shape[-1])), -1e9, logits)


@mistake("top_k_filter", "keep the k LARGEST logits: np.sort sorts in ascending order, so they are the last k")
def top_k_smallest(logits, k):
    kth_smallest = np.sort(logits, axis=-1)[..., min(k, logits.shape[-1]) - 1:][..., :1]
    return np.where(logits > kth_smallest, -np.inf, logits)


@mistake("top_k_filter", "each row (the last axis, one position's vocabulary) keeps its own k largest: "
         "sort along axis=-1, not over the whole array")
def top_k_over_the_whole_batch(logits, k):
    flat = np.sort(logits, axis=None)
    return np.where(logits < flat[-min(k, flat.size)], -np.inf, logits)


check_top_k_filter = make_check("top_k_filter")

# top_p_filter: the nucleus -----------------------------------------------------------------------------


def dyadic_logits(*orders):
    """Rows of logits whose probabilities are exactly 1/2, 1/4, 1/8 and 1/8 (in the given orders of the four
    tokens), with 0 the largest logit: the usual softmaxes compute them without rounding."""
    ln2 = math.log(2)
    values = np.array([0.0, -ln2, -2 * ln2, -2 * ln2])  # exp gives 1, 1/2, 1/4, 1/4 exactly; their sum is 2
    return np.array([values[list(order)] for order in orders])  # (rows, 4)


@cases_for("top_p_filter", may_use="NumPy and mnp.softmax (not mnp.filter_logits)", forbids=FILTER_ROUTES)
def top_p_filter_cases(r):
    """The boundary reached exactly, a batch, p tiny, p = 1, masked tokens, logits near 1000, float32 (no tie
    across the cut)."""
    masked = with_masked_tokens(1.5 * r.standard_normal((3, 6)), r, n_masked=2)
    large = np.array([[1000.0, 999.0, 998.5, 997.0, 990.0], [990.0, 997.0, 1000.0, 998.5, 999.0]])
    return [
        Case("the boundary reached exactly: 1/2 + 1/4 = p = 0.75", (dyadic_logits((2, 0, 3, 1))[0], 0.75)),
        Case("a batch (B, T, V) = (2, 3, 6), p = 0.9", (1.5 * r.standard_normal((2, 3, 6)), 0.9)),
        Case("p = 1e-20, tiny: the most probable token alone", (dyadic_logits((1, 2, 0, 3), (3, 0, 2, 1)), 1e-20)),
        Case("p = 1 keeps every token", (r.standard_normal((3, 5)), 1.0)),
        Case("masked tokens (-inf), p = 0.8", (masked, 0.8)),
        Case("logits of about 1000 (a softmax without the shift overflows), p = 0.9", (large, 0.9)),
        Case("float32 logits, p = 0.5", ((1.5 * r.standard_normal((3, 7))).astype(np.float32), 0.5)),
    ]


def mass_above(logits):
    """For each token of logits (..., V), the probability of the tokens ranked above it (float64)."""
    probs = probabilities(np.asarray(logits, dtype=np.float64))
    above = np.zeros_like(probs)
    for row in np.ndindex(probs.shape[:-1]):
        order = np.argsort(-probs[row], kind="stable")
        above[row + (order,)] = np.cumsum(probs[row][order]) - probs[row][order]
    return above


def p_away_from_the_cuts(r, logits, margin=1e-3):
    """A p in (0, 1) at least `margin` away from every token's mass above (so rounding decides nothing)."""
    cuts = np.unique(np.concatenate([[0.0, 1.0], mass_above(logits).ravel()]))
    gaps = [(a + margin, b - margin) for a, b in zip(cuts[:-1], cuts[1:]) if b - a > 2 * margin]
    low, high = gaps[int(r.integers(len(gaps)))]
    return float(r.uniform(low, high))


@random_cases_for("top_p_filter")
def top_p_filter_random_cases(r):
    """A 4-D batch, float32, and one row with a masked token; each p away from every cut by at least 1e-3."""
    V = int(r.integers(3, 10))
    logits = [normal(r, batch(r, 2) + (int(r.integers(1, 4)), V), scale=2),
              normal(r, sizes(r, 2, 1, 4) + (V,), np.float32, 2),
              with_masked_tokens(normal(r, V + 1, scale=2), r)]
    labels = ["random: a 4-D batch", "random: float32", "random: one row (V,) with a masked token"]
    return [Case(label, (z, p_away_from_the_cuts(r, z))) for label, z in zip(labels, logits)]


def sorted_probabilities(logits):
    """(order, probabilities in that order): the tokens from the most probable down, (..., V) each."""
    order = np.argsort(-logits, axis=-1, kind="stable")
    return order, probabilities(np.take_along_axis(logits, order, axis=-1))


def keep_in_vocabulary_order(logits, order, keep_sorted):
    """The logits with -inf where `keep_sorted` (in the sorted order `order`) is False."""
    keep = np.empty(logits.shape, dtype=bool)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf)


@mistake("top_p_filter", "always keep the most probable token: when p is tiny, 1 - p rounds to 1, and a rule "
         "such as 'drop when the mass up to this token is at most 1 - p' drops every token")
def top_p_without_keeping_one(logits, p):
    order = np.argsort(logits, axis=-1, kind="stable")  # least probable first, as transformers sorts
    mass_up_to = np.cumsum(probabilities(np.take_along_axis(logits, order, axis=-1)), axis=-1)
    return keep_in_vocabulary_order(logits, order, mass_up_to > 1 - p)


@mistake("top_p_filter", "keep a token while the tokens ranked ABOVE it hold less than p: cumsum(probs) <= p "
         "counts the token itself, drops the token that crosses p, and drops every token when p is small")
def top_p_counts_itself(logits, p):
    order, probs = sorted_probabilities(logits)
    return keep_in_vocabulary_order(logits, order, np.cumsum(probs, axis=-1) <= p)


@mistake("top_p_filter", "keep a token while the tokens ranked above it hold less than p: cumsum(probs) < p "
         "stops one token early, below p (at 1/2 + 1/4 = p = 0.75 it keeps the 1/2 alone)")
def top_p_strictly_under(logits, p):
    order, probs = sorted_probabilities(logits)
    return keep_in_vocabulary_order(logits, order, np.cumsum(probs, axis=-1) < p)


@mistake("top_p_filter", "once the tokens above hold p exactly, the set is complete: keep a token when the "
         "mass above it is < p, not <= p (at 1/2 + 1/4 = p = 0.75 the next token must go)")
def top_p_one_too_many(logits, p):
    order, probs = sorted_probabilities(logits)
    return keep_in_vocabulary_order(logits, order, np.cumsum(probs, axis=-1) - probs <= p)


@mistake("top_p_filter", "sort the tokens from the most probable down before the cumulative sum: np.cumsum "
         "in the vocabulary's order adds the tokens in the order of their ids")
def top_p_unsorted(logits, p):
    probs = probabilities(logits)
    return np.where(np.cumsum(probs, axis=-1) - probs < p, logits, -np.inf)


@mistake("top_p_filter", "p is a probability: add up softmax(logits), not the logits themselves")
def top_p_on_logits(logits, p):
    order = np.argsort(-logits, axis=-1, kind="stable")
    ranked = np.take_along_axis(logits, order, axis=-1)
    return keep_in_vocabulary_order(logits, order, np.cumsum(ranked, axis=-1) - ranked < p)


@mistake("top_p_filter", "put the answer back in the vocabulary's order: token i's logit goes to position i "
         "(np.put_along_axis with the sorting order), not the sorted logits")
def top_p_left_sorted(logits, p):
    order, probs = sorted_probabilities(logits)
    ranked = np.take_along_axis(logits, order, axis=-1)
    return np.where(np.cumsum(probs, axis=-1) - probs < p, ranked, -np.inf)


@mistake("top_p_filter", "subtract each row's maximum before np.exp: e^1000 overflows to inf, and inf / inf "
         "is NaN")
def top_p_softmax_overflows(logits, p):
    order = np.argsort(-logits, axis=-1, kind="stable")
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(np.take_along_axis(logits, order, axis=-1))
        probs = e / e.sum(axis=-1, keepdims=True)
    return keep_in_vocabulary_order(logits, order, np.cumsum(probs, axis=-1) - probs < p)


@mistake("top_p_filter", "a ruled-out token gets -np.inf, not 0 (a logit of 0 is an ordinary token)")
def top_p_zero_instead_of_inf(logits, p):
    order, probs = sorted_probabilities(logits)
    kept = keep_in_vocabulary_order(logits, order, np.cumsum(probs, axis=-1) - probs < p)
    return np.where(np.isneginf(kept) & np.isfinite(logits), 0.0, kept)


check_top_p_filter = make_check("top_p_filter")

# loss_to_bits_per_character: a model's loss beside a compressor's bits --------------------------------------


@cases_for("loss_to_bits_per_character", may_use="Python arithmetic (math.log)", forbids=BITS_FORBIDS)
def loss_to_bits_per_character_cases(r):
    """One token per character, BPE tokens (fewer than the characters), more tokens than characters, a uniform
    model, a perfect one, and NumPy numbers."""
    return [
        Case("one token per character: 1.2 nats per token, 200 000 of each", (1.2, 200_000, 200_000)),
        Case("BPE: 2.9 nats per token, 50 000 tokens over 200 000 characters", (2.9, 50_000, 200_000)),
        Case("more tokens than characters: 0.8 nats per token, 3000 tokens over 2000 characters", (0.8, 3000, 2000)),
        Case("a uniform model over 100 characters: ln 100 nats per token", (math.log(100), 5000, 5000)),
        Case("a perfect model: 0 nats per token", (0.0, 1000, 4000)),
        Case("NumPy numbers: np.float64 loss, np.int64 counts",
             (np.float64(1.7), np.int64(123_456), np.int64(400_000))),
    ]


@random_cases_for("loss_to_bits_per_character")
def loss_to_bits_per_character_random_cases(r):
    """Characters as tokens, BPE tokens (a fifth to a half of the characters), and NumPy numbers."""
    n = int(r.integers(1000, 1_000_000))
    loss = float(r.uniform(0.3, 5.0))
    return [
        Case("random: one token per character", (loss, n, n)),
        Case("random: BPE tokens", (float(r.uniform(1.0, 5.0)), int(n * r.uniform(0.2, 0.5)), n)),
        Case("random: NumPy numbers", (np.float64(loss), np.int64(r.integers(1000, n + 1)), np.int64(n))),
    ]


@mistake("loss_to_bits_per_character", "the loss is in nats (natural logarithm): divide by ln 2 for bits, "
         "1 bit = ln 2 nats")
def bits_left_in_nats(mean_loss, n_tokens, n_characters):
    return mean_loss * n_tokens / n_characters


@mistake("loss_to_bits_per_character", "divide by ln 2 to turn nats into bits; multiplying by ln 2 goes the "
         "other way")
def bits_times_ln2(mean_loss, n_tokens, n_characters):
    return mean_loss * n_tokens / n_characters * LN2


@mistake("loss_to_bits_per_character", "bits are logarithms in base 2: divide by ln 2, not by ln 10")
def bits_in_base_10(mean_loss, n_tokens, n_characters):
    return mean_loss * n_tokens / n_characters / math.log(10)


@mistake("loss_to_bits_per_character", "convert the loss itself, mean_loss / ln 2: log2 of the loss is "
         "another number altogether")
def bits_as_log2_of_the_loss(mean_loss, n_tokens, n_characters):
    return math.log2(mean_loss) * n_tokens / n_characters if mean_loss > 0 else -math.inf


@mistake("loss_to_bits_per_character", "the loss is per TOKEN: multiply by n_tokens for the whole text, then "
         "divide by n_characters; a BPE token spells several characters")
def bits_per_token(mean_loss, n_tokens, n_characters):
    return mean_loss / LN2


@mistake("loss_to_bits_per_character", "the whole text costs mean_loss * n_tokens nats: divide that by "
         "n_characters, not by n_tokens")
def bits_ratio_inverted(mean_loss, n_tokens, n_characters):
    return mean_loss * n_characters / n_tokens / LN2


@mistake("loss_to_bits_per_character", "use true division, n_tokens / n_characters: n_tokens // n_characters "
         "rounds down, to 0 when there are fewer tokens than characters")
def bits_integer_division(mean_loss, n_tokens, n_characters):
    return mean_loss * (n_tokens // n_characters) / LN2


check_loss_to_bits_per_character = make_check("loss_to_bits_per_character")
