"""Chapter 6, the encoder block: the checks of `layer_norm`, `feed_forward` and
`encoder_block`, their cases and their catalogued mistakes."""

import math

import numpy as np

from mha.checks.common import multihead_softmax_global_max, multihead_softmax_without_max
from mha.checks.inputs import (attention_params, batch, cast, causal, normal, padding, scores_far_apart, sizes,
                               weights)
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import LAYER_NORM_RULES
from mha.checks.routes import ENCODER_BLOCK_FORBIDS, FEED_FORWARD_FORBIDS, LAYER_NORM_FORBIDS, LAYERS  # noqa: F401
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for

# layer norm ---------------------------------------------------------------------------


@cases_for("layer_norm", may_use="NumPy sums (no np.mean, np.var or np.std)", forbids=LAYER_NORM_FORBIDS,
           rules=LAYER_NORM_RULES)
def layer_norm_cases(r):
    """A batch, one vector, a large eps, and vectors of mean 1e4 with a spread of 0.01 (where the variance
    as mean(x^2) - mean^2 loses its digits); the inputs are far from mean 0 and variance 1."""
    X = 2 + 3 * r.standard_normal((2, 4, 6))
    gamma, beta = 1 + 0.5 * r.standard_normal(6), r.standard_normal(6)
    return [
        Case("a batch", (X, gamma, beta)),
        Case("one vector", (X[0, 0], gamma, beta)),
        Case("a large eps", (X[0], gamma, beta), {"eps": 0.5}),
        Case("a large mean (1e4) and a small spread (0.01)", (1e4 + 0.01 * r.standard_normal((3, 6)), gamma, beta)),
    ]


