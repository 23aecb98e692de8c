"""The checks of chapter 13's exercises on queries and keys, rms_norm_per_head (QK-norm) and ntk_frequencies
(dynamic NTK-aware RoPE), and rms_norm's wrong default eps: every wrong solution that a learner writes fails on a
fixed named case, on every seed, with the hint that fits; the traps are in the named cases; and the library's
routes to each answer are right but refused. (The right solutions from scratch, and what the texts forbid, are
tested with the chapter's other checks in tests/test_checks_ch13.py.)"""

import re

import numpy as np
import pytest

from learners import SEEDS, assert_trap_fails_on_its_case, failures_on_every_seed, student_edition

import mha.numpy as mnp
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer


# Wrong solutions, as learners write them ---------------------------------------------------------------


def rms_norm_with_torchs_default(X, weight, eps=1e-5, *, unit_offset=False):
    X = np.asarray(X)
    return X / np.sqrt(np.mean(X ** 2, axis=-1, keepdims=True) + eps) * (1 + weight if unit_offset else weight)


def head_norm(heads, weight, eps, unit_offset, axis=-1):
    return heads / np.sqrt(np.mean(heads ** 2, axis=axis, keepdims=True) + eps) * (1 + weight if unit_offset else weight)


def qk_norm_like_olmo2(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    """RMSNorm over the whole projection, then the split: OLMo 2's order, with the weight tiled over the heads."""
    normed = head_norm(x, np.tile(weight, n_heads), eps, unit_offset)  # (..., T, h * d_head)
    return mnp.split_heads(normed, n_heads)


def qk_norm_split_as_d_head_by_h(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    *lead, T, width = x.shape
    heads = np.moveaxis(x.reshape(*lead, T, width // n_heads, n_heads), -1, -3)  # head i: columns i, i + h, ...
    return head_norm(heads, weight, eps, unit_offset)


def qk_norm_as_in_the_hf_view(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    """transformers' q.view(B, T, h, d_head), normalised, without its .transpose(1, 2)."""
    *lead, T, width = x.shape
    return head_norm(x.reshape(*lead, T, n_heads, width // n_heads), weight, eps, unit_offset)


def qk_norm_over_positions(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    return head_norm(mnp.split_heads(x, n_heads), weight, eps, unit_offset, axis=-2)


def qk_norm_forgets_weight(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads = mnp.split_heads(x, n_heads)
    return heads / np.sqrt(np.mean(heads ** 2, axis=-1, keepdims=True) + eps)


def qk_norm_eps_after_root(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads = mnp.split_heads(x, n_heads)
    return heads / (np.sqrt(np.mean(heads ** 2, axis=-1, keepdims=True)) + eps) * (1 + weight if unit_offset else weight)


def base_for(d_head, base, factor, seq_len, original_max, power=None):
    ratio = factor * max(seq_len, original_max) / original_max - (factor - 1)
    return base * ratio ** (d_head / (d_head - 2) if power is None else power)


def ntk_always(d_head, base, factor, seq_len, original_max):
    ratio = factor * seq_len / original_max - (factor - 1)  # below 1, even negative, on a short sequence
    return 1 / (base * abs(ratio) ** (d_head / (d_head - 2))) ** (np.arange(0, d_head, 2) / d_head)


def ntk_base_times_ratio(d_head, base, factor, seq_len, original_max):
    return 1 / base_for(d_head, base, factor, seq_len, original_max, power=1) ** (np.arange(0, d_head, 2) / d_head)


def ntk_by_interpolation(d_head, base, factor, seq_len, original_max):
    ratio = factor * max(seq_len, original_max) / original_max - (factor - 1)
    return base ** (-np.arange(0, d_head, 2) / d_head) / ratio


def ntk_length_ratio(d_head, base, factor, seq_len, original_max):
    ratio = max(seq_len / original_max, 1.0)  # factor left out
    return (base * ratio ** (d_head / (d_head - 2))) ** (-np.arange(0, d_head, 2) / d_head)


def ntk_one_step_per_pair(d_head, base, factor, seq_len, original_max):
    return base_for(d_head, base, factor, seq_len, original_max) ** (-np.arange(d_head // 2) / d_head)


# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    ("rms_norm", rms_norm_with_torchs_default, "keep the signature's default, eps=1e-6",
     "a batch of vectors with a mean far from 0"),
    ("rms_norm_per_head", qk_norm_like_olmo2, "Normalising all h * d_head features at once is OLMo 2's",
     "2 heads, head 0's features 100 times head 1's"),
    ("rms_norm_per_head", qk_norm_split_as_d_head_by_h, "as split_heads cuts it", "2 heads, head 0's features"),
    ("rms_norm_per_head", qk_norm_as_in_the_hf_view, "return the heads before the positions", "2 heads, head 0's"),
    ("rms_norm_per_head", qk_norm_over_positions, "not over the positions of a head", "2 heads, head 0's"),
    ("rms_norm_per_head", qk_norm_forgets_weight, "multiply by the weight", "2 heads, head 0's"),
    ("rms_norm_per_head", qk_norm_eps_after_root, "eps goes inside the square root", "2 heads, head 0's"),
    ("ntk_frequencies", ntk_always, "up to original_max positions the frequencies are RoPE's own",
     "seq_len 1000, shorter than original_max 4096"),
    ("ntk_frequencies", ntk_base_times_ratio, "raise r to the power d_head / (d_head - 2)",
     "seq_len 4 times original_max, factor 1"),
    ("ntk_frequencies", ntk_by_interpolation, "linear position interpolation", "seq_len 4 times original_max"),
    ("ntk_frequencies", ntk_length_ratio, "seq_len / original_max leaves factor out", "factor 2, seq_len 3 times"),
    ("ntk_frequencies", ntk_one_step_per_pair, "the exponents are 0, 2 / d_head", "seq_len 1000, shorter"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    assert_trap_fails_on_its_case(name, fn, hint, case)


def test_the_wrong_default_eps_shows_on_the_case_that_leaves_eps_to_its_default():
    """Its own named case, with eps left out and a mean square of about 1e-5, tells 1e-5 from 1e-6 by far more than
    any tolerance: the hint is not left to the rounding of the first case."""
    case = next(c for c in CHECKS["rms_norm"].named_cases(0) if "eps left to its default" in c.label)
    assert "eps" not in case.kwargs and 0.3e-5 < np.mean(case.args[0] ** 2) < 3e-5
    right, wrong = expected_answer("rms_norm", case), case.call(rms_norm_with_torchs_default)
    assert np.abs(wrong / right - 1).min() > 0.1


def test_the_named_traps_are_in_the_named_cases_not_left_to_the_draw():
    cases = {name: CHECKS[name].named_cases(0) for name in ("rms_norm_per_head", "ntk_frequencies")}

    def labelled(name, words):
        return next(case for case in cases[name] if words in case.label)
    x, _, h = labelled("rms_norm_per_head", "100 times").args
    loud, quiet = np.abs(x[:, :3]).mean(), np.abs(x[:, 3:]).mean()
    assert h == 2 and loud / quiet > 30, "per head and over all heads differ only where heads differ in size"
    x, _, h = labelled("rms_norm_per_head", "all zeros").args
    per_head = x.reshape(x.shape[0], h, -1)  # (T, h, d_head)
    assert (~per_head.any(-1)).sum() == 1 and per_head.any(-1).sum() == x.shape[0] * h - 1
    assert labelled("rms_norm_per_head", "one head").args[2] == 1
    assert labelled("rms_norm_per_head", "a large eps").kwargs["eps"] >= 0.1
    assert labelled("rms_norm_per_head", "unit_offset").kwargs["unit_offset"] is True
    d_head, _, factor, seq_len, original = labelled("ntk_frequencies", "shorter than original_max").args
    assert seq_len < original
    assert labelled("ntk_frequencies", "still RoPE's own").args[3:] == (2048, 2048)
    _, _, factor, seq_len, original = labelled("ntk_frequencies", "r = 2 * 3 - 1").args
    assert factor != 1 and seq_len > original
    assert labelled("ntk_frequencies", "d_head = 4").args[0] == 4


# The library's routes to each answer -----------------------------------------------------------------------


def qk_norm_by_rms_norm(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    return mnp.rms_norm(mnp.split_heads(x, n_heads), weight, eps, unit_offset=unit_offset)


def qk_norm_by_layer_norm(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    """Each head's vector beside its negative has mean 0 and variance mean(q^2): LayerNorm then is RMSNorm."""
    heads = mnp.split_heads(x, n_heads)
    scale = 1 + weight if unit_offset else weight
    both = mnp.layer_norm(np.concatenate([heads, -heads], axis=-1), np.concatenate([scale, scale]), None, eps)
    return both[..., :heads.shape[-1]]


def ntk_by_rotary_frequencies(d_head, base, factor, seq_len, original_max):
    scaling = {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": original_max}
    return mnp.rotary_frequencies(d_head, base, scaling, seq_len=seq_len)[0]


def ntk_by_sinusoidal_frequencies(d_head, base, factor, seq_len, original_max):
    return mnp.sinusoidal_frequencies(d_head, base_for(d_head, base, factor, seq_len, original_max))


def ntk_by_the_angles_of_position_1(d_head, base, factor, seq_len, original_max):
    cos, sin = mnp.rotary_embedding(2, d_head, base_for(d_head, base, factor, seq_len, original_max))  # (2, d_head)
    return np.arctan2(sin[1, :d_head // 2], cos[1, :d_head // 2])  # each angle below pi: the frequency itself


ROUTES = [("rms_norm_per_head", qk_norm_by_rms_norm), ("rms_norm_per_head", qk_norm_by_layer_norm),
          ("ntk_frequencies", ntk_by_rotary_frequencies), ("ntk_frequencies", ntk_by_sinusoidal_frequencies),
          ("ntk_frequencies", ntk_by_the_angles_of_position_1)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[fn.__name__ for _, fn in ROUTES])
def test_a_library_route_is_right_but_refused_in_the_notebook_and_fails_in_the_student_edition(name, route,
                                                                                               monkeypatch):
    check = CHECKS[name]
    for case in check.named_cases(0):
        assert compare_result(expected_answer(name, case), case.call(route), check.returns) is None, case.label
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
        assert re.search(rf"^{name} calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
            assert "this is the exercise" in message, message


def ntk_by_the_librarys_base(d_head, base, factor, seq_len, original_max):
    from mha import rope_scaling
    scaling = {"factor": factor, "max_position_embeddings": original_max}
    return rope_scaling.dynamic_ntk_base(scaling, d_head, base, seq_len) ** (-np.arange(0, d_head, 2) / d_head)


def test_the_base_of_mha_rope_scaling_is_right_but_breaks_the_rule_of_the_text():
    """mha.rope_scaling is no face, which `forbids` could refuse: the exercise's rule does, on the learner's code."""
    for case in CHECKS["ntk_frequencies"].named_cases(0):
        assert compare_result(expected_answer("ntk_frequencies", case), case.call(ntk_by_the_librarys_base), None) is None
    for message in failures_on_every_seed("ntk_frequencies", ntk_by_the_librarys_base, seeds=SEEDS[:2]):
        assert "not with mha.rope_scaling" in message, message
        assert "uses `dynamic_ntk_base`" in message or "uses `rope_scaling`" in message, message  # the import or the call


def test_the_reference_refuses_a_weight_over_all_heads_with_a_message_that_says_where_it_belongs():
    with pytest.raises(ValueError, match=r"shape \(4,\).*rms_norm before the split"):
        mnp.rms_norm_per_head(np.ones((3, 8)), np.ones(8), 2)
