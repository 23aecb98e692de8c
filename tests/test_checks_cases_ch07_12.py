"""The cases of chapters 7 to 12's checks (issue #25, point 4 and part of 2): the traps are in the fixed named
cases, not left to the draw (scores far apart, a long sequence, float32 at large positions, sizes past 2**31);
an input written in place is refused on every seed; and no exercise asks for an error."""

import re

import numpy as np
import pytest

from learners import exercise_texts, failures_on_every_seed
from solutions_ch07_12 import (ATTENTION_NAMES, CHAPTERS_7_TO_12, attention_in_chunks, cache_step_with,
                               causal_lm_loss, decoder_block)

import mha.numpy as mnp
from mha.checks.registry import CHECKS


def test_the_named_traps_are_in_the_named_cases_not_left_to_the_draw():
    cases = {name: CHECKS[name].named_cases(0) for name in CHAPTERS_7_TO_12}

    def labelled(name, words):
        return next(case for case in cases[name] if words in case.label)
    long = labelled("chunked_attention", "a long sequence")
    Q, K, V = long.args
    T_q, T_k, chunk = Q.shape[-2], K.shape[-2], long.kwargs["chunk"]
    assert min(T_q, T_k) >= 2048 and T_k % chunk and "mask" not in long.kwargs
    assert 8 * T_q * chunk * 4 <= long.peak_bytes < T_q * T_k  # 4 blocks of scores fit, T_q x T_k booleans do not
    key_mask = labelled("chunked_attention", "a mask of keys").kwargs["mask"]
    assert key_mask.shape[-2] == 1 and labelled("chunked_attention", "a mask of keys").args[0].shape[-2] > 1
    assert labelled("chunked_attention", "a mask with a batch axis").kwargs["mask"].ndim == 3
    for name, words in [("chunked_attention", "scores above 709"), ("chunked_attention", "a long sequence"),
                        ("attend_with_cache", "scores above 709")]:
        assert scores_far_apart(name, labelled(name, words)), (name, words)
    far = labelled("causal_lm_loss", "logits above 1000").args[0]
    row_max = far.max(axis=-1)
    assert far.max() > 710 and row_max.max() - row_max.min() > 800
    assert isinstance(labelled("alibi_bias", "Python list").args[2], list)
    table = labelled("sinusoidal_positions", "float32")
    assert table.kwargs["dtype"] == np.float32 and table.kwargs["offset"] >= 10**5
    rotary = labelled("apply_rotary", "float32 at positions 100000")
    assert rotary.args[0].dtype == np.float32 and rotary.args[1].dtype == np.float32
    assert np.array_equal(rotary.args[1], mnp.rotary_embedding(3, 2, 100.0, 100_000, dtype=np.float32)[0])
    step = labelled("attend_with_cache", "100000 cached positions")
    assert step.args[0].dtype == np.float32 and step.args[3].shape[-2] >= 10**5 and step.kwargs["rope_base"]
    key_padding = labelled("attend_with_cache", "a left-padding mask of keys")
    assert key_padding.kwargs["mask"].shape[-2] == 1 and key_padding.kwargs["mask"].shape[0] > 1
    first = cases["kv_cache_bytes"][0]
    total = mnp.kv_cache_bytes(*first.args, **first.kwargs)
    assert first.args[0] != 2 and int(np.float32(total)) != total and total > 2**31


