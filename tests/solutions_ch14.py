"""Right solutions of chapter 14's exercises written from scratch, for the tests of its checks
(tests/test_checks_ch14.py, test_checks_cases_ch14.py, test_checks_routes_ch14.py, and the gathering of right
solutions in tests/learners.py), and what those tests share: the hint of a failure, the cases of a check, and
the labels of top-p's named traps."""

import math

import numpy as np

from learners import SEEDS

from mha.checks.registry import CHECKS

CHAPTER_14 = ["apply_temperature", "top_k_filter", "top_p_filter", "loss_to_bits_per_character"]
FILTERS = CHAPTER_14[:3]
BOUNDARY, TINY, LARGE = "the boundary reached exactly", "p = 1e-20", "logits of about 1000"  # top-p's named traps


def hint_of(message):
    """The hint of a failure message ("" when it has none)."""
    return message.split("\n  hint: ")[1].split("\n")[0] if "\n  hint: " in message else ""


def all_cases(name, seeds=SEEDS):
    """The named cases of check_<name>, then the random ones of every seed."""
    check = CHECKS[name]
    drawn = [check.make_random_cases(np.random.default_rng(seed)) for seed in seeds]
    return check.named_cases(0) + [case for cases in drawn for case in cases]


def labelled(name, words):
    return next(case for case in CHECKS[name].named_cases(0) if words in case.label)


# Right solutions written from scratch: NumPy only, float32 kept float32 ------------------------------------


def apply_temperature(logits, temperature):
    return np.asarray(logits) * (1.0 / temperature)  # a Python float: float32 stays float32


def top_k_filter(logits, k):
    logits = np.asarray(logits)
    k = min(k, logits.shape[-1])
    kth = -np.partition(-logits, k - 1, axis=-1)[..., k - 1, None]  # (..., 1): the k-th largest of each row
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits, p):
    """Least probable first, as transformers sorts: a token goes when the mass up to it is at most 1 - p."""
    logits = np.asarray(logits)
    order = np.argsort(logits, axis=-1)  # (..., V)
    ranked = np.take_along_axis(logits, order, axis=-1)  # (..., V), ascending
    e = np.exp(ranked - ranked[..., -1:])
    drop_ranked = np.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1) <= 1 - p
    drop_ranked[..., -1] = False  # the most probable token stays
    drop = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(drop, order, drop_ranked, axis=-1)
    return np.where(drop, -np.inf, logits)


def top_p_filter_row_by_row(logits, p):
    """Most probable first, one row at a time: a token stays while the tokens above it hold less than p."""
    logits = np.asarray(logits)
    out = np.full_like(logits, -np.inf)
    for row in np.ndindex(logits.shape[:-1]):
        z = logits[row]
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        held = 0.0
        for token in sorted(range(len(z)), key=lambda t: -probs[t]):
            if held >= p:
                break
            out[row + (token,)] = z[token]
            held += probs[token]
    return out


def loss_to_bits_per_character(mean_loss, n_tokens, n_characters):
    total_bits = mean_loss * n_tokens / math.log(2)  # nats -> bits
    return total_bits / n_characters


FROM_SCRATCH = [apply_temperature, top_k_filter, top_p_filter, top_p_filter_row_by_row, loss_to_bits_per_character]
