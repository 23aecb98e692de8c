"""The routes to an answer of chapters 7 to 12 (issue #25, point 4 and part of 2): a right solution written
from scratch passes on every seed (0..9); and what each exercise may not call (`forbids`, `packages`) agrees
with its text, so that a student edition of mha without those functions refuses the library's routes and
keeps the permitted functions working."""

import re

import numpy as np
import pytest

from learners import SEEDS, exercise_texts, failures_on_every_seed, run, student_edition
from solutions_ch07_12 import CHAPTERS_7_TO_12, FROM_SCRATCH, cache_step_with, decoder_block, decoder_block_with

import mha.numpy as mnp
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer


def test_every_check_of_chapters_7_to_12_has_a_solution_from_scratch_here():
    assert sorted(FROM_SCRATCH) == sorted(CHAPTERS_7_TO_12)
    modules = {f"mha.checks.ch{n:02d}" for n in range(7, 13)}
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ in modules} == set(CHAPTERS_7_TO_12)


@pytest.mark.parametrize("name", CHAPTERS_7_TO_12)
def test_a_right_solution_from_scratch_passes_on_every_seed(name):
    for seed in SEEDS:
        assert run(name, FROM_SCRATCH[name], seed).startswith(f"check_{name}: all "), seed


# What each exercise may not call, and may ------------------------------------------------------------

# The library functions that each exercise's text permits (the rest of `may_use` is NumPy).
PERMITTED = {"decoder_block": {"multihead_attention", "layer_norm", "feed_forward"},
             "attend_with_cache": {"repeat_kv", "rotary_embedding", "apply_rotary", "scaled_dot_product_attention"}}


@pytest.mark.parametrize("name", CHAPTERS_7_TO_12)
def test_forbids_names_library_functions_and_never_what_the_text_permits(name):
    check = CHECKS[name]
    assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
    for allowed in PERMITTED.get(name, ()):
        assert f"mnp.{allowed}" in check.may_use and allowed not in check.forbids, allowed
    for forbidden in check.forbids:
        assert not re.search(rf"(?<!not )(?<!without )mnp\.{forbidden}\b", check.may_use), forbidden
    assert "torch" not in check.packages
    assert set(check.packages) == ({"scipy"} if name == "decoder_block" else set())  # GELU's erf


@pytest.mark.parametrize("name,routes", [
    ("chunked_attention", {"scaled_dot_product_attention", "softmax", "masked_softmax", "head_attention",
                           "multihead_attention", "attend_with_cache", "grouped_query_attention", "log_softmax"}),
    ("decoder_block", {"decoder", "causal_mask", "causal_mask_after"}),
    ("sinusoidal_positions", {"rotary_embedding", "sinusoidal_frequencies", "sinusoidal_shift"}),
    ("causal_lm_loss", {"cross_entropy", "log_softmax", "softmax"}),
    ("repeat_kv", {"attend_with_cache", "grouped_query_attention"}),
    ("apply_rotary", {"rotate_half", "attend_with_cache", "grouped_query_attention"}),
    ("attend_with_cache", {"grouped_query_attention", "causal_mask_after", "causal_mask"}),
])
def test_the_library_routes_of_the_issue_are_forbidden(name, routes):
    assert routes <= set(CHECKS[name].forbids)


def test_apply_rotary_may_not_use_rotate_half_as_its_text_says():
    assert re.search(r"without `?rotate_half", exercise_texts(12)["apply_rotary"])
    assert "without mnp.rotate_half" in CHECKS["apply_rotary"].may_use


# The library's routes to each exercise's answer, as the issue found them ---------------------------


def repeat_kv_by_attend_with_cache(x, n_rep):
    """Each query reads only its own position (an identity mask), so the output is the repeated values."""
    h, T = x.shape[-3] * n_rep, x.shape[-2]
    q = np.zeros(x.shape[:-3] + (h, T, x.shape[-1]), dtype=x.dtype)
    return mnp.attend_with_cache(q, x, x, mask=np.eye(T, dtype=bool))[0]


