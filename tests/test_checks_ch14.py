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

from learners import SEEDS, assert_trap_fails_on_its_case, failures_on_every_seed, hint_of, run
from solutions_ch14 import (BOUNDARY, CHAPTER_14, FILTERS, FROM_SCRATCH, LARGE, TINY, TRAINING, all_cases,
                            labelled)

import mha.numpy as mnp
from mha.checks.registry import CHECKS, expected_answer


def test_every_check_of_chapter_14_has_a_solution_from_scratch_here():
    assert {f.__name__ for f in FROM_SCRATCH} - {"top_p_filter_row_by_row"} == set(CHAPTER_14)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ == "mha.checks.ch14"} == \
        set(CHAPTER_14) - set(TRAINING)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ == "mha.checks.ch14_training"} == \
        set(TRAINING)


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


def test_the_reference_of_clip_grad_norm_is_torch_s_clip_grad_norm_on_every_case():
    """torch.nn.utils.clip_grad_norm_ on parameters whose .grad are the case's arrays: the same gradients and the
    same total norm, every named case and the random cases of seeds 0..9 (float32 within float32's rounding)."""
    for case in all_cases("clip_grad_norm"):
        grads, max_norm = case.args
        clipped, total = expected_answer("clip_grad_norm", case)
        parameters = [torch.zeros(g.shape, dtype=torch.from_numpy(g).dtype, requires_grad=True) for g in grads]
        for parameter, g in zip(parameters, grads):
            parameter.grad = torch.from_numpy(g.copy())
        torch_total = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        rtol = 1e-6 if any(g.dtype == np.float32 for g in grads) else 1e-12
        assert float(torch_total) == pytest.approx(float(total), rel=rtol, abs=1e-30), case.label
        for parameter, ours in zip(parameters, clipped):
            assert ours.dtype == parameter.grad.numpy().dtype, case.label
            np.testing.assert_allclose(ours, parameter.grad.numpy(), rtol=rtol, atol=0, err_msg=case.label)


def merged_by_tokenizers(ids, pair, new_id):
    """The ids that the tokenizers library's BPE gives with the one merge `pair` (each id spelled by a letter)."""
    from tokenizers import Tokenizer, models
    letters = {token: chr(ord("a") + i) for i, token in enumerate(dict.fromkeys([*ids, *pair]))}
    merged = letters[pair[0]] + letters[pair[1]]
    vocab = {**{letter: i for i, letter in enumerate(letters.values())}, merged: len(letters)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[(letters[pair[0]], letters[pair[1]])]))
    back = {letter: token for token, letter in letters.items()} | {merged: new_id}
    return [back[t] for t in tokenizer.encode("".join(letters[i] for i in ids)).tokens]


def test_the_reference_of_merge_pair_merges_as_the_tokenizers_library_does():
    """The text says so: every named case and the random cases of seeds 0..9, overlapping pairs included."""
    for case in all_cases("merge_pair"):
        assert expected_answer("merge_pair", case) == merged_by_tokenizers(*case.args), case.label


def test_the_training_loop_s_learning_rate_is_the_reference_s():
    """mha.text.training.learning_rate is warmup_cosine with final = min_lr_ratio * lr: the runs' schedule, by
    hand at four steps of the shipped character model's configuration (peak 3e-3, 100 warm-up steps of 1600)."""
    from mha.text.training import TrainingConfig, learning_rate
    config = TrainingConfig(lr=3e-3, warmup_steps=100, steps=1600, min_lr_ratio=0.1)
    expected = {1: 3e-5, 100: 3e-3, 850: (3e-3 + 3e-4) / 2, 1600: 3e-4, 2000: 3e-4}
    for step, rate in expected.items():
        assert learning_rate(step, config) == pytest.approx(rate, rel=1e-12), step
        assert mnp.warmup_cosine(step, peak=3e-3, warmup_steps=100, total_steps=1600, final=0.1 * 3e-3) == \
            learning_rate(step, config)


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


def merge_for_every_position(ids, pair, new_id):
    return [new_id if tuple(ids[i:i + 2]) == tuple(pair) else ids[i] for i in range(len(ids))]


def merge_over_the_pairs_only(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids) - 1:  # the last id is never looked at alone
        if (ids[i], ids[i + 1]) == tuple(pair):
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def cosine_part(step, peak, warmup_steps, total_steps, final):
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return final + (peak - final) * (1 + math.cos(math.pi * progress)) / 2


