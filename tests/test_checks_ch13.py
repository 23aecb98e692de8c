"""The checks of chapter 13 (rms_norm, swiglu, soft_cap, sliding_window_mask; rms_norm_per_head and
ntk_frequencies, whose traps are in tests/test_checks_ch13_queries_keys.py), as the traps of the earlier
chapters are tested: a right solution written from scratch passes on every seed (0..9); every wrong solution
that a learner writes fails on a fixed named case, on every seed, with the hint that fits; an input written in
place is refused; and what each exercise may not call (`forbids`) agrees with its text, so that the student
edition of mha refuses the library's routes to the answer."""

import re

import numpy as np
import pytest

from learners import (SEEDS, assert_trap_fails_on_its_case, exercise_texts, failures_on_every_seed, run,
                      student_edition)
from solutions_ch13 import CHAPTER_13, FROM_SCRATCH

import mha.numpy as mnp
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer


def test_every_check_of_chapter_13_has_a_solution_from_scratch_here():
    assert sorted(FROM_SCRATCH) == sorted(CHAPTER_13)
    assert {name for name, check in CHECKS.items()
            if check.make_cases.__module__ in ("mha.checks.ch13", "mha.checks.ch13_queries_keys")} == set(CHAPTER_13)


@pytest.mark.parametrize("name", CHAPTER_13)
def test_a_right_solution_from_scratch_passes_on_every_seed(name):
    for seed in SEEDS:
        assert run(name, FROM_SCRATCH[name], seed).startswith(f"check_{name}: all "), seed


# Wrong solutions, as learners write them ---------------------------------------------------------------


