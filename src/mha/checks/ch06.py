"""Chapter 6, the encoder block: the checks of `layer_norm`, `feed_forward` and
`encoder_block`, their cases and their catalogued mistakes."""

import math

import numpy as np

import mha.numpy as mn
from mha.checks.inputs import attention_params, rng, weights
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake

# layer norm ---------------------------------------------------------------------------


@cases_for("layer_norm")
def layer_norm_cases():
    """A batch, one vector, and a large eps; the inputs are far from mean 0 and variance 1."""
    r = rng()
    X = 2 + 3 * r.standard_normal((2, 4, 6))
    gamma, beta = 1 + 0.5 * r.standard_normal(6), r.standard_normal(6)
    return [
        Case("a batch", (X, gamma, beta)),
        Case("one vector", (X[0, 0], gamma, beta)),
        Case("a large eps", (X[0], gamma, beta), {"eps": 0.5}),
    ]


@mistake("layer_norm", "use the biased variance (divide by d, not d - 1), as torch.nn.LayerNorm does")
def layer_norm_unbiased(X, gamma, beta, eps=1e-5):
    mean = X.mean(-1, keepdims=True)
    return (X - mean) / np.sqrt(X.var(-1, ddof=1, keepdims=True) + eps) * gamma + beta


@mistake("layer_norm", "eps goes inside the square root: sqrt(var + eps), not sqrt(var) + eps")
def layer_norm_eps_outside(X, gamma, beta, eps=1e-5):
    mean = X.mean(-1, keepdims=True)
    return (X - mean) / (X.std(-1, keepdims=True) + eps) * gamma + beta


@mistake("layer_norm", "LayerNorm normalises each vector over its features (the last axis), "
         "not each feature over the batch as BatchNorm does")
def layer_norm_batch_axis(X, gamma, beta, eps=1e-5):
    axes = tuple(range(X.ndim - 1)) or (0,)
    mean = X.mean(axes, keepdims=True)
    return (X - mean) / np.sqrt(X.var(axes, keepdims=True) + eps) * gamma + beta


@mistake("layer_norm", "scale by gamma and shift by beta after normalising")
def layer_norm_no_affine(X, gamma, beta, eps=1e-5):
    return mn.layer_norm(X, np.ones_like(gamma), np.zeros_like(gamma), eps)


check_layer_norm = make_check("layer_norm")

# feed-forward -------------------------------------------------------------------------


@cases_for("feed_forward")
def feed_forward_cases():
    """The same weights with ReLU and with GELU."""
    r = rng()
    X = r.standard_normal((2, 3, 4))
    params = (weights(r, 4, 8), r.standard_normal(8), weights(r, 8, 4), r.standard_normal(4))
    return [
        Case("relu", (X, *params)),
        Case("gelu", (X, *params), {"activation": "gelu"}),
    ]


@mistake("feed_forward", "apply the activation (ReLU) between the two linear layers")
def feed_forward_no_activation(X, W_1, b_1, W_2, b_2, activation="relu"):
    return (X @ W_1 + b_1) @ W_2 + b_2


@mistake("feed_forward", "GELU here is the exact form x * Phi(x) with the normal CDF (erf), "
         "not the tanh approximation")
def feed_forward_tanh_gelu(X, W_1, b_1, W_2, b_2, activation="relu"):
    H = X @ W_1 + b_1
    if activation == "gelu":
        H = 0.5 * H * (1 + np.tanh(math.sqrt(2 / math.pi) * (H + 0.044715 * H**3)))
    else:
        H = np.maximum(H, 0)
    return H @ W_2 + b_2


check_feed_forward = make_check("feed_forward")

# encoder block ------------------------------------------------------------------------


@cases_for("encoder_block", returns=OUT_AND_WEIGHTS)
def encoder_block_cases():
    """Post-norm with padding, and pre-norm with GELU."""
    r = rng()
    params = attention_params(r, 6)
    params.update({
        "gamma_1": 1 + 0.3 * r.standard_normal(6), "beta_1": 0.3 * r.standard_normal(6),
        "W_1": weights(r, 6, 10), "b_1": 0.3 * r.standard_normal(10),
        "W_2": weights(r, 10, 6), "b_2": 0.3 * r.standard_normal(6),
        "gamma_2": 1 + 0.3 * r.standard_normal(6), "beta_2": 0.3 * r.standard_normal(6),
    })
    X = r.standard_normal((2, 4, 6))
    return [
        Case("post-norm with padding", (X, 2), {**params, "mask": mn.padding_mask([4, 2], 4)}),
        Case("pre-norm, gelu", (X, 3), {**params, "norm_first": True, "activation": "gelu"}),
    ]


def _block(X, n_heads, params, *, mask, norm_first, eps, activation, residual=True, flip_norm=False,
           ff_activation=None):
    """An encoder block with one step changed, as the flags say."""
    p = {k: params.get(k) for k in mn.BLOCK_PARAMS}
    attention = {k: p[k] for k in mn.ATTENTION_PARAMS}

    def ff(x):
        H = x @ p["W_1"] + p["b_1"]
        H = ff_activation(H) if ff_activation else (mn.relu(H) if activation == "relu" else mn.gelu(H))
        return H @ p["W_2"] + p["b_2"]

    def ln(x, i):
        return mn.layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    r = 1.0 if residual else 0.0
    if norm_first != flip_norm:
        a, w = mn.multihead_attention(ln(X, 1), n_heads=n_heads, mask=mask, **attention)
        X = r * X + a
        return r * X + ff(ln(X, 2)), w
    a, w = mn.multihead_attention(X, n_heads=n_heads, mask=mask, **attention)
    X = ln(r * X + a, 1)
    return ln(r * X + ff(X), 2), w


@mistake("encoder_block", "add the residual: each sublayer's output is added to its input")
def block_without_residual(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  residual=False)


@mistake("encoder_block", "check where the LayerNorm goes: post-norm (norm_first=False) is "
         "LN(x + sublayer(x)); pre-norm is x + sublayer(LN(x))")
def block_norm_swapped(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  flip_norm=True)


@mistake("encoder_block", "apply the activation between the two linear layers of the feed-forward network")
def block_without_activation(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  ff_activation=lambda h: h)


check_encoder_block = make_check("encoder_block")
