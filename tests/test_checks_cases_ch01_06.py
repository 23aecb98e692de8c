"""The cases of chapters 1 to 6's checks (issue #25, point 4): the traps are in the fixed named cases, not
left to the draw; an input written in place is refused, on every seed, with no unrelated hint; and the
feed-forward that chapter 6 asks to raise a ValueError on an unknown activation fails when it does not."""

import math

import numpy as np
import pytest

from learners import failures_on_every_seed
from solutions_ch01_06 import CHAPTERS_1_TO_6, encoder_block, feed_forward, rows_softmax

import mha.numpy as mnp
from mha.checks.registry import CHECKS


def test_the_named_traps_are_in_the_named_cases_not_left_to_the_draw():
    labels = {name: [case.label for case in CHECKS[name].named_cases(0)] for name in CHAPTERS_1_TO_6}
    assert {f"axis={a} of a 4-D array" for a in (-2, -3, -4)} <= set(labels["softmax"])
    for name in ("self_attention", "symmetric_attention", "scaled_dot_product_attention", "head_attention",
                 "multihead_attention_loop", "multihead_attention", "encoder_block"):
        assert any("scores above 709" in label for label in labels[name]), name
    layer_norm_trap = next(c for c in CHECKS["layer_norm"].named_cases(0) if "large mean" in c.label)
    assert abs(layer_norm_trap.args[0].mean() - 1e4) < 1 and layer_norm_trap.args[0].std() < 0.1


# Inputs written in place ---------------------------------------------------------------------------


def softmax_in_place(x, axis=-1):
    x -= x.max(axis=axis, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=axis, keepdims=True)
    return x


def sdpa_scales_Q_in_place(Q, K, V, mask=None):
    Q /= math.sqrt(Q.shape[-1])
    w = rows_softmax(Q @ np.swapaxes(K, -1, -2), True if mask is None else mask)
    return w @ V, w


def layer_norm_centres_in_place(X, gamma, beta, eps=1e-5):
    X -= X.sum(axis=-1, keepdims=True) / X.shape[-1]
    out = X / np.sqrt((X * X).sum(axis=-1, keepdims=True) / X.shape[-1] + eps) * gamma
    return out if beta is None else out + beta


def encoder_block_adds_in_place(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    if norm_first:
        return encoder_block(X, n_heads, mask=mask, norm_first=True, eps=eps, activation=activation, **params)
    attended, w = mnp.multihead_attention(X, n_heads=n_heads, mask=mask, **{
        k: params.get(k) for k in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")})
    X += attended  # the residual, into the caller's array
    X = mnp.layer_norm(X, params["gamma_1"], params.get("beta_1"), eps)
    return mnp.layer_norm(X + mnp.feed_forward(X, params["W_1"], params.get("b_1"), params["W_2"], params.get("b_2"),
                                               activation), params["gamma_2"], params.get("beta_2"), eps), w


IN_PLACE = [("softmax", softmax_in_place, "x"), ("scaled_dot_product_attention", sdpa_scales_Q_in_place, "Q"),
            ("layer_norm", layer_norm_centres_in_place, "X"), ("encoder_block", encoder_block_adds_in_place, "X")]


@pytest.mark.parametrize("name,fn,argument", IN_PLACE, ids=[fn.__name__ for _, fn, _ in IN_PLACE])
def test_an_input_written_in_place_is_refused_on_every_seed(name, fn, argument):
    for message in failures_on_every_seed(name, fn):
        assert f"{argument} was changed in place" in message and "work on a copy" in message, message


@pytest.mark.parametrize("name,fn,argument", IN_PLACE, ids=[fn.__name__ for _, fn, _ in IN_PLACE])
def test_an_input_written_in_place_gets_no_unrelated_hint(name, fn, argument):
    assert "hint:" not in failures_on_every_seed(name, fn)[0]


# An unknown name where the text requires a ValueError ----------------------------------------------


def feed_forward_any_other_name_is_relu(X, W_1, b_1, W_2, b_2, activation="relu"):
    return feed_forward(X, W_1, b_1, W_2, b_2, "gelu" if activation == "gelu" else "relu")


def test_the_library_raises_the_value_error_that_chapter_6_asks_for():
    X, W = np.ones((2, 3)), np.ones((3, 3))
    with pytest.raises(ValueError, match="activation must be"):
        mnp.feed_forward(X, W, None, W, None, activation="swish")


def test_feed_forward_that_accepts_an_unknown_activation_fails():
    for message in failures_on_every_seed("feed_forward", feed_forward_any_other_name_is_relu):
        assert "must raise ValueError" in message and "unknown activation" in message, message