def rate_counted_from_zero(step, *, peak, warmup_steps, total_steps, final=0.0):
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return cosine_part(step, peak, warmup_steps, total_steps, final)


def rate_cosine_from_step_zero(step, *, peak, warmup_steps, total_steps, final=0.0):
    if step <= warmup_steps and warmup_steps:
        return peak * step / warmup_steps
    return final + (peak - final) * (1 + math.cos(math.pi * min(1.0, step / total_steps))) / 2


def rate_cosine_to_zero(step, *, peak, warmup_steps, total_steps, final=0.0):
    if step <= warmup_steps and warmup_steps:
        return peak * step / warmup_steps
    return cosine_part(step, peak, warmup_steps, total_steps, 0.0)


def rate_past_the_end(step, *, peak, warmup_steps, total_steps, final=0.0):
    if step <= warmup_steps and warmup_steps:
        return peak * step / warmup_steps
    return final + (peak - final) * (1 + math.cos(math.pi * (step - warmup_steps) / (total_steps - warmup_steps))) / 2


def rate_without_a_case_for_no_warmup(step, *, peak, warmup_steps, total_steps, final=0.0):
    if step <= warmup_steps:
        return peak * step / warmup_steps  # 0 / 0 when warmup_steps = 0
    return cosine_part(step, peak, warmup_steps, total_steps, final)


def clip_each_array(grads, max_norm):
    clipped = [g * min(1.0, max_norm / (np.linalg.norm(g) + 1e-6)) for g in grads]
    return clipped, float(np.sqrt(sum(np.sum(g * g) for g in grads)))


def clip_always(grads, max_norm):
    total = float(np.sqrt(sum(np.sum(g * g) for g in grads)))
    return [g * (max_norm / (total + 1e-6)) for g in grads], total


def clip_without_eps(grads, max_norm):
    total = float(np.sqrt(sum(np.sum(g * g) for g in grads)))
    return [g * min(1.0, max_norm / total) if total else g.copy() for g in grads], total


def clip_reports_the_new_norm(grads, max_norm):
    total = float(np.sqrt(sum(np.sum(g * g) for g in grads)))
    clipped = [g * min(1.0, max_norm / (total + 1e-6)) for g in grads]
    return clipped, float(np.sqrt(sum(np.sum(g * g) for g in clipped)))


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
    ("merge_pair", merge_for_every_position, "skip the second id too", "one occurrence in the middle"),
    ("merge_pair", merge_over_the_pairs_only, "keep the last id", "one occurrence in the middle"),
    ("warmup_cosine", rate_counted_from_zero, "steps count from 1", "step 0"),
    ("warmup_cosine", rate_cosine_from_step_zero, "the cosine begins where the warm-up ends", "half-way"),
    ("warmup_cosine", rate_cosine_to_zero, "goes down to `final`", "half-way"),
    ("warmup_cosine", rate_past_the_end, "stays at final", "3 steps beyond the end"),
    ("clip_grad_norm", clip_each_array, "one norm for all the gradients together", "three arrays, each of norm 0.9"),
    ("clip_grad_norm", clip_always, "clip only", "small gradients"),
    ("clip_grad_norm", clip_without_eps, "add 1e-6 to the norm", "one (4, 3) array"),
    ("clip_grad_norm", clip_reports_the_new_norm, "before clipping", "one (4, 3) array"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    assert_trap_fails_on_its_case(name, fn, hint, case)


def test_k_beyond_the_vocabulary_is_a_case_of_its_own():
    """np.partition(logits, -k) fails when k > V: the learner reads which case, and the error."""
    for message in failures_on_every_seed("top_k_filter", top_k_by_partition):
        assert "raised ValueError: kth(=-3) out of bounds (5)" in message
        assert "on the case 'k = 8, more than V = 5, keeps every token'" in message, message


def test_no_warm_up_is_a_case_of_its_own():
    """peak * step / warmup_steps divides 0 by 0 when there is no warm-up: the learner reads which case."""
    for message in failures_on_every_seed("warmup_cosine", rate_without_a_case_for_no_warmup):
        assert "raised ZeroDivisionError" in message and "on the case 'warmup_steps = 0, step 0" in message, message


@pytest.mark.parametrize("name", CHAPTER_14)
def test_every_catalogued_mistake_fails_with_its_own_hint_on_every_seed(name):
    for m in CHECKS[name].mistakes:
        for message in failures_on_every_seed(name, m.fn, seeds=SEEDS[:3]):
            assert hint_of(message) == m.hint, (m.fn.__name__, message)
