"""The checks of chapter 14 (a model that writes): a right solution written from scratch passes on every seed
(0..9); every wrong solution that a learner writes fails on a fixed named case, on every seed, with the hint
that fits; every catalogued mistake fails with its own hint; the references equal transformers' warpers on
every case. The named cases and inputs written in place: tests/test_checks_cases_ch14.py; what each exercise
may call: tests/test_checks_routes_ch14.py."""

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from learners import SEEDS, failures_on_every_seed, run
from solutions_ch14 import (BOUNDARY, CHAPTER_14, FILTERS, FROM_SCRATCH, LARGE, TINY, all_cases, hint_of,
                            labelled)

import mha.numpy as mnp
from mha.checks.registry import CHECKS, expected_answer


def test_every_check_of_chapter_14_has_a_solution_from_scratch_here():
    assert {f.__name__ for f in FROM_SCRATCH} - {"top_p_filter_row_by_row"} == set(CHAPTER_14)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ == "mha.checks.ch14"} == \
        set(CHAPTER_14)


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_right_solution_from_scratch_passes_on_every_seed(fn):
    name = fn.__name__.replace("_row_by_row", "")
    for seed in SEEDS:
        assert run(name, fn, seed).startswith(f"check_{name}: all "), seed


# The references equal transformers' warpers -------------------------------------------------------------------


def warped(name, case):
    """transformers' answer on `case`: its warper on the logits as (rows, V) float tensors."""
    logits, option = case.args
    rows = torch.from_numpy(np.ascontiguousarray(logits).reshape(-1, logits.shape[-1]))  # (rows, V)
    warper = {"apply_temperature": lambda: TemperatureLogitsWarper(float(option)),
              "top_k_filter": lambda: TopKLogitsWarper(option),
              "top_p_filter": lambda: TopPLogitsWarper(option)}[name]()
    return warper(None, rows).numpy().reshape(logits.shape)  # (..., V) again


@pytest.mark.parametrize("name", FILTERS)
def test_the_reference_equals_transformers_warper_on_every_case(name):
    """Every named case and the random cases of seeds 0..9: the same -inf, and the same numbers, bit for bit."""
    for case in all_cases(name):
        expected = expected_answer(name, case)
        assert expected.dtype == case.args[0].dtype, case.label
        np.testing.assert_array_equal(expected, warped(name, case), err_msg=case.label)


def test_the_references_of_chapter_14_are_the_library_s_filters():
    """filter_logits applies the same three filters, each alone when the other options are left off (top_p=1
    skips the filter there, as transformers' generate skips it: the cases of p = 1 rule out no token)."""
    for name, option in (("apply_temperature", "temperature"), ("top_k_filter", "top_k"), ("top_p_filter", "top_p")):
        for case in all_cases(name, seeds=SEEDS[:3]):
            logits, value = case.args
            np.testing.assert_array_equal(expected_answer(name, case), mnp.filter_logits(logits, **{option: value}))


def test_bits_per_character_by_hand():
    """4 nats per token, 1000 tokens over 4000 characters: 1 nat per character, 1 / ln 2 = 1.4427 bits."""
    assert mnp.loss_to_bits_per_character(4.0, 1000, 4000) == pytest.approx(1 / math.log(2), rel=1e-15)
    uniform = expected_answer("loss_to_bits_per_character", labelled("loss_to_bits_per_character", "uniform"))
    assert uniform == pytest.approx(math.log2(100), rel=1e-12)  # a uniform model over 100 characters: log2(100) bits


# Wrong solutions, as learners write them ------------------------------------------------------------------------


def temperature_times(logits, temperature):
    return logits * temperature


def temperature_softmax_first(logits, temperature):
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    return probs / temperature


def temperature_gives_probabilities(logits, temperature):
    z = logits / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k_by_argsort(logits, k):
    out = np.full_like(logits, -np.inf)
    idx = np.argsort(logits, axis=-1)[..., -k:]  # exactly k: a tie at the k-th value is cut
    np.put_along_axis(out, idx, np.take_along_axis(logits, idx, axis=-1), axis=-1)
    return out


def top_k_with_zeros(logits, k):
    kth = np.sort(logits, axis=-1)[..., -min(k, logits.shape[-1]), None]
    return np.where(logits >= kth, logits, 0.0)


def top_k_strictly_above(logits, k):
    kth = np.sort(logits, axis=-1)[..., -min(k, logits.shape[-1]), None]
    return np.where(logits > kth, logits, -np.inf)


def top_k_by_partition(logits, k):
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]  # k > V: kth out of bounds
    return np.where(logits < kth, -np.inf, logits)


