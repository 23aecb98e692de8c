"""The checks of chapter 14 (a model that writes): a right solution written from scratch passes on every seed
(0..9); every wrong solution that a learner writes fails on a fixed named case, on every seed, with the hint
that fits; an input written in place is refused; the references equal transformers' warpers on every case;
the traps are in the named cases (ties at the k-th value, the top-p boundary reached exactly, p so tiny that
1 - p rounds to 1, logits that overflow e^x) and no case lets rounding or a tie decide top-p's cut; and what
each exercise may not call (`forbids`) agrees with its text, so that the student edition of mha refuses the
library's routes to the answer."""

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from learners import SEEDS, exercise_texts, failures_on_every_seed, run, student_edition

import mha.numpy as mnp
from mha.checks import ch14
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer

CHAPTER_14 = ["apply_temperature", "top_k_filter", "top_p_filter", "loss_to_bits_per_character"]
FILTERS = CHAPTER_14[:3]
ROOT = Path(__file__).resolve().parents[1]


def hint_of(message):
    """The hint of a failure message ("" when it has none)."""
    return message.split("\n  hint: ")[1].split("\n")[0] if "\n  hint: " in message else ""


def all_cases(name, seeds=SEEDS):
    """The named cases of check_<name>, then the random ones of every seed."""
    check = CHECKS[name]
    drawn = [check.make_random_cases(np.random.default_rng(seed)) for seed in seeds]
    return check.named_cases(0) + [case for cases in drawn for case in cases]


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


BOUNDARY, TINY, LARGE = "the boundary reached exactly", "p = 1e-20", "logits of about 1000"

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


# The traps are in the named cases, and rounding or a tie never decides top-p's cut ----------------------------


def labelled(name, words):
    return next(case for case in CHECKS[name].named_cases(0) if words in case.label)


def test_the_named_traps_of_top_k_and_temperature_are_there():
    ties, k = labelled("top_k_filter", "ties at the k-th").args
    kth = np.sort(ties, axis=-1)[:, -k]
    assert ((ties == kth[:, None]).sum(-1) >= 2).all() and ((ties >= kth[:, None]).sum(-1) > k).any()
    for words, beyond in (("k = V", 0), ("more than V", 1)):
        logits, k = labelled("top_k_filter", words).args
        assert (k > logits.shape[-1]) == bool(beyond) and k >= logits.shape[-1]
    masked, k = labelled("top_k_filter", "masked tokens").args
    assert (np.isfinite(masked).sum(-1) < k).all()
    assert labelled("top_k_filter", "float32").args[0].dtype == np.float32
    assert labelled("apply_temperature", "float32").args[0].dtype == np.float32
    assert np.isneginf(labelled("apply_temperature", "masked").args[0]).any()
    assert isinstance(labelled("apply_temperature", "integer temperature").args[1], int)
    temperatures = [case.args[1] for case in CHECKS["apply_temperature"].named_cases(0)]
    assert min(temperatures) < 1 < max(temperatures) and 1.0 in temperatures


SOFTMAXES = {"shifted by the maximum": lambda z: np.exp(z - z.max(-1, keepdims=True)),
             "not shifted": np.exp, "mnp.softmax": mnp.softmax,
             "torch": lambda z: torch.softmax(torch.from_numpy(z), -1).numpy()}


@pytest.mark.parametrize("how", SOFTMAXES)
def test_the_boundary_is_exact_under_the_usual_softmaxes(how):
    """1/2 + 1/4 = 0.75 = p with no rounding at all, whichever usual softmax the learner writes; and p = 1e-20
    leaves 1 - p = 1, so a rule without 'keep at least one token' drops every token."""
    logits, p = labelled("top_p_filter", BOUNDARY).args
    e = SOFTMAXES[how](logits)
    probs = e / e.sum(-1, keepdims=True)
    assert sorted(probs) == [0.125, 0.125, 0.25, 0.5] and p == 0.5 + 0.25
    logits, p = labelled("top_p_filter", TINY).args
    e = SOFTMAXES[how](logits)
    assert (np.cumsum(e / e.sum(-1, keepdims=True), -1)[:, -1] == 1.0).all() and 1 - p == 1.0


def test_the_large_logits_overflow_a_softmax_without_the_shift():
    logits, _ = labelled("top_p_filter", LARGE).args
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(logits)).any()


