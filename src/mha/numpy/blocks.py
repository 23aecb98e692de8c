"""Chapters 6 and 9 in NumPy: LayerNorm, the feed-forward network, the encoder
and decoder blocks, and stacks of them.

Import these from `mha.numpy`. They build on `mha.numpy.attention`, as
`mha.torch.blocks` does in the PyTorch face.
"""

import math

import numpy as np
from scipy.special import erf

from mha import validate
from mha.numpy.attention import (as_float_array, as_mask, attention_shape, causal_mask, multihead_attention,
                                 project)


def layer_norm(X, gamma, beta, eps=1e-5):
    """Normalise each vector over its d features, then scale and shift.

    Uses the biased variance, as torch.nn.LayerNorm does. X: (..., d),
    gamma and beta: (d,) (beta may be None).
    """
    X, gamma = as_float_array("X", X), as_float_array("gamma", gamma)
    validate.check_ndim("X", X, 1)
    validate.check_vector("gamma", gamma, X.shape[-1])
    mean = X.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((X - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1), divided by d
    out = (X - mean) / np.sqrt(var + eps) * gamma
    if beta is not None:
        beta = as_float_array("beta", beta)
        validate.check_vector("beta", beta, X.shape[-1])
        out = out + beta
    return out


def relu(x):
    return np.maximum(x, 0)


def gelu(x):
    """The exact GELU, x * Phi(x), with Phi the standard normal CDF."""
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_tanh(x):
    """GELU's tanh approximation, as nn.GELU(approximate="tanh") computes it."""
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


def feed_forward(X, W_1, b_1, W_2, b_2, activation="relu"):
    """Position-wise feed-forward: activation(X W_1 + b_1) W_2 + b_2.

    X: (..., d), W_1: (d, d_ff), W_2: (d_ff, d). Biases may be None.
    """
    validate.check_activation(activation)
    X = as_float_array("X", X)
    validate.check_ndim("X", X, 1)
    H = project("W_1", X, W_1, b_1, "X")  # (..., d_ff)
    H = ACTIVATIONS[activation](H)
    return project("W_2", H, W_2, b_2, "the hidden layer")  # (..., d)


ATTENTION_PARAMS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
BLOCK_PARAMS = ATTENTION_PARAMS + ("gamma_1", "beta_1", "W_1", "b_1", "W_2", "b_2", "gamma_2", "beta_2")
OPTIONAL_PARAMS = ("b_q", "b_k", "b_v", "b_o", "beta_1", "b_1", "b_2", "beta_2")


def check_block_params(params):
    unknown = sorted(set(params) - set(BLOCK_PARAMS))
    missing = [k for k in BLOCK_PARAMS if k not in params and k not in OPTIONAL_PARAMS]
    if unknown or missing:
        raise TypeError(
            f"encoder_block expects parameters {', '.join(BLOCK_PARAMS)} "
            f"(biases and betas may be None); unknown: {unknown}, missing: {missing}"
        )


def with_causal(mask, T):
    """`mask` (None, or already checked) and causal_mask(T): allowed only where both allow."""
    future = causal_mask(T)  # (T, T)
    return future if mask is None else mask & future


def causal_self_mask(X, n_heads, mask):
    """The self-attention mask of X with causal_mask(T) folded in: `mask` checked against the
    scores' shape (..., h, T, T) first."""
    validate.check_int("n_heads", n_heads)
    validate.check_sequence("X", X)
    return with_causal(as_mask(mask, attention_shape(X, X, n_heads)), X.shape[-2])


def encoder_block(X, n_heads, *, mask=None, causal=False, norm_first=False, eps=1e-5, activation="relu",
                  **params):
    """Multi-head self-attention and feed-forward, each with a residual and a LayerNorm.

    Post-norm (norm_first=False): X = LN_1(X + MHA(X)); X = LN_2(X + FF(X)).
    Pre-norm (norm_first=True):   X = X + MHA(LN_1(X)); X = X + FF(LN_2(X)).
    X: (..., T, d); mask broadcasts to (..., h, T, T); causal=True also applies causal_mask(T),
    as the decoder block's self-attention does. Returns out (..., T, d) and weights (..., h, T, T).
    """
    check_block_params(params)
    validate.check_activation(activation)
    validate.check_causal(causal)
    p = {k: params.get(k) for k in BLOCK_PARAMS}
    attention = {k: p[k] for k in ATTENTION_PARAMS}

    def norm_1(x):
        return layer_norm(x, p["gamma_1"], p["beta_1"], eps)

    def norm_2(x):
        return layer_norm(x, p["gamma_2"], p["beta_2"], eps)

    def ff(x):
        return feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"], activation)

    X = as_float_array("X", X)
    if causal:
        mask = causal_self_mask(X, n_heads, mask)  # (..., h, T, T) or (T, T)
    if norm_first:
        attended, weights = multihead_attention(norm_1(X), n_heads=n_heads, mask=mask, **attention)
        X = X + attended
        return X + ff(norm_2(X)), weights
    attended, weights = multihead_attention(X, n_heads=n_heads, mask=mask, **attention)
    X = norm_1(X + attended)
    return norm_2(X + ff(X)), weights


def encoder(X, layers, n_heads, *, mask=None, causal=False, norm_first=False, eps=1e-5, activation="relu"):
    """A stack of encoder blocks; `layers` is a list of parameter dicts, one per block, each
    given the same `mask` and `causal`.

    Returns out (..., T, d) and a list with each block's weights (..., h, T, T).
    """
    if len(layers) < 1:
        raise ValueError("layers must hold at least one block's parameters, got none")
    all_weights = []
    for params in layers:
        X, weights = encoder_block(X, n_heads, mask=mask, causal=causal, norm_first=norm_first,
                                   eps=eps, activation=activation, **params)
        all_weights.append(weights)
    return X, all_weights


# The decoder (chapter 9) ------------------------------------------------------------------

DECODER_BLOCK_PARAMS = tuple(f"{part}_{name}" for part in ("self", "cross") for name in ATTENTION_PARAMS) + (
    "gamma_1", "beta_1", "gamma_2", "beta_2", "gamma_3", "beta_3", "W_1", "b_1", "W_2", "b_2")


def check_decoder_params(params):
    unknown = sorted(set(params) - set(DECODER_BLOCK_PARAMS))
    optional = ("b_", "beta_", "self_b_", "cross_b_")
    missing = [k for k in DECODER_BLOCK_PARAMS if k not in params and not k.startswith(optional)]
    if unknown or missing:
        raise TypeError(
            "decoder_block expects parameters self_W_q, self_W_k, self_W_v, self_W_o (self-attention), "
            "cross_W_q, cross_W_k, cross_W_v, cross_W_o (cross-attention), gamma_1, gamma_2, gamma_3, "
            "W_1, W_2, and optionally the biases self_b_q ... cross_b_o, b_1, b_2 and beta_1, beta_2, "
            f"beta_3 (None for none); unknown: {unknown}, missing: {missing}"
        )


def decoder_inputs(X, memory, n_heads, self_mask, memory_mask, causal):
    """The decoder block's inputs, checked: X and memory as arrays, and both masks, with
    causal_mask(T) folded into self_mask when `causal`."""
    validate.check_int("n_heads", n_heads)
    X, memory = as_float_array("X", X), as_float_array("memory", memory)
    validate.check_sequence("X", X)
    validate.check_sequence("memory", memory)
    validate.check_same("X.shape[-1]", X.shape[-1], "memory.shape[-1]", memory.shape[-1],
                        "widths of X and memory")
    validate.broadcast_batch("X", X.shape[:-2], "memory", memory.shape[:-2])
    self_mask = as_mask(self_mask, attention_shape(X, X, n_heads), "self_mask")
    memory_mask = as_mask(memory_mask, attention_shape(X, memory, n_heads), "memory_mask")
    if causal:
        self_mask = with_causal(self_mask, X.shape[-2])  # allowed only if allowed by both
    return X, memory, self_mask, memory_mask


def decoder_block(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                  norm_first=False, eps=1e-5, activation="relu", **params):
    """Masked self-attention, cross-attention to `memory`, feed-forward; each with residual and LayerNorm.

    Post-norm: X = LN_1(X + SA(X)); X = LN_2(X + CA(X, memory)); X = LN_3(X + FF(X)).
    Pre-norm:  X = X + SA(LN_1(X)); X = X + CA(LN_2(X), memory); X = X + FF(LN_3(X)).
    X: (..., T, d), the target; memory: (..., T_k, d), the encoder's output (never normalised here).
    self_mask broadcasts to (..., h, T, T) and memory_mask to (..., h, T, T_k); causal=True also
    applies causal_mask(T) to the self-attention. params: self_W_q ... self_b_o, cross_W_q ...
    cross_b_o, gamma_1 ... beta_3, W_1, b_1, W_2, b_2. Returns out (..., T, d) and the pair
    (self_weights (..., h, T, T), cross_weights (..., h, T, T_k)).
    """
    check_decoder_params(params)
    validate.check_activation(activation)
    X, memory, self_mask, memory_mask = decoder_inputs(X, memory, n_heads, self_mask, memory_mask, causal)
    p = {k: params.get(k) for k in DECODER_BLOCK_PARAMS}

    def attend(part, x, context, mask):  # part is "self" or "cross"
        weights = {k: p[f"{part}_{k}"] for k in ATTENTION_PARAMS}
        return multihead_attention(x, n_heads=n_heads, context=context, mask=mask, **weights)

    def norm(i, x):
        return layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    def ff(x):
        return feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"], activation)

    if norm_first:
        attended, self_weights = attend("self", norm(1, X), None, self_mask)
        X = X + attended
        attended, cross_weights = attend("cross", norm(2, X), memory, memory_mask)
        X = X + attended
        return X + ff(norm(3, X)), (self_weights, cross_weights)
    attended, self_weights = attend("self", X, None, self_mask)
    X = norm(1, X + attended)
    attended, cross_weights = attend("cross", X, memory, memory_mask)
    X = norm(2, X + attended)
    return norm(3, X + ff(X)), (self_weights, cross_weights)


def decoder(X, memory, layers, n_heads, *, self_mask=None, memory_mask=None, causal=False,
            norm_first=False, eps=1e-5, activation="relu"):
    """A stack of decoder blocks that all read the same memory; `layers` holds one parameter dict per block.

    Returns out (..., T, d) and a list with each block's (self_weights, cross_weights).
    """
    if len(layers) < 1:
        raise ValueError("layers must hold at least one block's parameters, got none")
    all_weights = []
    for params in layers:
        X, weights = decoder_block(X, memory, n_heads, self_mask=self_mask, memory_mask=memory_mask,
                                   causal=causal, norm_first=norm_first, eps=eps,
                                   activation=activation, **params)
        all_weights.append(weights)
    return X, all_weights
