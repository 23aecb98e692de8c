"""The traps of chapters 1 to 6 (issue #25, point 4): every wrong solution of the issue, and more, fails
on a fixed named case, on every seed (0..9), with the hint that fits; an input written in place is
refused; a right solution written from scratch passes on every seed; and what each exercise may not
call (`forbids`, `packages`) agrees with its text, so that a student edition of mha without those
functions refuses the library's routes and keeps the permitted functions working."""

import math
import re

import numpy as np
import pytest
from scipy.special import erf

from learners import SEEDS, failures_on_every_seed, run, student_edition

import mha.numpy as mnp
from mha.checks.registry import CHECKS

CHAPTERS_1_TO_6 = ["softmax", "self_attention", "symmetric_attention", "scaled_dot_product_attention",
                   "head_attention", "multihead_attention_loop", "split_heads", "merge_heads", "causal_mask",
                   "padding_mask", "multihead_attention", "layer_norm", "feed_forward", "encoder_block"]


def rows_softmax(scores, allowed=True):
    """Softmax over the last axis where `allowed` (broadcasting to scores) is True; an empty row gets zeros."""
    allowed = np.broadcast_to(allowed, scores.shape)
    kept = np.where(allowed, scores, -np.inf)
    top = kept.max(axis=-1, keepdims=True)
    e = np.exp(kept - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax(x, axis=-1):
    top = x.max(axis=axis, keepdims=True)
    return np.exp(x - (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))))


def self_attention(X, exclude_self=False):
    T = X.shape[-2]
    w = rows_softmax(X @ np.swapaxes(X, -1, -2) / math.sqrt(X.shape[-1]), ~np.eye(T, dtype=bool) | (not exclude_self))
    return w @ X, w


def symmetric_attention(X, W):
    E = X @ W  # (..., T, d_embed)
    w = rows_softmax(E @ np.swapaxes(E, -1, -2) / math.sqrt(W.shape[1]))
    return w @ X, w


def scaled_dot_product_attention(Q, K, V, mask=None):
    w = rows_softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), True if mask is None else mask)
    w = w.astype(np.result_type(Q, K, V))
    return w @ V, w


