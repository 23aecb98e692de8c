"""The traps of chapters 1 to 6 (issue #25, point 4): every wrong solution of the issue, and more, fails
on a fixed named case, on every seed (0..9), with the hint that fits. The named cases that hold the traps, and
inputs written in place: tests/test_checks_cases_ch01_06.py; the right solutions and what each exercise may
call: tests/test_checks_routes_ch01_06.py."""

import math

import numpy as np
import pytest

from learners import failures_on_every_seed
from solutions_ch01_06 import encoder_block_with, head_with, rows_softmax, softmax

import mha.numpy as mnp


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