def test_no_case_of_top_p_lets_rounding_or_a_tie_decide_the_cut():
    """Apart from the exact boundary, every p is 1e-3 or more away from the mass above every other token than the
    most probable (named cases
    and the random ones of every seed); tied logits are all kept or all dropped; p = 1 leaves no token whose
    probability underflows; and every answer keeps at least one token."""
    for case in all_cases("top_p_filter"):
        logits, p = case.args
        answer = expected_answer("top_p_filter", case)
        above = ch14.mass_above(logits)
        if BOUNDARY not in case.label and p < 1:  # (the top token has exactly 0 above it, and stays for any p)
            assert np.abs(above[above > 0] - p).min() >= 1e-3, case.label
        for row in np.ndindex(logits.shape[:-1]):
            finite = np.isfinite(logits[row])
            for value in np.unique(logits[row][finite]):
                assert len(set(np.isfinite(answer[row][logits[row] == value]))) == 1, case.label
            assert np.isfinite(answer[row]).any(), case.label
        if p == 1:
            assert ch14.probabilities(logits).min() > 1e-3


# Inputs written in place ----------------------------------------------------------------------------------------


def temperature_into_logits(logits, temperature):
    logits /= temperature  # into the caller's array
    return logits


def top_k_into_logits(logits, k):
    kth = np.sort(logits, axis=-1)[..., -min(k, logits.shape[-1]), None]
    logits[logits < kth] = -np.inf
    return logits


IN_PLACE = [("apply_temperature", temperature_into_logits), ("top_k_filter", top_k_into_logits)]


@pytest.mark.parametrize("name,fn", IN_PLACE, ids=[fn.__name__ for _, fn in IN_PLACE])
def test_an_input_written_in_place_is_refused_on_every_seed(name, fn):
    for message in failures_on_every_seed(name, fn):
        assert "logits was changed in place" in message and "work on a copy" in message, message


# What each exercise may not call, and the library's routes to its answer -----------------------------------------


def test_forbids_names_library_functions_and_never_what_may_use_permits():
    for name in CHAPTER_14:
        check = CHECKS[name]
        assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
        for forbidden in check.forbids:
            assert not re.search(rf"(?<!not )(?<!without )mnp\.{forbidden}\b", check.may_use), forbidden
        assert check.packages == () and not check.float32_promised
    for name in FILTERS:
        assert CHECKS[name].forbids == ("filter_logits",) and "not mnp.filter_logits" in CHECKS[name].may_use
    assert "mnp.softmax" in CHECKS["top_p_filter"].may_use and "softmax" not in CHECKS["top_p_filter"].forbids


def test_the_bits_route_of_mha_text_is_out_of_the_graders_reach():
    """mha.text.bits_per_character gives the answer from the total nats, but the student edition that grades
    copies mha.numpy and what it imports, never mha.text: no forbid is needed for it."""
    sys.path.insert(0, str(ROOT / "tools"))
    from grading import student_edition
    assert "numpy" in student_edition.COPIED and not any("text" in part for part in student_edition.COPIED)


def by_filter_logits(option):
    def route(logits, value):
        return mnp.filter_logits(logits, **{option: value})
    return route


ROUTES = [("apply_temperature", by_filter_logits("temperature")), ("top_k_filter", by_filter_logits("top_k")),
          ("top_p_filter", by_filter_logits("top_p"))]


@pytest.mark.parametrize("name,route", ROUTES, ids=[name for name, _ in ROUTES])
def test_a_library_route_is_right_in_the_notebook_and_fails_in_the_student_edition(name, route, monkeypatch):
    check = CHECKS[name]
    for case in check.named_cases(0):
        assert compare_result(expected_answer(name, case), case.call(route), check.returns) is None, case.label
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route):
            assert "this is the exercise" in message, message


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_solution_from_scratch_passes_in_the_student_edition(fn, monkeypatch):
    name = fn.__name__.replace("_row_by_row", "")
    with student_edition(name, monkeypatch):
        for seed in SEEDS[:3]:
            assert run(name, fn, seed).startswith(f"check_{name}: all "), seed


# The exercises' text, once chapter 14 is written ------------------------------------------------------------------


CHAPTER = next(iter(sorted((ROOT / "book").glob("14_*.ipynb"))), None)


@pytest.mark.skipif(CHAPTER is None, reason="chapter 14 is not written yet: its exercises' text cannot be read")
def test_the_exercises_text_agrees_with_the_checks():
    """Each check's exercise exists, asks for no error, rules out by name what the check forbids, and never
    permits it; the top-p exercise says where its cut is (the mass of the tokens above < p)."""
    texts = {name: " ".join(text.split()) for name, text in exercise_texts(14).items()}
    assert sorted(texts) == sorted(CHAPTER_14)
    for name, text in texts.items():
        assert not re.search(r"ValueError|TypeError|\braise", text), name
        for forbidden in CHECKS[name].forbids:
            assert re.search(rf"without `mnp\.{forbidden}`", text), (name, forbidden)
            assert not re.search(rf"(?<!not )(?<!without )`mnp\.{forbidden}`", text), (name, forbidden)
    assert "-np.inf" in texts["top_k_filter"] and "tied" in texts["top_k_filter"]
    assert "less than" in texts["top_p_filter"] and "at least one" in texts["top_p_filter"]