def head_attention(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    source = X if context is None else context
    return scaled_dot_product_attention(X @ W_q, source @ W_k, source if W_v is None else source @ W_v, mask)


def multihead_attention_loop(X, heads, W_o, *, context=None, mask=None):
    source = X if context is None else context
    grid = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
    mask = None if mask is None else np.broadcast_to(mask, grid)
    results = [head_attention(X, *head, context=context, mask=None if mask is None else mask[..., i, :, :])
               for i, head in enumerate(heads)]
    return np.concatenate([out for out, _ in results], axis=-1) @ W_o, np.stack([w for _, w in results], axis=-3)


def split_heads(X, n_heads):
    return np.stack(np.split(X, n_heads, axis=-1), axis=-3)


def merge_heads(X):
    return np.concatenate(list(np.moveaxis(X, -3, 0)), axis=-1)


def causal_mask(T):
    return np.arange(T) <= np.arange(T)[:, None]


def padding_mask(lengths, T):
    return (np.arange(T) < np.asarray(lengths)[:, None])[:, None, None, :]


def multihead_attention(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None, b_q=None, b_k=None, b_v=None,
                        b_o=None):
    source = X if context is None else context

    def heads(A, W, b):  # (..., T, d) -> (..., h, T, d_head)
        A = A @ W if b is None else A @ W + b
        return np.swapaxes(A.reshape(*A.shape[:-1], n_heads, -1), -3, -2)
    out, w = scaled_dot_product_attention(heads(X, W_q, b_q), heads(source, W_k, b_k), heads(source, W_v, b_v), mask)
    out = np.swapaxes(out, -3, -2)
    out = out.reshape(*out.shape[:-2], -1) @ W_o
    return (out if b_o is None else out + b_o), w


def layer_norm(X, gamma, beta, eps=1e-5):
    d = X.shape[-1]
    deviation = X - X.sum(axis=-1, keepdims=True) / d
    out = deviation / np.sqrt((deviation * deviation).sum(axis=-1, keepdims=True) / d + eps) * gamma
    return out if beta is None else out + beta


def feed_forward(X, W_1, b_1, W_2, b_2, activation="relu"):
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    H = X @ W_1 if b_1 is None else X @ W_1 + b_1
    H = np.where(H > 0, H, 0) if activation == "relu" else H * 0.5 * (1 + erf(H / math.sqrt(2)))
    return H @ W_2 if b_2 is None else H @ W_2 + b_2


def encoder_block(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    p = params.get

    def attend(x):
        return multihead_attention(x, p("W_q"), p("W_k"), p("W_v"), p("W_o"), n_heads, mask=mask, b_q=p("b_q"),
                                   b_k=p("b_k"), b_v=p("b_v"), b_o=p("b_o"))

    def ff(x):
        return feed_forward(x, p("W_1"), p("b_1"), p("W_2"), p("b_2"), activation)

    def norm(x, i):
        return layer_norm(x, p(f"gamma_{i}"), p(f"beta_{i}"), eps)
    if norm_first:
        attended, w = attend(norm(X, 1))
        X = X + attended
        return X + ff(norm(X, 2)), w
    attended, w = attend(X)
    X = norm(X + attended, 1)
    return norm(X + ff(X), 2), w


FROM_SCRATCH = {f.__name__: f for f in (
    softmax, self_attention, symmetric_attention, scaled_dot_product_attention, head_attention,
    multihead_attention_loop, split_heads, merge_heads, causal_mask, padding_mask, multihead_attention,
    layer_norm, feed_forward, encoder_block)}


def test_every_check_of_chapters_1_to_6_has_a_solution_from_scratch_here():
    assert sorted(FROM_SCRATCH) == sorted(CHAPTERS_1_TO_6)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ in
            {f"mha.checks.ch0{n}" for n in range(1, 7)}} == set(CHAPTERS_1_TO_6)


@pytest.mark.parametrize("name", CHAPTERS_1_TO_6)
def test_a_right_solution_from_scratch_passes_on_every_seed(name):
    for seed in SEEDS:
        assert run(name, FROM_SCRATCH[name], seed).startswith(f"check_{name}: all "), seed


# Wrong solutions, as learners write them -------------------------------------------------------------


def largest_finite(a):
    """The largest finite entry of `a` (0 if none)."""
    finite = a[np.isfinite(a)]
    return finite.max() if finite.size else 0


def softmax_no_shift(scores, allowed=True):
    """A learner's softmax that gives a row with nothing to attend to zeros, but subtracts no maximum."""
    allowed = np.broadcast_to(allowed, scores.shape)
    e = np.exp(np.where(allowed, scores, -np.inf))
    return np.where(allowed.any(axis=-1, keepdims=True), e / e.sum(axis=-1, keepdims=True), 0)


def softmax_global_shift(scores, allowed=True):
    """A learner's softmax that subtracts the maximum of ALL the scores, and divides without a guard."""
    allowed = np.broadcast_to(allowed, scores.shape)
    kept = np.where(allowed, scores, -np.inf)
    e = np.exp(kept - largest_finite(kept))
    return np.where(allowed.any(axis=-1, keepdims=True), e / e.sum(axis=-1, keepdims=True), 0)


def softmax_lse_without_max(x, axis=-1):
    return np.exp(x - np.log(np.exp(x).sum(axis=axis, keepdims=True)))


def softmax_lse_global_max(x, axis=-1):
    top = x.max()
    return np.exp(x - (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))))


def softmax_negative_axis_as_last(x, axis=-1):
    return softmax(x, -1 if axis < 0 else axis)