def rms_by_the_norm(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt(np.linalg.norm(X, axis=-1, keepdims=True) ** 2 + eps) * (1 + weight if unit_offset else weight)


def rms_with_the_variance(X, weight, eps=1e-6, *, unit_offset=False):
    centred = X - X.mean(-1, keepdims=True)
    return centred / np.sqrt(X.var(-1, keepdims=True) + eps) * (1 + weight if unit_offset else weight)


def rms_plus_eps(X, weight, eps=1e-6, *, unit_offset=False):
    return X / (np.sqrt(np.mean(X * X, -1, keepdims=True)) + eps) * (1 + weight if unit_offset else weight)


def rms_forgets_eps(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt(np.mean(X * X, -1, keepdims=True)) * (1 + weight if unit_offset else weight)


def rms_llama_only(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt(np.mean(X * X, -1, keepdims=True) + eps) * weight


def swiglu_activates_up(X, W_gate, W_up, W_down):
    up = X @ W_up
    return (up / (1 + np.exp(-up)) * (X @ W_gate)) @ W_down


def swiglu_with_relu(X, W_gate, W_up, W_down):
    return (np.maximum(0, X @ W_gate) * (X @ W_up)) @ W_down


def swiglu_sigmoid_by_exp(X, W_gate, W_up, W_down):
    gate = X @ W_gate
    sigmoid = np.exp(gate) / (np.exp(gate) + 1)  # inf / inf above 709
    return (gate * sigmoid * (X @ W_up)) @ W_down


def clip_at_cap(x, cap):
    return np.minimum(np.maximum(x, -cap), cap)


def tanh_then_cap(x, cap):
    return np.tanh(x) * cap


def tanh_of_sinh_and_cosh(x, cap):
    u = x / cap
    return cap * np.sinh(u) / np.cosh(u)  # inf / inf beyond |u| of about 710


def window_back_to_t_minus_window(T, window):
    t, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= t) & (t - j <= window)


def window_band_of_tri(T, window):
    return np.tri(T, T, 0, dtype=bool) & ~np.tri(T, T, -window - 1, dtype=bool)  # one diagonal too many


def window_around_the_query(T, window):
    t, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return np.abs(t - j) <= window - 1


# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    ("rms_norm", rms_by_the_norm, "not by the length of the vector", "a batch of vectors with a mean far from 0"),
    ("rms_norm", rms_with_the_variance, "does not subtract the mean", "a batch of vectors with a mean far from 0"),
    # eps = 1e-6 already shows at a relative 1e-7 in the first case: the float64 tolerance (1e-9) sees it there
    ("rms_norm", rms_plus_eps, "eps goes inside the square root", "a batch of vectors with a mean far from 0"),
    ("rms_norm", rms_forgets_eps, "without it a vector of zeros gives 0 / 0", "a batch of vectors with a mean far"),
    ("rms_norm", rms_llama_only, "the scale is 1 + weight", "unit_offset=True"),
    ("swiglu", swiglu_activates_up, "SiLU goes on the gate", "a batch, d = 4"),
    ("swiglu", swiglu_with_relu, "not ReLU", "a batch, d = 4"),
    ("swiglu", swiglu_sigmoid_by_exp, "overflows to inf / inf", "gate values of -1000, 0 and 1000"),
    ("soft_cap", clip_at_cap, "np.clip cuts hard", "scores from -200 to 200"),
    ("soft_cap", tanh_then_cap, "divide by cap inside the tanh", "scores from -200 to 200"),
    ("soft_cap", tanh_of_sinh_and_cosh, "a tanh written with exponentials", "scores of +-1e5"),
    ("sliding_window_mask", window_back_to_t_minus_window, "key t - window is one too far back", "T = 6, window 3"),
    ("sliding_window_mask", window_band_of_tri, "key t - window is one too far back", "T = 6, window 3"),
    ("sliding_window_mask", window_around_the_query, "the window looks back only",
     "T = 6, window 3"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    assert_trap_fails_on_its_case(name, fn, hint, case)


def test_the_named_traps_are_in_the_named_cases_not_left_to_the_draw():
    cases = {name: CHECKS[name].named_cases(0) for name in CHAPTER_13}

    def labelled(name, words):
        return next(case for case in cases[name] if words in case.label)
    X, _ = labelled("rms_norm", "a batch of vectors").args
    assert np.abs(X.mean(-1)).min() > 1, "a mean far from 0, where LayerNorm and RMSNorm differ"
    zeros, _ = labelled("rms_norm", "a row of zeros").args
    assert (~zeros.any(-1)).sum() == 1 and zeros.any(-1).sum() == 2
    assert labelled("rms_norm", "a large eps").kwargs["eps"] >= 0.1
    tiny = labelled("rms_norm", "the mean square is about eps")
    assert tiny.args[0].dtype == np.float32 and 0.1 < np.mean(tiny.args[0] ** 2) / 1e-6 < 10
    assert labelled("rms_norm", "unit_offset=True").kwargs["unit_offset"] is True
    X, W_gate, _, _ = labelled("swiglu", "gate values").args
    gate = X @ W_gate
    assert gate.max() > 709 and gate.min() < -709 and (gate == 0).any()
    assert labelled("swiglu", "one token").args[0].ndim == 1
    scores, cap = labelled("soft_cap", "scores of +-1e5").args
    assert np.abs(scores).max() / cap > 710 / 2  # e^(2x / cap) overflows
    scores, cap = labelled("soft_cap", "scores from -200 to 200").args
    assert (np.abs(scores) < cap).any() and (np.abs(scores) > cap).any()
    assert isinstance(labelled("soft_cap", "an integer cap").args[1], int)
    windows = [case.args for case in cases["sliding_window_mask"]]
    assert {(T, w) for T, w in windows if w == T} and {(T, w) for T, w in windows if w > T}
    assert (5, 1) in windows and (1, 3) in windows


# Inputs written in place --------------------------------------------------------------------------------


def rms_norm_into_X(X, weight, eps=1e-6, *, unit_offset=False):
    X /= np.sqrt(np.mean(X * X, -1, keepdims=True) + eps)  # into the caller's array
    X *= 1 + weight if unit_offset else weight
    return X


def soft_cap_into_x(x, cap):
    x /= cap
    np.tanh(x, out=x)
    x *= cap
    return x


IN_PLACE = [("rms_norm", rms_norm_into_X, "X"), ("soft_cap", soft_cap_into_x, "x")]


@pytest.mark.parametrize("name,fn,argument", IN_PLACE, ids=[fn.__name__ for _, fn, _ in IN_PLACE])
def test_an_input_written_in_place_is_refused_on_every_seed(name, fn, argument):
    for message in failures_on_every_seed(name, fn):
        assert f"{argument} was changed in place" in message and "work on a copy" in message, message


# What each exercise may not call, and the library's routes to its answer -----------------------------------


def test_no_exercise_of_chapter_13_asks_for_an_error():
    """No exercise text asks for a ValueError: if one ever does, its check needs a Case with raises=."""
    texts = exercise_texts(13)
    assert sorted(texts) == sorted(CHAPTER_13)
    for name, text in texts.items():
        assert not re.search(r"ValueError|TypeError|\braise", text), name


# The library functions that an exercise's text names as ruled out (the others are ruled out by "with NumPy").
RULED_OUT_BY_NAME = {"rms_norm": {"layer_norm"}, "swiglu": {"silu", "gated_feed_forward"},
                     "sliding_window_mask": {"causal_mask", "causal_mask_after"}, "rms_norm_per_head": {"rms_norm"},
                     "ntk_frequencies": {"rotary_frequencies"}}


@pytest.mark.parametrize("name", CHAPTER_13)
def test_forbids_names_library_functions_and_never_what_the_text_permits(name):
    check, text = CHECKS[name], " ".join(exercise_texts(13)[name].split())
    assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
    assert "with NumPy" in text or "NumPy" in check.may_use
    for forbidden in check.forbids:
        assert not re.search(rf"(?<!not )(?<!without )mnp\.{forbidden}\b", check.may_use), forbidden
        assert not re.search(rf"(?<!not )(?<!without )`mnp\.{forbidden}`", text), (forbidden, "the text permits it")
    for named in RULED_OUT_BY_NAME.get(name, ()):
        assert named in check.forbids and re.search(rf"without `mnp\.{named}`", text), named
    assert check.packages == () and not check.float32_promised


def rms_norm_by_layer_norm(X, weight, eps=1e-6, *, unit_offset=False):
    """The vector beside its negative has mean 0 and variance mean(x^2): LayerNorm then is RMSNorm."""
    d = X.shape[-1]
    scale = 1 + weight if unit_offset else weight
    both = mnp.layer_norm(np.concatenate([X, -X], axis=-1), np.concatenate([scale, scale]), None, eps)
    return both[..., :d]


def rms_norm_by_one_head_of_qk_norm(X, weight, eps=1e-6, *, unit_offset=False):
    """QK-norm per head with one head and one position: RMSNorm (the library's rms_norm inside)."""
    return mnp.rms_norm_per_head(X[..., None, :], weight, 1, eps, unit_offset=unit_offset)[..., 0, 0, :]


def swiglu_by_gated_feed_forward(X, W_gate, W_up, W_down):
    return mnp.gated_feed_forward(X, W_gate, W_up, W_down, activation="silu")


def swiglu_by_silu(X, W_gate, W_up, W_down):
    return (mnp.silu(X @ W_gate) * (X @ W_up)) @ W_down


def window_by_causal_mask_after(T, window):
    return mnp.causal_mask_after(T, 0, window=window)


def window_by_causal_mask(T, window):
    t, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return mnp.causal_mask(T) & (j > t - window)


def window_by_the_weights_of_grouped_attention(T, window):
    """With zero weights every score is 0: the weights are uniform over the allowed keys, and 0 elsewhere."""
    zero = np.zeros((1, 1))
    _, weights = mnp.grouped_query_attention(np.ones((T, 1)), zero, zero, zero, zero, 1, 1, causal=True,
                                             sliding_window=window)
    return weights[0] > 0  # (T, T)


def soft_cap_by_the_weights_of_attention(x, cap):
    """Two keys, 1 and 0: the scores are x and 0, capped; the log-ratio of the two weights is the capped x."""
    x = np.asarray(x)
    keys = np.array([[1.0], [0.0]], dtype=x.dtype)  # (2, 1)
    _, weights = mnp.scaled_dot_product_attention(x[..., None, None], keys, keys, scale=1.0, logit_cap=cap)
    return np.log(weights[..., 0, 0]) - np.log(weights[..., 0, 1])


def as_token_rows(x):
    """x (..., d) as the embedding table of tokens 0 .. n - 1, one row each: (tokens (1, n), table (n, d))."""
    table = np.asarray(x).reshape(-1, np.shape(x)[-1])
    return np.arange(len(table))[None, :], table


def rms_norm_by_a_model_without_layers(X, weight, eps=1e-6, *, unit_offset=False):
    """A model with no block: its final norm, then an identity output layer."""
    tokens, table = as_token_rows(X)
    norm = {"kind": "rms", "weight": weight, "eps": eps, "unit_offset": unit_offset}
    logits = mnp.transformer_lm(tokens, table, [], norm, W_out=np.eye(table.shape[1], dtype=table.dtype))
    return logits[0].reshape(np.shape(X))


def soft_cap_by_a_model_without_layers(x, cap):
    """No block, no norm, an identity output layer: the logits are x, capped."""
    x = np.asarray(x)
    tokens, table = as_token_rows(x[..., None])
    logits = mnp.transformer_lm(tokens, table, [], None, W_out=np.eye(1, dtype=table.dtype), final_logit_cap=cap)
    return logits[0].reshape(x.shape)


ROUTES = [("rms_norm", rms_norm_by_layer_norm), ("rms_norm", rms_norm_by_a_model_without_layers),
          ("rms_norm", rms_norm_by_one_head_of_qk_norm),
          ("soft_cap", soft_cap_by_a_model_without_layers), ("swiglu", swiglu_by_gated_feed_forward), ("swiglu", swiglu_by_silu),
          ("sliding_window_mask", window_by_causal_mask_after), ("sliding_window_mask", window_by_causal_mask),
          ("sliding_window_mask", window_by_the_weights_of_grouped_attention),
          ("soft_cap", soft_cap_by_the_weights_of_attention)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[fn.__name__ for _, fn in ROUTES])
def test_a_library_route_is_right_but_refused_in_the_notebook_and_fails_in_the_student_edition(name, route,
                                                                                               monkeypatch):
    """The route gives the right answer on every named case, where nothing looks; the notebook's check refuses it,
    naming the library function it calls (as the grader's verdict is), and in the student edition it fails."""
    check = CHECKS[name]
    for case in check.named_cases(0):
        assert compare_result(expected_answer(name, case), case.call(route), check.returns) is None, case.label
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
        assert re.search(rf"^{name} calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route):
            assert "this is the exercise" in message, message


@pytest.mark.parametrize("name", CHAPTER_13)
def test_a_solution_from_scratch_passes_in_the_student_edition(name, monkeypatch):
    with student_edition(name, monkeypatch):
        for seed in SEEDS[:3]:
            assert run(name, FROM_SCRATCH[name], seed).startswith(f"check_{name}: all "), seed
