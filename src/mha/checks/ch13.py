"""Chapter 13, today's models: the checks of `rms_norm`, `swiglu`, `soft_cap` and
`sliding_window_mask`, their cases and their catalogued mistakes."""

import math

import numpy as np

from mha.checks.inputs import batch, normal, sizes, weights
from mha.checks.routes import CAP_ROUTES, GATED_ROUTES, NORM_ROUTES, WINDOW_ROUTES
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for

# rms_norm: RMSNorm, LayerNorm without the mean -------------------------------------------



@cases_for("rms_norm", may_use="NumPy (not mnp.layer_norm)", forbids=NORM_ROUTES)
def rms_norm_cases(r):
    """Vectors far from mean 0, one vector, a row of zeros (where 0 / 0 waits without eps), a large eps,
    Gemma's unit offset, float32 features of size 1e-3, whose mean square is about eps, and eps left to its
    default where a wrong default (1e-5) shows."""
    X = 3 + 2 * r.standard_normal((2, 4, 6))  # (B, T, d), mean about 3
    weight = 1 + 0.5 * r.standard_normal(6)
    with_zeros = r.standard_normal((3, 5))
    with_zeros[1] = 0.0
    return [
        Case("a batch of vectors with a mean far from 0", (X, weight)),
        Case("one vector", (X[0, 0], weight)),
        Case("a row of zeros between two others", (with_zeros, 1 + 0.5 * r.standard_normal(5))),
        Case("a large eps (0.5)", (X[0], weight), {"eps": 0.5}),
        Case("unit_offset=True (Gemma's scale 1 + weight), weight near 0", (X[1], 0.1 * r.standard_normal(6)),
             {"unit_offset": True}),
        Case("float32 features of size 1e-3: the mean square is about eps",
             ((1e-3 * r.standard_normal((2, 3, 8))).astype(np.float32), (1 + r.standard_normal(8)).astype(np.float32))),
        Case("eps left to its default (1e-6), features whose mean square is about 1e-5",
             (10 ** -2.5 * r.standard_normal((3, 8)), 1 + 0.5 * r.standard_normal(8))),
    ]


@random_cases_for("rms_norm")
def rms_norm_random_cases(r):
    """A 4-D batch off mean 0 with its own eps, float32 with Gemma's offset, and a single feature."""
    T, d = sizes(r, 2, 2, 7)
    return [
        Case("random: a 4-D batch off mean 0", (2 + normal(r, batch(r, 2) + (T, d), scale=3), 1 + normal(r, d)),
             {"eps": float(r.choice([1e-6, 1e-5, 0.1]))}),
        Case("random: float32, unit_offset=True", (normal(r, (T, d), np.float32), normal(r, d, np.float32, 0.2)),
             {"unit_offset": True}),
        Case("random: one feature", (normal(r, (T, 1)), 1 + normal(r, 1))),
    ]


def scale_of(weight, unit_offset):
    return 1 + weight if unit_offset else weight


@mistake("rms_norm", "RMSNorm does not subtract the mean: divide x by sqrt(mean(x^2) + eps), the root of its "
         "mean square, not by its standard deviation (that is LayerNorm)")
def rms_norm_subtracts_mean(X, weight, eps=1e-6, *, unit_offset=False):
    centred = X - X.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * scale_of(weight, unit_offset)


@mistake("rms_norm", "add eps inside the square root, sqrt(mean(x^2) + eps): without it a vector of zeros "
         "gives 0 / 0, and tiny vectors are blown up")