def self_attention_without_shift(X, exclude_self=False):
    allowed = ~np.eye(X.shape[-2], dtype=bool) | (not exclude_self)
    w = softmax_no_shift(X @ np.swapaxes(X, -1, -2) / math.sqrt(X.shape[-1]), allowed)
    return w @ X, w


def self_attention_global_shift(X, exclude_self=False):
    allowed = ~np.eye(X.shape[-2], dtype=bool) | (not exclude_self)
    w = softmax_global_shift(X @ np.swapaxes(X, -1, -2) / math.sqrt(X.shape[-1]), allowed)
    return w @ X, w


def symmetric_without_shift(X, W):
    E = X @ W
    w = softmax_no_shift(E @ np.swapaxes(E, -1, -2) / math.sqrt(W.shape[1]))
    return w @ X, w


def symmetric_global_shift(X, W):
    E = X @ W
    w = softmax_global_shift(E @ np.swapaxes(E, -1, -2) / math.sqrt(W.shape[1]))
    return w @ X, w


def sdpa_with(softmax_rows):
    def sdpa(Q, K, V, mask=None):
        w = softmax_rows(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), True if mask is None else mask)
        return w @ V, w
    sdpa.__name__ = f"sdpa_{softmax_rows.__name__}"
    return sdpa


def sdpa_mask_rows_not_broadcast(Q, K, V, mask=None):
    """One query at a time, taking row t of the mask as it is: fine for (T_q, T_k) masks only."""
    rows = [rows_softmax(Q[..., t:t + 1, :] @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]),
                         True if mask is None else mask[..., t:t + 1, :]) for t in range(Q.shape[-2])]
    w = np.concatenate(rows, axis=-2)
    return w @ V, w


def head_with(sdpa):
    def head(X, W_q, W_k, W_v=None, *, context=None, mask=None):
        source = X if context is None else context
        return sdpa(X @ W_q, source @ W_k, source if W_v is None else source @ W_v, mask)
    head.__name__ = f"head_{sdpa.__name__}"
    return head


def loop_mask_i_unless_2_d(X, heads, W_o, *, context=None, mask=None):
    """mask[i] for head i: right for (h, T_q, T_k) masks, and a 2-D mask is kept whole; a (B, 1, 1, T_k)
    mask then gives head i the keys of sequence i."""
    results = [mnp.head_attention(X, *head, context=context, mask=None if mask is None else
                                  (mask if np.ndim(mask) == 2 else mask[i])) for i, head in enumerate(heads)]
    return np.concatenate([o for o, _ in results], axis=-1) @ W_o, np.stack([w for _, w in results], axis=-3)


def loop_global_shift(X, heads, W_o, *, context=None, mask=None):
    full = None if mask is None else np.broadcast_to(
        mask, (*np.broadcast_shapes(X.shape[:-2], (X if context is None else context).shape[:-2]),
               len(heads), X.shape[-2], (X if context is None else context).shape[-2]))
    own_head = head_with(sdpa_with(softmax_global_shift))
    results = [own_head(X, *head, context=context, mask=None if full is None else full[..., i, :, :])
               for i, head in enumerate(heads)]
    return np.concatenate([o for o, _ in results], axis=-1) @ W_o, np.stack([w for _, w in results], axis=-3)


def padding_mask_of_an_array_only(lengths, T):
    return (np.arange(T) < lengths[:, None])[:, None, None, :]  # a list has no [:, None]


def multihead_with(softmax_rows):
    def mha(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None, b_q=None, b_k=None, b_v=None, b_o=None):
        source = X if context is None else context

        def heads(A, W, b):
            A = A @ W if b is None else A @ W + b
            return np.swapaxes(A.reshape(*A.shape[:-1], n_heads, -1), -3, -2)
        Q, K, V = heads(X, W_q, b_q), heads(source, W_k, b_k), heads(source, W_v, b_v)
        w = softmax_rows(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), True if mask is None else mask)
        out = np.swapaxes(w @ V, -3, -2)
        out = out.reshape(*out.shape[:-2], -1) @ W_o
        return (out if b_o is None else out + b_o), w
    mha.__name__ = f"multihead_{softmax_rows.__name__}"
    return mha


