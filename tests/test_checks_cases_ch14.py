"""The cases of chapter 14's checks (a model that writes): the traps are in the named cases (ties at the k-th
value, the top-p boundary reached exactly, p so tiny that 1 - p rounds to 1, logits that overflow e^x), no case
lets rounding or a tie decide top-p's cut, and an input written in place is refused."""

import numpy as np
import pytest
import torch

from learners import failures_on_every_seed
from solutions_ch14 import BOUNDARY, LARGE, TINY, all_cases, labelled

import mha.numpy as mnp
from mha.checks import ch14
from mha.checks.registry import CHECKS, expected_answer


# The traps are in the named cases, and rounding or a tie never decides top-p's cut ----------------------------


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
