"""The cases of chapter 14's checks (a model that writes): the traps are in the named cases (ties at the k-th
value, the top-p boundary reached exactly, p so tiny that 1 - p rounds to 1, logits that overflow e^x; overlapping
pairs of a BPE merge, the steps where the learning rate changes form, gradients each short but long together), no
case lets rounding or a tie decide top-p's cut, and an input written in place (or given back) is refused."""

import math
import re

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


def merge_into_ids(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == tuple(pair):
            ids[i:i + 2] = [new_id]  # into the caller's list
        i += 1
    return ids


def clip_into_grads(grads, max_norm):
    total = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
    for g in grads:
        g *= min(1.0, max_norm / (total + 1e-6))  # into the caller's arrays
    return grads, total


@pytest.mark.parametrize("name,fn,what", [("merge_pair", merge_into_ids, "ids was changed in place"),
                                          ("clip_grad_norm", clip_into_grads, "grads[0] was changed in place")])
def test_a_list_or_its_arrays_written_in_place_are_refused_on_every_seed(name, fn, what):
    for message in failures_on_every_seed(name, fn):
        assert what in message and "work on a copy" in message, message


def clip_or_give_back(grads, max_norm):
    total = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
    if total <= max_norm:
        return grads, total  # the caller's own arrays, not new ones
    return [g * (max_norm / (total + 1e-6)) for g in grads], total


def test_gradients_given_back_unclipped_are_refused_as_shared_memory():
    """The text asks for new arrays: the same values, but the caller's arrays, fail once every value is right."""
    for message in failures_on_every_seed("clip_grad_norm", clip_or_give_back):
        assert "shares memory with the input grads[" in message and "small gradients" in message, message


# The named traps of the run around the model ------------------------------------------------------------------


def test_the_named_traps_of_merge_pair_are_there():
    ids, pair, new_id = labelled("merge_pair", "overlapping").args
    assert len(ids) == 3 and pair[0] == pair[1] == ids[0] == ids[1] == ids[2] and new_id >= 256
    ids, pair, _ = labelled("merge_pair", "reversed").args
    adjacent = set(zip(ids, ids[1:]))
    assert pair[::-1] in adjacent and tuple(pair) not in adjacent
    ids, pair, _ = labelled("merge_pair", "at the end").args
    assert tuple(ids[-2:]) == tuple(pair)
    assert labelled("merge_pair", "empty").args[0] == [] and len(labelled("merge_pair", "one id").args[0]) == 1
    assert labelled("merge_pair", "one id").args[0][0] == labelled("merge_pair", "one id").args[1][0]


def test_the_named_traps_of_warmup_cosine_are_there():
    """Step 0, the warm-up's last step and the next, the end and beyond, no warm-up, final left out; final above 0
    elsewhere, and learning rates about 1e6 times the comparison's absolute tolerance (1e-9)."""
    cases = CHECKS["warmup_cosine"].named_cases(0)
    where = {case.label: (case.args[0], case.kwargs) for case in cases}
    steps = {label.split(":")[0]: int(step) - int(kw["warmup_steps"]) for label, (step, kw) in where.items()}
    assert steps["the last warm-up step, step = warmup_steps"] == 0
    assert steps["the first cosine step, warmup_steps + 1"] == 1
    step, run = where["the last step, step = total_steps: final"]
    assert step == run["total_steps"] and where["3 steps beyond the end: still final"][0] == step + 3
    assert where["step 0, before the first update"][0] == 0
    assert where["warmup_steps = 0, step 0: the cosine starts at the peak"][1]["warmup_steps"] == 0
    assert all(("final" in kw) == ("final left out" not in label) for label, (_, kw) in where.items())
    assert all(kw.get("final", 1) > 0 and 1e-3 <= kw["peak"] <= 1e-2 for _, kw in where.values())


def test_the_named_traps_of_clip_grad_norm_are_there():
    """Arrays each below max_norm but above it together; a norm of 2e-5 where the 1e-6 changes the factor by 5%;
    zeros; float32; an array of shape (); an empty list."""
    def norm(arrays):
        return math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in arrays))
    grads, max_norm = labelled("clip_grad_norm", "each of norm 0.9").args
    assert all(norm([g]) < max_norm for g in grads) and norm(grads) > max_norm
    grads, max_norm = labelled("clip_grad_norm", "tiny max_norm").args
    assert norm(grads) == pytest.approx(2e-5) and max_norm / norm(grads) / (max_norm / (norm(grads) + 1e-6)) > 1.04
    assert norm(labelled("clip_grad_norm", "small gradients").args[0]) < labelled("clip_grad_norm", "small").args[1]
    assert norm(labelled("clip_grad_norm", "zero").args[0]) == 0
    assert {g.dtype for g in labelled("clip_grad_norm", "float32").args[0]} == {np.dtype(np.float32)}
    assert () in [g.shape for g in labelled("clip_grad_norm", "shape ()").args[0]]
    assert labelled("clip_grad_norm", "empty list").args[0] == []


def merge_nothing(ids, pair, new_id):
    return list(ids)


def test_a_failure_of_merge_pair_shows_the_ids_themselves():
    """A few token ids are followed by hand: the input is shown as the list, not as 'list of 4'."""
    for message in failures_on_every_seed("merge_pair", merge_nothing):
        assert "on the case 'one occurrence in the middle" in message, message
        assert re.search(r"input: ids=\[\d+, \d+, \d+, \d+\], pair=\(\d+, \d+\), new_id=\d+", message), message
