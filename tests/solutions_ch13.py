"""Right solutions of chapter 13's exercises written from scratch, for the tests of its checks
(tests/test_checks_ch13.py, and the gathering of right solutions in tests/learners.py): NumPy only, float32
kept float32, sharing no code with the library."""

import numpy as np

CHAPTER_13 = ["rms_norm", "swiglu", "soft_cap", "sliding_window_mask", "rms_norm_per_head", "ntk_frequencies"]


def rms_norm(X, weight, eps=1e-6, *, unit_offset=False):
    X = np.asarray(X)
    mean_square = np.einsum("...d,...d->...", X, X)[..., None] / X.shape[-1]  # (..., 1)
    scale = 1 + weight if unit_offset else weight
    return X / np.sqrt(mean_square + eps) * scale


def swiglu(X, W_gate, W_up, W_down):
    gate, up = X @ W_gate, X @ W_up  # (..., d_ff) each
    silu = gate * np.exp(-np.logaddexp(0, -gate))  # x * sigmoid(x), with sigmoid = e^-log(1 + e^-x)
    return (silu * up) @ W_down


def soft_cap(x, cap):
    return cap * np.tanh(np.asarray(x) / cap)


def sliding_window_mask(T, window):
    distance = np.subtract.outer(np.arange(T), np.arange(T))  # (T, T): query position - key position
    return (distance >= 0) & (distance < window)


def rms_norm_per_head(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    x = np.asarray(x)
    d_head = x.shape[-1] // n_heads
    heads = np.stack([x[..., i * d_head:(i + 1) * d_head] for i in range(n_heads)], axis=-3)  # (..., h, T, d_head)
    mean_square = np.einsum("...d,...d->...", heads, heads)[..., None] / d_head  # (..., h, T, 1)
    return heads / np.sqrt(mean_square + eps) * (1 + weight if unit_offset else weight)


def ntk_frequencies(d_head, base, factor, seq_len, original_max):
    ratio = 1 + factor * max(seq_len - original_max, 0) / original_max  # 1 up to original_max, then linear
    log_base = np.log(base) + d_head / (d_head - 2) * np.log(ratio)  # log of the grown base
    return np.exp(-log_base * np.arange(d_head // 2) * 2 / d_head)  # (d_head / 2,)


FROM_SCRATCH = {f.__name__: f for f in (rms_norm, swiglu, soft_cap, sliding_window_mask, rms_norm_per_head,
                                        ntk_frequencies)}