def softmax_global_shift_guarded(scores, allowed=True):
    """The chapter's own guard against rows that sum to 0, with the maximum of ALL the scores subtracted."""
    kept = np.where(np.broadcast_to(allowed, scores.shape), scores, -np.inf)
    e = np.exp(kept - largest_finite(kept))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def layer_norm_one_pass_variance(X, gamma, beta, eps=1e-5):
    d = X.shape[-1]
    mean = X.sum(axis=-1, keepdims=True) / d
    variance = (X * X).sum(axis=-1, keepdims=True) / d - mean * mean
    out = (X - mean) / np.sqrt(variance + eps) * gamma
    return out if beta is None else out + beta


def encoder_block_with(attention):
    def block(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
        p = params.get
        weights = {k: p(k) for k in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")}

        def norm(x, i):
            return mnp.layer_norm(x, p(f"gamma_{i}"), p(f"beta_{i}"), eps)

        def ff(x):
            return mnp.feed_forward(x, p("W_1"), p("b_1"), p("W_2"), p("b_2"), activation)
        if norm_first:
            attended, w = attention(norm(X, 1), n_heads=n_heads, mask=mask, **weights)
            X = X + attended
            return X + ff(norm(X, 2)), w
        attended, w = attention(X, n_heads=n_heads, mask=mask, **weights)
        X = norm(X + attended, 1)
        return norm(X + ff(X), 2), w
    block.__name__ = f"encoder_block_{attention.__name__}"
    return block


# (check, wrong solution, words of the hint it must get or None, the fixed named case it fails on)
TRAPPED = [
    ("softmax", softmax_lse_without_max, "the log-sum-exp overflows", "large logits"),
    ("softmax", softmax_lse_global_max, "not of the whole array", "large logits"),
    ("softmax", softmax_negative_axis_as_last, "a negative axis counts from the end", "axis=-2 of a 4-D array"),
    ("self_attention", self_attention_without_shift, "exp overflows on scores above 709", "scores above 709"),
    ("self_attention", self_attention_global_shift, "not the maximum of all the scores", "scores above 709"),
    ("symmetric_attention", symmetric_without_shift, "exp overflows on scores above 709", "scores above 709"),
    ("symmetric_attention", symmetric_global_shift, "not the maximum of all the scores", "scores above 709"),
    ("scaled_dot_product_attention", sdpa_with(softmax_no_shift), "exp overflows on scores above 709",
     "scores above 709"),
    ("scaled_dot_product_attention", sdpa_with(softmax_global_shift), "not the maximum of all the scores",
     "scores above 709"),
    ("scaled_dot_product_attention", sdpa_mask_rows_not_broadcast, None, "a mask of keys (B, 1, T_k)"),
    ("head_attention", head_with(sdpa_with(softmax_no_shift)), "exp overflows on scores above 709",
     "scores above 709"),
    ("head_attention", head_with(sdpa_with(softmax_global_shift)), "not the maximum of all the scores",
     "scores above 709"),
    ("head_attention", head_with(sdpa_mask_rows_not_broadcast), None, "a mask of keys (B, 1, T_k)"),
    ("multihead_attention_loop", loop_mask_i_unless_2_d, "a (B, 1, 1, T_k) mask (mask[i] would be sequence i's)",
     "a padding mask with a batch axis"),
    ("multihead_attention_loop", loop_global_shift, "not the maximum of all the scores", "scores above 709"),
    ("padding_mask", padding_mask_of_an_array_only, None, "lengths in a Python list"),
    ("multihead_attention", multihead_with(softmax_no_shift), "exp overflows on scores above 709",
     "scores above 709"),
    ("multihead_attention", multihead_with(softmax_global_shift), "underflows to 0 / 0", "scores above 709"),
    ("multihead_attention", multihead_with(softmax_global_shift_guarded), "underflows to all-zero weights",
     "scores above 709"),
    ("layer_norm", layer_norm_one_pass_variance, "not as mean(x^2) - mean^2", "a large mean (1e4)"),
    ("encoder_block", encoder_block_with(multihead_with(softmax_no_shift)), "softmax overflows on scores above 709",
     "attention scores above 709"),
    ("encoder_block", encoder_block_with(multihead_with(softmax_global_shift)), "not the maximum of all the scores",
     "attention scores above 709"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    for message in failures_on_every_seed(name, fn):
        assert f"on the case '{case}" in message, message
        if hint:
            assert "hint: " in message and hint in message.split("hint: ")[1], message
        else:
            assert message.startswith(f"{name} raised "), message  # a crash: the case's label says what to do


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


# What each exercise may not call, and may ------------------------------------------------------------

# The library functions that each exercise's text permits (the rest of `may_use` is NumPy or SciPy).
PERMITTED = {"self_attention": {"softmax", "masked_softmax"}, "symmetric_attention": {"softmax"},
             "scaled_dot_product_attention": {"masked_softmax"}, "head_attention": {"masked_softmax"},
             "multihead_attention_loop": {"head_attention"},
             "encoder_block": {"multihead_attention", "layer_norm", "feed_forward"}}


@pytest.mark.parametrize("name", CHAPTERS_1_TO_6)
def test_forbids_names_library_functions_and_never_what_the_text_permits(name):
    check = CHECKS[name]
    assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
    for allowed in PERMITTED.get(name, ()):
        assert f"mnp.{allowed}" in check.may_use and allowed not in check.forbids, allowed
    assert "torch" not in check.packages
    assert set(check.packages) == ({"scipy"} if name in ("feed_forward", "encoder_block") else set())


@pytest.mark.parametrize("name,routes", [
    ("softmax", {"log_softmax", "masked_softmax", "masked_softmax_", "cross_entropy"}),
    ("self_attention", {"scaled_dot_product_attention", "head_attention", "symmetric_attention"}),
    ("symmetric_attention", {"self_attention", "head_attention"}),
    ("scaled_dot_product_attention", {"head_attention", "chunked_attention", "attend_with_cache"}),
    ("head_attention", {"scaled_dot_product_attention", "multihead_attention"}),
    ("multihead_attention_loop", {"multihead_attention", "grouped_query_attention"}),
    ("split_heads", {"heads_from_fused"}),
    ("causal_mask", {"causal_mask_after"}),
    ("multihead_attention", {"split_heads", "merge_heads", "scaled_dot_product_attention", "softmax"}),
    ("layer_norm", {"decoder_only_transformer"}),
    ("feed_forward", {"relu", "gelu", "gelu_tanh"}),
    ("encoder_block", {"encoder", "decoder_block"}),
])
def test_the_library_routes_of_the_issue_are_forbidden(name, routes):
    assert routes <= set(CHECKS[name].forbids)


def softmax_by_log_softmax(x, axis=-1):
    return np.exp(mnp.log_softmax(x, axis))


def softmax_by_masked_softmax(x, axis=-1):
    return np.moveaxis(mnp.masked_softmax(np.moveaxis(x, axis, -1)), -1, axis)


def self_attention_by_sdpa(X, exclude_self=False):
    return mnp.scaled_dot_product_attention(X, X, X, ~np.eye(X.shape[-2], dtype=bool) if exclude_self else None)


def self_attention_by_head(X, exclude_self=False):
    eye = np.eye(X.shape[-1], dtype=X.dtype)
    return mnp.head_attention(X, eye, eye, mask=~np.eye(X.shape[-2], dtype=bool) if exclude_self else None)


def layer_norm_by_torch(X, gamma, beta, eps=1e-5):
    import torch
    out = torch.nn.functional.layer_norm(torch.from_numpy(X), X.shape[-1:], torch.from_numpy(gamma),
                                         None if beta is None else torch.from_numpy(beta), eps)
    return out.numpy()


def feed_forward_by_library_activations(X, W_1, b_1, W_2, b_2, activation="relu"):
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    H = X @ W_1 if b_1 is None else X @ W_1 + b_1
    H = mnp.gelu(H) if activation == "gelu" else mnp.relu(H)
    return H @ W_2 if b_2 is None else H @ W_2 + b_2


def encoder_block_by_encoder(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    out, weights = mnp.encoder(X, [params], n_heads, mask=mask, norm_first=norm_first, eps=eps, activation=activation)
    return out, weights[0]


def causal_mask_by_causal_mask_after(T):
    return mnp.causal_mask_after(T, 0)


ROUTES = [("softmax", softmax_by_log_softmax), ("softmax", softmax_by_masked_softmax),
          ("self_attention", self_attention_by_sdpa), ("self_attention", self_attention_by_head),
          ("layer_norm", layer_norm_by_torch), ("feed_forward", feed_forward_by_library_activations),
          ("encoder_block", encoder_block_by_encoder), ("causal_mask", causal_mask_by_causal_mask_after)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[fn.__name__ for _, fn in ROUTES])
def test_a_library_route_is_refused_in_the_notebook_and_fails_in_the_student_edition(name, route, monkeypatch):
    """In the learner's kernel the route is refused, naming the library function it calls (torch aside: the
    notebook's kernel has it, the grader's worker does not); in the student edition, it fails."""
    if route is not layer_norm_by_torch:
        for message in failures_on_every_seed(name, route, seeds=(0, 1)):
            assert re.search(rf"^{name} calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route):
            assert "this is the exercise" in message or "ModuleNotFoundError: import of torch" in message, message


# Solutions that use what the text permits, as the book's do: they pass in the student edition.


def self_attention_by_masked_softmax(X, exclude_self=False):
    scores = X @ np.swapaxes(X, -1, -2) / math.sqrt(X.shape[-1])
    w = mnp.masked_softmax(scores, ~np.eye(X.shape[-2], dtype=bool) if exclude_self else None)
    return w @ X, w


def symmetric_by_einsum_and_softmax(X, W):
    E = np.einsum("...td,de->...te", X, W)
    w = mnp.softmax(np.einsum("...ie,...je->...ij", E, E) / math.sqrt(W.shape[1]))
    return np.einsum("...ij,...jd->...id", w, X), w


def sdpa_by_masked_softmax(Q, K, V, mask=None):
    w = mnp.masked_softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), mask).astype(np.result_type(Q, K, V))
    return w @ V, w


def loop_by_head_attention(X, heads, W_o, *, context=None, mask=None):
    source = X if context is None else context
    grid = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
    mask = None if mask is None else np.broadcast_to(mask, grid)
    results = [mnp.head_attention(X, *head, context=context, mask=None if mask is None else mask[..., i, :, :])
               for i, head in enumerate(heads)]
    return np.concatenate([o for o, _ in results], axis=-1) @ W_o, np.stack([w for _, w in results], axis=-3)


PERMITTED_ROUTES = [("self_attention", self_attention_by_masked_softmax),
                    ("symmetric_attention", symmetric_by_einsum_and_softmax),
                    ("scaled_dot_product_attention", sdpa_by_masked_softmax),
                    ("head_attention", head_with(sdpa_by_masked_softmax)),
                    ("multihead_attention_loop", loop_by_head_attention),
                    ("encoder_block", encoder_block_with(mnp.multihead_attention))]


@pytest.mark.parametrize("name,solution", PERMITTED_ROUTES, ids=[n for n, _ in PERMITTED_ROUTES])
def test_a_solution_that_calls_only_what_the_text_permits_passes_in_the_student_edition(name, solution, monkeypatch):
    assert set(PERMITTED) == {n for n, _ in PERMITTED_ROUTES}
    with student_edition(name, monkeypatch):
        for seed in SEEDS:
            run(name, solution, seed)