def rms_norm_without_eps(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt((X ** 2).mean(-1, keepdims=True)) * scale_of(weight, unit_offset)


@mistake("rms_norm", "keep the signature's default, eps=1e-6: the check calls rms_norm(X, weight) without eps on "
         "most cases, and a default of 1e-5 (torch.nn.LayerNorm's) changes every vector whose mean square is small")
def rms_norm_default_eps_1e5(X, weight, eps=1e-5, *, unit_offset=False):
    return X / np.sqrt((X ** 2).mean(-1, keepdims=True) + eps) * scale_of(weight, unit_offset)


@mistake("rms_norm", "eps goes inside the square root: sqrt(mean(x^2) + eps), not sqrt(mean(x^2)) + eps")
def rms_norm_eps_outside(X, weight, eps=1e-6, *, unit_offset=False):
    return X / (np.sqrt((X ** 2).mean(-1, keepdims=True)) + eps) * scale_of(weight, unit_offset)


@mistake("rms_norm", "divide by the root of the MEAN of the squares (np.mean, or the sum divided by d), "
         "not by the length of the vector")
def rms_norm_by_length(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt((X ** 2).sum(-1, keepdims=True) + eps) * scale_of(weight, unit_offset)


@mistake("rms_norm", "take the square root of the mean square: x / sqrt(mean(x^2) + eps)")
def rms_norm_without_root(X, weight, eps=1e-6, *, unit_offset=False):
    return X / ((X ** 2).mean(-1, keepdims=True) + eps) * scale_of(weight, unit_offset)


@mistake("rms_norm", "normalise each vector over its own features (the last axis), not over the batch")
def rms_norm_wrong_axis(X, weight, eps=1e-6, *, unit_offset=False):
    axes = tuple(range(X.ndim - 1)) or (0,)
    return X / np.sqrt((X ** 2).mean(axes, keepdims=True) + eps) * scale_of(weight, unit_offset)


@mistake("rms_norm", "with unit_offset=True the scale is 1 + weight (Gemma stores the weight around 0)")
def rms_norm_ignores_unit_offset(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt((X ** 2).mean(-1, keepdims=True) + eps) * weight


@mistake("rms_norm", "scale by 1 + weight only when unit_offset=True; by default (Llama's form) the weight "
         "multiplies as it is")
def rms_norm_always_offset(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt((X ** 2).mean(-1, keepdims=True) + eps) * (1 + weight)


@mistake("rms_norm", "multiply by the weight after normalising: the norm has a learned scale")
def rms_norm_without_weight(X, weight, eps=1e-6, *, unit_offset=False):
    return X / np.sqrt((X ** 2).mean(-1, keepdims=True) + eps)


check_rms_norm = make_check("rms_norm")

# swiglu: the gated feed-forward of Llama --------------------------------------------------



@cases_for("swiglu", may_use="NumPy (write SiLU yourself: without mnp.silu, without mnp.gated_feed_forward)",
           forbids=GATED_ROUTES)
def swiglu_cases(r):
    """A batch with d_ff wider than d, one token (1-D), d_ff narrower than d, and gate values of +-1000,
    where e^x overflows."""
    d, d_ff = 4, 6
    on_the_first_two = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])  # (T, d)
    loud_gate = weights(r, d, d_ff)
    loud_gate[:2] = 1000 * np.array([[1.0, -1.0, 1.0, -1.0, 1.0, 1.0], [1.0, 1.0, -1.0, -1.0, 1.0, -1.0]])
    return [
        Case("a batch, d = 4, d_ff = 6", (r.standard_normal((2, 3, d)), weights(r, d, d_ff), weights(r, d, d_ff),
                                          weights(r, d_ff, d))),
        Case("one token, a vector of shape (d,)", (r.standard_normal(d), weights(r, d, d_ff), weights(r, d, d_ff),
                                                   weights(r, d_ff, d))),
        Case("d_ff = 3, narrower than d = 5", (r.standard_normal((4, 5)), weights(r, 5, 3), weights(r, 5, 3),
                                               weights(r, 3, 5))),
        Case("gate values of -1000, 0 and 1000: e^x overflows above 709",
             (on_the_first_two, loud_gate, weights(r, d, d_ff), weights(r, d_ff, d))),
    ]


@random_cases_for("swiglu")
def swiglu_random_cases(r):
    """A 4-D batch, float32 weights and inputs, and one token with d_ff narrower than d."""
    d, d_ff = sizes(r, 2, 2, 6)

    def mlp(d, d_ff, dtype=np.float64):
        return weights(r, d, d_ff, dtype), weights(r, d, d_ff, dtype), weights(r, d_ff, d, dtype)

    return [
        Case("random: a 4-D batch", (normal(r, batch(r, 2) + (3, d)), *mlp(d, d_ff))),
        Case("random: float32", (normal(r, (2, d), np.float32, 2), *mlp(d, d_ff, np.float32))),
        Case("random: one token, d_ff < d", (normal(r, (1, d + 2)), *mlp(d + 2, d))),
    ]


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


@mistake("swiglu", "SiLU goes on the gate, X @ W_gate; X @ W_up passes through unchanged: "
         "silu(X W_gate) * (X W_up)")
def swiglu_gate_and_up_swapped(X, W_gate, W_up, W_down):
    up = X @ W_up
    return (up * sigmoid(up) * (X @ W_gate)) @ W_down


@mistake("swiglu", "SwiGLU's gate is SiLU, x * sigmoid(x), not ReLU")
def swiglu_relu(X, W_gate, W_up, W_down):
    return (np.maximum(X @ W_gate, 0) * (X @ W_up)) @ W_down


@mistake("swiglu", "SiLU is x * sigmoid(x): the sigmoid alone is the gate of the original GLU")
def swiglu_sigmoid_only(X, W_gate, W_up, W_down):
    return (sigmoid(X @ W_gate) * (X @ W_up)) @ W_down


@mistake("swiglu", "the gate is SiLU, not GELU: a GELU gate makes GeGLU, Gemma's feed-forward")
def swiglu_gelu(X, W_gate, W_up, W_down):
    g = X @ W_gate
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    return (gelu * (X @ W_up)) @ W_down


@mistake("swiglu", "SiLU acts on the gate alone, then multiplies the up projection: silu(X W_gate) * (X W_up), "
         "not silu(X W_gate * X W_up)")
def swiglu_silu_of_product(X, W_gate, W_up, W_down):
    product = (X @ W_gate) * (X @ W_up)
    return (product * sigmoid(product)) @ W_down


@mistake("swiglu", "multiply the gate by the up projection, silu(X W_gate) * (X W_up), before W_down")
def swiglu_without_up(X, W_gate, W_up, W_down):
    g = X @ W_gate
    return (g * sigmoid(g)) @ W_down


@mistake("swiglu", "write the sigmoid as 1 / (1 + e^-x): e^x / (1 + e^x) overflows to inf / inf = NaN for x "
         "above 709")
def swiglu_sigmoid_overflows(X, W_gate, W_up, W_down):
    g = X @ W_gate
    with np.errstate(over="ignore", invalid="ignore"):
        return (g * np.exp(g) / (1 + np.exp(g)) * (X @ W_up)) @ W_down


check_swiglu = make_check("swiglu")

# soft_cap: Gemma 2's smooth cap ----------------------------------------------------------



@cases_for("soft_cap", may_use="NumPy (np.tanh)", forbids=CAP_ROUTES)
def soft_cap_cases(r):
    """Scores on both sides of the cap, a batch of logits, scores small against the cap, float32 with an
    integer cap, and scores of +-1e5 (where a tanh written with exponentials overflows)."""
    return [
        Case("scores from -200 to 200, cap 50 (Gemma 2's attention)", (np.linspace(-200.0, 200.0, 41), 50.0)),
        Case("a batch of logits, cap 30 (Gemma 2's final logits)", (20 * r.standard_normal((2, 3, 5)), 30.0)),
        Case("scores small against the cap", (0.1 * r.standard_normal(6), 50.0)),
        Case("float32 scores, an integer cap (5)", ((8 * r.standard_normal((3, 4))).astype(np.float32), 5)),
        Case("scores of +-1e5, cap 30", (np.array([-1e5, -3e4, 0.0, 3e4, 1e5]), 30.0)),
    ]


@random_cases_for("soft_cap")
def soft_cap_random_cases(r):
    """A 4-D batch of scores around the cap, float32, and a single score (a 0-d array)."""
    cap = float(r.choice([5.0, 30.0, 50.0]))
    return [
        Case("random: a 4-D batch", (normal(r, batch(r, 2) + sizes(r, 2, 1, 5), scale=2 * cap), cap)),
        Case("random: float32", (normal(r, sizes(r, 2, 1, 6), np.float32, cap), cap)),
        Case("random: a single score, a 0-d array", (np.array(float(r.normal(scale=cap))), cap)),
    ]


@mistake("soft_cap", "soft-capping is smooth, cap * tanh(x / cap): np.clip cuts hard at +-cap and leaves "
         "every score below it unchanged")
def soft_cap_clip(x, cap):
    return np.clip(x, -cap, cap)


@mistake("soft_cap", "divide by cap inside the tanh, cap * tanh(x / cap): cap * tanh(x) saturates at |x| of "
         "about 3, whatever the cap")
def soft_cap_without_divide(x, cap):
    return cap * np.tanh(x)


@mistake("soft_cap", "multiply by cap after the tanh: tanh(x / cap) alone squeezes every score into (-1, 1)")
def soft_cap_without_multiply(x, cap):
    return np.tanh(x / cap)


@mistake("soft_cap", "use np.tanh, which saturates safely: a tanh written with exponentials, "
         "(e^u - e^-u) / (e^u + e^-u), overflows to inf / inf = NaN for large scores of either sign")
def soft_cap_tanh_by_exponentials(x, cap):
    u = x / cap
    with np.errstate(over="ignore", invalid="ignore"):
        return cap * (np.exp(u) - np.exp(-u)) / (np.exp(u) + np.exp(-u))


@mistake("soft_cap", "use np.tanh, which saturates safely: (e^2u - 1) / (e^2u + 1) overflows to inf / inf = NaN "
         "for large positive scores")
def soft_cap_tanh_by_one_exponential(x, cap):
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(2 * x / cap)
        return cap * (e - 1) / (e + 1)


check_soft_cap = make_check("soft_cap")

# sliding_window_mask: Mistral's local attention -----------------------------------------



@cases_for("sliding_window_mask",
           may_use="NumPy: compare positions (without mnp.causal_mask, without mnp.causal_mask_after)",
           forbids=WINDOW_ROUTES)
def sliding_window_mask_cases(r):
    """A window shorter than the sequence, a window of 1 (each query sees itself), a window as long as the
    sequence and one longer (both the causal mask), and T = 1."""
    return [
        Case("T = 6, window 3", (6, 3)),
        Case("T = 8, window 2", (8, 2)),
        Case("window 1: each query sees only itself", (5, 1)),
        Case("window = T = 4: the causal mask", (4, 4)),
        Case("window 10 longer than T = 4: the causal mask", (4, 10)),
        Case("T = 1, window 3", (1, 3)),
    ]


@random_cases_for("sliding_window_mask")
def sliding_window_mask_random_cases(r):
    """Lengths and windows that the named cases do not try: short, middling and long sequences, each with a
    window from 1 to a little past its length."""
    lengths = (int(r.choice([2, 3, 5, 7, 9, 10])), int(r.integers(11, 41)), int(r.integers(41, 121)))
    return [Case(f"random: T = {T}, window {w}", (T, w))
            for T, w in ((T, int(r.integers(1, T + 3))) for T in lengths)]


def positions(T):
    """(query positions (T, 1), key positions (1, T))."""
    return np.arange(T)[:, None], np.arange(T)[None, :]


@mistake("sliding_window_mask", "query t sees exactly `window` keys, t - window + 1 .. t, itself included: "
         "key t - window is one too far back")
def window_one_too_many(T, window):
    t, j = positions(T)
    return (j <= t) & (j >= t - window)


@mistake("sliding_window_mask", "the query counts as one of the window's keys: `window` keys are "
         "t - window + 1 .. t, not t - window + 2 .. t")
def window_one_too_few(T, window):
    t, j = positions(T)
    return (j <= t) & (j > t - window + 1)


@mistake("sliding_window_mask", "the window looks back only: query t sees the keys before it and itself, "
         "never a later key, as a causal model must")
def window_on_both_sides(T, window):
    t, j = positions(T)
    return np.abs(t - j) < window


@mistake("sliding_window_mask", "keep the causal condition j <= t as well: j > t - window alone lets every "
         "query see all the keys after it")
def window_without_causal(T, window):
    t, j = positions(T)
    return j > t - window


@mistake("sliding_window_mask", "True means 'may attend', as in every mask of the course: True on the window, "
         "False elsewhere")
def window_flipped(T, window):
    t, j = positions(T)
    return ~((j <= t) & (j > t - window))


@mistake("sliding_window_mask", "rows are queries and columns are keys: row t holds True in columns "
         "t - window + 1 .. t, on and below the diagonal")
def window_transposed(T, window):
    t, j = positions(T)
    return (t <= j) & (t > j - window)


check_sliding_window_mask = make_check("sliding_window_mask")
