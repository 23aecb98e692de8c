"""Sampling the next token (chapter 14), the reference: temperature, top-k and top-p filters, and
generation that draws each new token at random from what the filters leave.

With logits z over a vocabulary of V tokens, temperature tau gives the probabilities
softmax(z / tau); top-k keeps the k largest logits (and any tied with the k-th); top-p keeps the
smallest set of most likely tokens whose probabilities add up to at least p. `mha.torch` has the
same names, equal to transformers' warpers. One difference: when equal logits straddle the top-p
cut, this face drops the smaller ids first, while mha.torch (like transformers) keeps those that
torch.sort happens to leave on top; as many tokens stay either way.
"""

import numpy as np

from mha import validate
from mha.validate import check_p, check_temperature, check_top_k, check_top_p
from mha.numpy.attention import as_float_array, softmax
from mha.numpy.model import check_ids, check_prompt


def as_logits(logits):
    """Logits as a floating-point array of shape (..., V) with V >= 1 (float32 stays float32)."""
    logits = as_float_array("logits", logits)
    validate.check_ndim("logits", logits, 1)
    if logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {validate.shape_str(logits.shape)}")
    return logits


def apply_temperature(logits, temperature):
    """z / tau: the logits (..., V) divided by the temperature tau > 0. Below 1 the softmax is sharper,
    above 1 flatter. Returns (..., V)."""
    return as_logits(logits) / check_temperature(temperature)


def top_k_filter(logits, k):
    """-inf below the k-th largest logit of each row, (..., V) -> (..., V): ties at the k-th value stay,
    and k >= V keeps every token."""
    logits = as_logits(logits)
    k = min(validate.check_int("k", k), logits.shape[-1])
    kth_largest = np.sort(logits, axis=-1)[..., -k, None]  # (..., 1)
    return np.where(logits < kth_largest, -np.inf, logits)


def top_p_filter(logits, p):
    """-inf on the least likely tokens whose probabilities add up to at most 1 - p, (..., V) -> (..., V).

    What stays is the smallest set of most likely tokens holding at least p of the mass, and never
    less than the most likely token. Equal logits count the smaller id as the less likely one: of a
    tie across the cut, the smaller ids go first."""
    logits, p = as_logits(logits), check_p(p)
    order = np.argsort(logits, axis=-1, kind="stable")  # (..., V): least likely first
    probs = softmax(np.take_along_axis(logits, order, axis=-1))  # (..., V), in that order
    mass_up_to = np.cumsum(probs, axis=-1)  # (..., V): mass of this token and all below it
    drop_sorted = mass_up_to <= 1 - p
    drop_sorted[..., -1] = False  # the most likely token always stays
    drop = np.empty(logits.shape, dtype=bool)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)  # back to the ids' order
    return np.where(drop, -np.inf, logits)


def filter_logits(logits, *, temperature=1.0, top_k=None, top_p=None):
    """The logits (..., V) to sample from: `apply_temperature`, then `top_k_filter` and `top_p_filter`,
    in transformers' order. top_k=None, top_p=None or 1.0 rule out nothing (transformers' generate
    skips them). Returns (..., V), float32 staying float32."""
    logits = as_logits(logits)
    temperature, top_k, top_p = check_temperature(temperature), check_top_k(top_k), check_top_p(top_p)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return logits


def sample(probs, rng):
    """One token id per row of `probs` (..., V), by the inverse of the cumulative distribution:
    with u drawn uniformly from [0, 1) (`rng.random()`), the first id whose cumulative probability
    exceeds u. Returns (...) integer ids; a token of probability 0 is never drawn."""
    if not np.isfinite(probs).all():
        raise ValueError("the probabilities to sample from are not finite: the logits hold NaN, +inf, "
                         "or only -inf")
    cumulative = np.cumsum(probs, axis=-1)  # (..., V)
    u = rng.random(probs.shape[:-1]) * cumulative[..., -1]  # (...): scaled, in case rounding left the sum < 1
    return (cumulative <= u[..., None]).sum(axis=-1)  # (...): how many ids lie wholly below u


def check_rng(rng):
    if rng is None:
        return np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be None or a numpy.random.Generator (np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    return rng


def generate(logits_fn, prompt, n_new, *, temperature=1.0, top_k=None, top_p=None, rng=None):
    """Continue `prompt` (T_0,) or (B, T_0) by `n_new` tokens, each drawn at random (`sample`) from
    softmax(filter_logits(...)) of the last position. Returns (T_0 + n_new,) or (B, T_0 + n_new).

    logits_fn(tokens (T,) or (B, T)) -> logits (T, V) or (B, T, V), called on all the tokens at
    each step (no cache). rng: a numpy.random.Generator, or None for a fresh one
    (np.random.default_rng()): one uniform number per sequence per step.
    """
    tokens = check_prompt(prompt)  # (T_0,) or (B, T_0)
    validate.check_ndim("prompt", tokens, 1, 2)
    check_ids("prompt", tokens, None)
    n_new = validate.check_int("n_new", n_new, minimum=0)
    options = dict(temperature=check_temperature(temperature), top_k=check_top_k(top_k), top_p=check_top_p(top_p))
    rng = check_rng(rng)
    for step in range(n_new):
        logits = np.asarray(logits_fn(tokens))  # (..., T, V)
        if logits.ndim != tokens.ndim + 1 or logits.shape[:-1] != tokens.shape:
            raise ValueError(f"logits_fn must return logits of shape (..., T, V) = (*{tokens.shape}, V), "
                             f"got shape {validate.shape_str(logits.shape)}")
        if step == 0:
            check_ids("prompt", tokens, logits.shape[-1])
        probs = softmax(filter_logits(logits[..., -1, :], **options))  # (..., V)
        new = sample(probs, rng)  # (...)
        tokens = np.concatenate([tokens, new[..., None].astype(tokens.dtype)], axis=-1)  # (..., T + 1)
    return tokens