def nucleus(logits, p, keep_rule, shift=True):
    """Most probable first; keep_rule(cumulative mass, probs) says which sorted tokens stay."""
    order = np.argsort(-logits, axis=-1, kind="stable")
    ranked = np.take_along_axis(logits, order, axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(ranked - ranked[..., :1]) if shift else np.exp(ranked)
        probs = e / e.sum(axis=-1, keepdims=True)
        keep_ranked = keep_rule(np.cumsum(probs, axis=-1), probs)
    keep = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(keep, order, keep_ranked, axis=-1)
    return np.where(keep, logits, -np.inf)


def top_p_below_p(logits, p):
    return nucleus(logits, p, lambda mass, probs: mass < p)


def top_p_within_p(logits, p):
    return nucleus(logits, p, lambda mass, probs: mass <= p)


def top_p_through_p(logits, p):
    return nucleus(logits, p, lambda mass, probs: mass - probs <= p)


def top_p_naive_exp(logits, p):
    return nucleus(logits, p, lambda mass, probs: mass - probs < p, shift=False)


def top_p_in_id_order(logits, p):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    mass = np.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1)
    return np.where(mass - e / e.sum(axis=-1, keepdims=True) < p, logits, -np.inf)


def top_p_as_transformers_without_the_keep_one_line(logits, p):
    order = np.argsort(logits, axis=-1)
    ranked = np.take_along_axis(logits, order, axis=-1)
    e = np.exp(ranked - ranked[..., -1:])
    drop_ranked = np.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1) <= 1 - p
    drop = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(drop, order, drop_ranked, axis=-1)
    return np.where(drop, -np.inf, logits)


def top_p_sorted_answer(logits, p):
    ranked = -np.sort(-logits, axis=-1)
    e = np.exp(ranked - ranked[..., :1])
    probs = e / e.sum(axis=-1, keepdims=True)
    return np.where(np.cumsum(probs, axis=-1) - probs < p, ranked, -np.inf)


def bits_in_nats(mean_loss, n_tokens, n_characters):
    return mean_loss * n_tokens / n_characters


def bits_of_a_token(mean_loss, n_tokens, n_characters):
    return mean_loss / math.log(2)


def bits_upside_down(mean_loss, n_tokens, n_characters):
    return mean_loss / (n_tokens / n_characters) / math.log(2)


def bits_floor_ratio(mean_loss, n_tokens, n_characters):
    return mean_loss * (n_tokens // n_characters) / math.log(2)


# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    ("apply_temperature", temperature_times, "multiplying by T", "a batch (B, T, V)"),
    ("apply_temperature", temperature_softmax_first, "before any softmax", "a batch (B, T, V)"),
    ("apply_temperature", temperature_gives_probabilities, "not probabilities", "a batch (B, T, V)"),
    ("top_k_filter", top_k_by_argsort, "keep every token tied with the k-th", "ties at the k-th value"),
    ("top_k_filter", top_k_with_zeros, "-np.inf, not 0", "ties at the k-th value"),
    ("top_k_filter", top_k_strictly_above, "drops the k-th token itself", "ties at the k-th value"),
    ("top_p_filter", top_p_below_p, "stops one token early", BOUNDARY),
    ("top_p_filter", top_p_within_p, "counts the token itself", "a batch (B, T, V)"),
    ("top_p_filter", top_p_through_p, "not <= p", BOUNDARY),
    ("top_p_filter", top_p_in_id_order, "in the vocabulary's order adds the tokens in the order of their ids",
     BOUNDARY),
    ("top_p_filter", top_p_as_transformers_without_the_keep_one_line, "always keep the most probable token", TINY),
    ("top_p_filter", top_p_sorted_answer, "put the answer back in the vocabulary's order", BOUNDARY),
    ("top_p_filter", top_p_naive_exp, "subtract each row's maximum", LARGE),
    ("loss_to_bits_per_character", bits_in_nats, "divide by ln 2 for bits", "one token per character"),
    ("loss_to_bits_per_character", bits_of_a_token, "the loss is per TOKEN", "BPE"),
    ("loss_to_bits_per_character", bits_upside_down, "not by n_tokens", "BPE"),
    ("loss_to_bits_per_character", bits_floor_ratio, "use true division", "BPE"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    messages = failures_on_every_seed(name, fn)
    assert hint in hint_of(messages[0]), messages[0]
    for message in messages:
        assert f"on the case '{case}" in message, message


def test_k_beyond_the_vocabulary_is_a_case_of_its_own():
    """np.partition(logits, -k) fails when k > V: the learner reads which case, and the error."""
    for message in failures_on_every_seed("top_k_filter", top_k_by_partition):
        assert "raised ValueError: kth(=-3) out of bounds (5)" in message
        assert "on the case 'k = 8, more than V = 5, keeps every token'" in message, message


@pytest.mark.parametrize("name", CHAPTER_14)
def test_every_catalogued_mistake_fails_with_its_own_hint_on_every_seed(name):
    for m in CHECKS[name].mistakes:
        for message in failures_on_every_seed(name, m.fn, seeds=SEEDS[:3]):
            assert hint_of(message) == m.hint, (m.fn.__name__, message)