@random_cases_for("layer_norm")
def layer_norm_random_cases(r):
    """A 4-D batch far from mean 0, float32 without beta, a large eps, and a single feature."""
    T, d = sizes(r, 2, 4, 6)  # float32 is left to widths of 4 and more: with 2 or 3 features the variance
    # is now and then so small that float32's rounding of x - mean shows in the normalised output

    def affine(width, dtype=np.float64):
        return 1 + normal(r, width, dtype, 0.5), normal(r, width, dtype)

    return [
        Case("random: a 4-D batch", (5 + normal(r, batch(r, 2) + (T, d), scale=3), *affine(d))),
        Case("random: float32, no beta", (normal(r, (T, d), np.float32, 2), affine(d, np.float32)[0], None)),
        Case("random: a large eps", (normal(r, (T, d)), *affine(d)), {"eps": float(r.uniform(0.1, 1))}),
        Case("random: one feature", (normal(r, (T, 1)), *affine(1))),
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
    mean = X.mean(-1, keepdims=True)
    return (X - mean) / np.sqrt(X.var(-1, keepdims=True) + eps)


@mistake("layer_norm", "compute the variance as the mean of (x - mean)^2, not as mean(x^2) - mean^2: with a "
         "large mean the two large terms cancel and the variance loses its digits")
def layer_norm_one_pass_variance(X, gamma, beta, eps=1e-5):
    mean = X.mean(-1, keepdims=True)
    var = (X * X).mean(-1, keepdims=True) - mean * mean
    out = (X - mean) / np.sqrt(var + eps) * gamma
    return out if beta is None else out + beta


check_layer_norm = make_check("layer_norm")

# feed-forward -------------------------------------------------------------------------


@cases_for("feed_forward", may_use="NumPy and scipy.special.erf or math.erf (not mnp.relu or mnp.gelu)",
           forbids=FEED_FORWARD_FORBIDS, packages=("scipy",))
def feed_forward_cases(r):
    """The same weights with ReLU and with GELU; an unknown activation name, which must raise ValueError."""
    X = r.standard_normal((2, 3, 4))
    params = (weights(r, 4, 8), r.standard_normal(8), weights(r, 8, 4), r.standard_normal(4))
    return [
        Case("relu", (X, *params)),
        Case("gelu", (X, *params), {"activation": "gelu"}),
        Case("an unknown activation name: ValueError", (X, *params), {"activation": "swish"}, raises=ValueError),
    ]


@random_cases_for("feed_forward")
def feed_forward_random_cases(r):
    """A 4-D batch with GELU, float32 without biases, and one token with d_ff narrower than d."""
    d, d_ff = sizes(r, 2, 2, 6)

    def network(d, d_ff, dtype=np.float64, bias=True):
        b_1, b_2 = (normal(r, d_ff, dtype), normal(r, d, dtype)) if bias else (None, None)
        return weights(r, d, d_ff, dtype), b_1, weights(r, d_ff, d, dtype), b_2

    return [
        Case("random: a 4-D batch, gelu", (normal(r, batch(r, 2) + (3, d)), *network(d, d_ff)),
             {"activation": "gelu"}),
        Case("random: float32, no biases", (normal(r, (2, d), np.float32), *network(d, d_ff, np.float32, False)),
             {"activation": str(r.choice(["relu", "gelu"]))}),
        Case("random: one token, d_ff < d", (normal(r, (1, d + 2)), *network(d + 2, d))),
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


def block_params(r, d, d_ff, bias=True):
    """Every parameter of mha.numpy.encoder_block; with bias=False the biases and betas are None."""
    params = attention_params(r, d, bias)
    params.update({
        "gamma_1": 1 + 0.3 * r.standard_normal(d), "beta_1": 0.3 * r.standard_normal(d),
        "W_1": weights(r, d, d_ff), "b_1": 0.3 * r.standard_normal(d_ff),
        "W_2": weights(r, d_ff, d), "b_2": 0.3 * r.standard_normal(d),
        "gamma_2": 1 + 0.3 * r.standard_normal(d), "beta_2": 0.3 * r.standard_normal(d),
    })
    if not bias:
        params.update({k: None for k in mn.OPTIONAL_PARAMS})
    return params


@cases_for("encoder_block", returns=OUT_AND_WEIGHTS,
           may_use="mnp.multihead_attention, mnp.layer_norm and mnp.feed_forward",
           forbids=ENCODER_BLOCK_FORBIDS, packages=("scipy",))
def encoder_block_cases(r):
    """Post-norm with padding, pre-norm with GELU, and attention scores above 2000 in one row and near 0 in
    another (W_q = W_k = [I I], two heads of the model's width)."""
    params = block_params(r, 6, 10)
    X = r.standard_normal((2, 4, 6))
    far = {**block_params(r, 4, 6), "W_q": np.hstack([np.eye(4)] * 2), "W_k": np.hstack([np.eye(4)] * 2),
           "W_v": weights(r, 4, 8), "b_v": 0.3 * r.standard_normal(8), "W_o": weights(r, 8, 4), "b_q": None,
           "b_k": None}
    return [
        Case("post-norm with padding", (X, 2), {**params, "mask": mn.padding_mask([4, 2], 4)}),
        Case("pre-norm, gelu", (X, 3), {**params, "norm_first": True, "activation": "gelu"}),
        Case("attention scores above 709 in one row, near 0 in another", (scores_far_apart(r, 4), 2), far),
    ]


@random_cases_for("encoder_block")
def encoder_block_random_cases(r):
    """Post-norm on a 4-D batch with a sequence of padding only, pre-norm with GELU in float32 and a
    causal mask, and T = 1 without biases and with a large eps."""
    (h, d_head), (T, d_ff), (b1, b2) = sizes(r, 2, 1, 3), sizes(r, 2, 2, 8), batch(r, 2)
    d = h * (d_head + 3)  # at least 4 features, for LayerNorm in float32 (see layer_norm_random_cases)
    return [
        Case("random: post-norm, a 4-D batch, a sequence of padding only", (normal(r, (b1, b2, T, d)), h),
             {**block_params(r, d, d_ff), "mask": padding(r, (b1, b2), T)}),
        Case("random: pre-norm, gelu, float32, causal", (normal(r, (b1, T, d), np.float32), h),
             {**cast(block_params(r, d, d_ff), np.float32), "mask": causal(T), "norm_first": True,
              "activation": "gelu"}),
        Case("random: T = 1, no biases, a large eps", (normal(r, (b1, 1, d)), h),
             {**block_params(r, d, d_ff, bias=False), "eps": 0.5, "norm_first": bool(r.integers(2))}),
    ]


def _block(X, n_heads, params, *, mask, norm_first, eps, activation, residual=True, flip_norm=False,
           ff_activation=None, attention_fn=mn.multihead_attention):
    """An encoder block with one step changed, as the flags say; `attention_fn` in place of
    mnp.multihead_attention."""
    p = {k: params.get(k) for k in mn.BLOCK_PARAMS}
    attention = {k: p[k] for k in mn.ATTENTION_PARAMS}

    def ff(x):
        H = x @ p["W_1"] + (0 if p["b_1"] is None else p["b_1"])
        H = ff_activation(H) if ff_activation else (mn.relu(H) if activation == "relu" else mn.gelu(H))
        return H @ p["W_2"] + (0 if p["b_2"] is None else p["b_2"])

    def ln(x, i):
        return mn.layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    r = 1.0 if residual else 0.0
    if norm_first != flip_norm:
        a, w = attention_fn(ln(X, 1), n_heads=n_heads, mask=mask, **attention)
        X = r * X + a
        return r * X + ff(ln(X, 2)), w
    a, w = attention_fn(X, n_heads=n_heads, mask=mask, **attention)
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


@mistake("encoder_block", "the attention's softmax overflows on scores above 709: subtract each row's maximum "
         "before exponentiating (mnp.multihead_attention does)")
def block_softmax_without_max(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  attention_fn=multihead_softmax_without_max)


@mistake("encoder_block", "in the attention's softmax, subtract each row's own maximum, not the maximum of all "
         "the scores: a row far below it underflows to 0 / 0")
def block_softmax_global_max(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return _block(X, n_heads, params, mask=mask, norm_first=norm_first, eps=eps, activation=activation,
                  attention_fn=multihead_softmax_global_max)


check_encoder_block = make_check("encoder_block")
