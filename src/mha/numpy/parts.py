"""The parts of today's language models beside attention, in NumPy (chapter 13).

- `rms_norm`: RMSNorm (Zhang and Sennrich, 2019), LayerNorm without the mean and the
  shift, as in Llama, Mistral, Qwen, Gemma and OLMo; `unit_offset=True` is Gemma's
  form, which stores w and scales by (1 + w).
- `gated_feed_forward`: act(X W_gate) * (X W_up), then W_down (Shazeer, 2020):
  `swiglu` with SiLU (Llama, Mistral, Qwen, OLMo), `geglu` with GELU's tanh
  approximation (Gemma).
- `soft_cap`: cap * tanh(x / cap), which keeps scores or logits inside (-cap, cap)
  smoothly (Gemma 2's attention scores and final logits).

They follow the library's conventions: row vectors (..., d), X @ W with W of shape
(d_in, d_out). Import them from `mha.numpy`.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array, project, soft_cap  # noqa: F401 (soft_cap is a part too)
from mha.numpy.blocks import gelu_tanh


def rms_norm(X, weight, eps=1e-6, *, unit_offset=False):
    """X / sqrt(mean(X^2) + eps) * weight over the last axis; with unit_offset, * (1 + weight).

    X: (..., d), weight: (d,). float64 stays float64; other inputs are computed in
    float32 and returned in their own dtype, as Llama's and Gemma's norms do.
    """
    X, weight = as_float_array("X", X), as_float_array("weight", weight)
    validate.check_ndim("X", X, 1)
    validate.check_vector("weight", weight, X.shape[-1])
    eps = validate.check_eps(eps)
    work = np.float64 if X.dtype == np.float64 else np.float32
    x = X.astype(work, copy=False)
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., d)
    scale = (1 + weight.astype(work)) if unit_offset else weight.astype(work)
    return (normed * scale).astype(X.dtype, copy=False)


def silu(x):
    """x * sigmoid(x) = x / (1 + e^(-x)); for very negative x, e^(-x) overflows to inf and the
    result is -0, as in PyTorch."""
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


GATES = {"silu": silu, "gelu_tanh": gelu_tanh}


def gated_feed_forward(X, W_gate, W_up, W_down, activation="silu"):
    """act(X W_gate) * (X W_up), then @ W_down: (..., d) -> (..., d).

    X: (..., d), W_gate and W_up: (d, d_ff), W_down: (d_ff, d); no biases.
    activation: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU, with GELU's tanh approximation; Shazeer's uses the exact GELU).
    """
    if activation not in GATES:
        raise ValueError(f'activation must be "silu" (SwiGLU) or "gelu_tanh" (GeGLU), got {activation!r}')
    X = as_float_array("X", X)
    validate.check_ndim("X", X, 1)
    gate = project("W_gate", X, W_gate, None, "X")  # (..., d_ff)
    up = project("W_up", X, W_up, None, "X")  # (..., d_ff)
    validate.check_same("W_gate", gate.shape[-1:], "W_up", up.shape[-1:], "hidden width")
    return project("W_down", GATES[activation](gate) * up, W_down, None, "the hidden layer")  # (..., d)


def swiglu(X, W_gate, W_up, W_down):
    """SwiGLU, Llama's feed-forward: silu(X W_gate) * (X W_up), then @ W_down."""
    return gated_feed_forward(X, W_gate, W_up, W_down, activation="silu")


def geglu(X, W_gate, W_up, W_down):
    """GeGLU with GELU's tanh approximation, Gemma's feed-forward."""
    return gated_feed_forward(X, W_gate, W_up, W_down, activation="gelu_tanh")