def apply_rotary_by_rotate_half(x, cos, sin):
    return x * cos.astype(x.dtype) + mnp.rotate_half(x) * sin.astype(x.dtype)


def sinusoidal_by_rotary_embedding(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    cos, sin = mnp.rotary_embedding(T, d_model, base, offset)  # (T, d): column i holds angle i (i < d/2)
    table = np.empty((T, d_model))
    table[:, 0::2], table[:, 1::2] = sin[:, :d_model // 2], cos[:, :d_model // 2]
    return table.astype(dtype)


def causal_lm_loss_by_cross_entropy(logits, tokens):
    return mnp.cross_entropy(logits[..., :-1, :], tokens[..., 1:])


def decoder_block_by_decoder(X, memory, n_heads, **options):
    out, weights = mnp.decoder(X, memory, [{k: options.pop(k) for k in list(options) if k in
                                            mnp.DECODER_BLOCK_PARAMS}], n_heads, **options)
    return out, weights[0]


def causal_mask_of_the_library(T):
    return mnp.causal_mask(T)  # looked up when called: the student edition's, in grading


def chunked_by_blocks_of_queries(Q, K, V, mask=None, chunk=256):
    """mnp.scaled_dot_product_attention on `chunk` queries at a time: small blocks, the library's attention."""
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    Q = np.broadcast_to(Q, lead + Q.shape[-2:])
    full = None if mask is None else np.broadcast_to(mask, lead + (Q.shape[-2], K.shape[-2]))
    return np.concatenate([mnp.scaled_dot_product_attention(
        Q[..., lo:lo + chunk, :], K, V, None if full is None else full[..., lo:lo + chunk, :])[0]
        for lo in range(0, Q.shape[-2], chunk)], axis=-2)


def cache_step_by_grouped_query_attention(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None,
                                          rope_base=None):
    """q, k and v side by side in X, picked out again by identity projections; the cache in a KVCache."""
    h, h_kv, d = q.shape[-3], k.shape[-3], q.shape[-1]

    def merged(a):  # (..., heads, T, d) -> (..., T, heads * d)
        return np.concatenate(list(np.moveaxis(a, -3, 0)), axis=-1)
    X = np.concatenate([merged(q), merged(k), merged(v)], axis=-1)
    eye = np.eye(X.shape[-1], dtype=q.dtype)
    cache = mnp.KVCache()
    if past_keys is not None:
        cache.keys, cache.values = past_keys, past_values
    out, weights = mnp.grouped_query_attention(
        X, eye[:, :h * d], eye[:, h * d:(h + h_kv) * d], eye[:, (h + h_kv) * d:], np.eye(h * d, dtype=q.dtype), h,
        h_kv, mask=mask, causal=causal, rope_base=rope_base, cache=cache)
    return np.stack(np.split(out, h, axis=-1), axis=-3), weights, cache.keys, cache.values


ROUTES = [("repeat_kv", repeat_kv_by_attend_with_cache), ("apply_rotary", apply_rotary_by_rotate_half),
          ("sinusoidal_positions", sinusoidal_by_rotary_embedding),
          ("causal_lm_loss", causal_lm_loss_by_cross_entropy), ("decoder_block", decoder_block_by_decoder),
          ("decoder_block", decoder_block_with(mnp.multihead_attention, causal_pattern=causal_mask_of_the_library)),
          ("chunked_attention", chunked_by_blocks_of_queries),
          ("attend_with_cache", cache_step_by_grouped_query_attention)]


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


# Solutions that use what the text permits, as the book's do: they pass in the student edition.
PERMITTED_ROUTES = [("decoder_block", decoder_block), ("attend_with_cache", cache_step_with())]


@pytest.mark.parametrize("name,solution", PERMITTED_ROUTES, ids=[n for n, _ in PERMITTED_ROUTES])
def test_a_solution_that_calls_only_what_the_text_permits_passes_in_the_student_edition(name, solution, monkeypatch):
    assert set(PERMITTED) == {n for n, _ in PERMITTED_ROUTES}
    with student_edition(name, monkeypatch):
        for seed in SEEDS:
            run(name, solution, seed)