def scores_far_apart(name, case):
    """True when the case's allowed attention scores reach above 709 in one row and a row's largest score is
    more than 745 below another's (exp(-745) is 0 in float64)."""
    if name == "chunked_attention":
        Q, K = case.args[0], case.args[1]
        mask = case.kwargs.get("mask", True)
    else:  # attend_with_cache, without RoPE: the new queries against every key, cached and new
        q, k, past_keys = case.args[0], case.args[1], case.args[3]
        Q, K = q, np.repeat(np.concatenate([past_keys, k], axis=-2), q.shape[-3] // k.shape[-3], axis=-3)
        T_past, T_new = past_keys.shape[-2], q.shape[-2]
        mask = case.kwargs["mask"] & (np.arange(T_past + T_new) <= T_past + np.arange(T_new)[:, None])
    scores = np.where(mask, Q @ np.swapaxes(K, -1, -2) / Q.shape[-1] ** 0.5, -np.inf)
    row_max = scores.max(axis=-1)[np.isfinite(scores.max(axis=-1))]
    return scores.max() > 709 and row_max.max() - row_max.min() > 745


# Inputs written in place --------------------------------------------------------------------------------


def chunked_scales_Q_in_place(Q, K, V, mask=None, chunk=256):
    Q /= Q.shape[-1] ** 0.5  # the scale, into the caller's array
    return attention_in_chunks(Q, K, V, mask, chunk)


def decoder_block_adds_in_place(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                                norm_first=False, eps=1e-5, activation="relu", **params):
    if norm_first:
        return decoder_block(X, memory, n_heads, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                             norm_first=True, eps=eps, activation=activation, **params)
    if causal:
        earlier = np.arange(X.shape[-2]) <= np.arange(X.shape[-2])[:, None]
        self_mask = earlier if self_mask is None else self_mask & earlier
    weights = []

    def attend(part, x, context, mask):
        out, w = mnp.multihead_attention(x, n_heads=n_heads, context=context, mask=mask,
                                         **{k: params.get(f"{part}_{k}") for k in ATTENTION_NAMES})
        weights.append(w)
        return out
    X += attend("self", X, None, self_mask)  # the residual, into the caller's array
    X = mnp.layer_norm(X, params["gamma_1"], params.get("beta_1"), eps)
    X = mnp.layer_norm(X + attend("cross", X, memory, memory_mask), params["gamma_2"], params.get("beta_2"), eps)
    ff = mnp.feed_forward(X, params["W_1"], params.get("b_1"), params["W_2"], params.get("b_2"), activation)
    return mnp.layer_norm(X + ff, params["gamma_3"], params.get("beta_3"), eps), tuple(weights)


def lm_loss_shifts_in_place(logits, tokens):
    logits -= logits.max(axis=-1, keepdims=True)  # the log-softmax's shift, into the caller's array
    return causal_lm_loss(logits, tokens)


def apply_rotary_into_x(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half].copy(), x[..., half:].copy()
    c, s = cos[..., :half].astype(x.dtype), sin[..., :half].astype(x.dtype)
    x[..., :half], x[..., half:] = a * c - b * s, b * c + a * s
    return x


def cache_step_rotates_k_in_place(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None,
                                  rope_base=None):
    if rope_base is not None:
        T_past = 0 if past_keys is None else past_keys.shape[-2]
        cos, sin = mnp.rotary_embedding(k.shape[-2], k.shape[-1], rope_base, offset=T_past,
                                        dtype=np.float64 if q.dtype == np.float64 else np.float32)
        k[...] = mnp.apply_rotary(k, cos, sin)  # the new keys, rotated where they lie
        q = mnp.apply_rotary(q, cos, sin)
    return cache_step_with()(q, k, v, past_keys, past_values, causal=causal, mask=mask)


IN_PLACE = [("chunked_attention", chunked_scales_Q_in_place, "Q"), ("decoder_block", decoder_block_adds_in_place, "X"),
            ("causal_lm_loss", lm_loss_shifts_in_place, "logits"), ("apply_rotary", apply_rotary_into_x, "x"),
            ("attend_with_cache", cache_step_rotates_k_in_place, "k")]


@pytest.mark.parametrize("name,fn,argument", IN_PLACE, ids=[fn.__name__ for _, fn, _ in IN_PLACE])
def test_an_input_written_in_place_is_refused_on_every_seed(name, fn, argument):
    for message in failures_on_every_seed(name, fn):
        assert f"{argument} was changed in place" in message and "work on a copy" in message, message


# An unknown name where the text requires an error ---------------------------------------------------


def test_no_exercise_of_chapters_7_to_12_asks_for_an_error():
    """Chapter 6's feed-forward asks for a ValueError on an unknown activation (a Case with raises=ValueError).
    The exercises of chapters 7 to 12 ask for none: if one ever does, it needs such a case."""
    texts = {name: text for chapter in range(7, 13) for name, text in exercise_texts(chapter).items()}
    assert sorted(texts) == sorted(CHAPTERS_7_TO_12)
    for name, text in texts.items():
        assert not re.search(r"ValueError|TypeError|\braise", text), name
