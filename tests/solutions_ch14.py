"""Right solutions of chapter 14's exercises written from scratch, for the tests of its checks
(tests/test_checks_ch14.py, test_checks_cases_ch14.py, test_checks_routes_ch14.py, and the gathering of right
solutions in tests/learners.py), and what those tests share: the hint of a failure, the cases of a check, and
the labels of top-p's named traps."""

import math

import numpy as np

from learners import SEEDS

from mha.checks.registry import CHECKS

CHAPTER_14 = ["apply_temperature", "top_k_filter", "top_p_filter", "loss_to_bits_per_character", "merge_pair",
              "warmup_cosine", "clip_grad_norm"]
TRAINING = CHAPTER_14[4:]  # the run around the model: their checks are in mha.checks.ch14_training
FILTERS = CHAPTER_14[:3]
BOUNDARY, TINY, LARGE = "the boundary reached exactly", "p = 1e-20", "logits of about 1000"  # top-p's named traps


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


def merge_pair(ids, pair, new_id):
    """A skip flag instead of an index that jumps by 2."""
    merged, just_merged = [], False
    for i, token in enumerate(ids):
        if just_merged:  # this id was the second of a merged pair
            just_merged = False
            continue
        if i + 1 < len(ids) and token == pair[0] and ids[i + 1] == pair[1]:
            merged.append(new_id)
            just_merged = True
        else:
            merged.append(token)
    return merged


def warmup_cosine(step, *, peak, warmup_steps, total_steps, final=0.0):
    """The warm-up with a strict <, the progress as steps done over steps of the decay."""
    if step < warmup_steps:
        return peak * step / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    done = min(step - warmup_steps, decay_steps)
    return final + (peak - final) * (1 + math.cos(math.pi * done / decay_steps)) / 2


def clip_grad_norm(grads, max_norm):
    """Every entry in one long float64 vector for the norm; a factor of at most 1 for every array."""
    entries = np.concatenate([np.ravel(g).astype(np.float64) for g in grads] + [np.zeros(0)])
    total = float(np.sqrt(entries @ entries))
    factor = min(1.0, max_norm / (total + 1e-6))
    return [g * factor for g in grads], total


FROM_SCRATCH = [apply_temperature, top_k_filter, top_p_filter, top_p_filter_row_by_row, loss_to_bits_per_character,
                merge_pair, warmup_cosine, clip_grad_norm]
