"""The delta rule and Gated DeltaNet (chapter 18): linear attention whose state corrects itself.

Plain linear attention only adds: S <- S + k^T v, so an old value written under a similar key is never
taken back. The delta rule (Schlag et al., 2021, "Linear Transformers Are Secretly Fast Weight
Programmers") first reads what the state predicts for the key, k @ S, and writes only a share beta of
the error: S <- S + k^T (beta (v - k @ S)). Gated DeltaNet (Yang et al., 2025, "Gated Delta Networks:
Improving Mamba2 with Delta Rule") also lets the whole state fade by a gate alpha = exp(g) in (0, 1]
before each write, one g per head and token, given in log space (g <= 0) as Qwen3-Next computes it.

Token by token (`gated_delta_update`, `gated_delta_step`, `gated_delta_rule_recurrent`):

    S' = exp(g_t) S;   u_t = beta_t (v_t - k_t @ S');   S = S' + k_t^T u_t;   out_t = q_t @ S

One chunk of C tokens at once (`gated_delta_chunk`; Yang et al., 2024, "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length"): with G_t = g_1 + ... + g_t, the C unknown
corrections u_t depend on each other through the earlier ones, u_t = beta_t (v_t - exp(G_t) k_t @ S_0 -
sum_{s<t} exp(G_t - G_s) (k_t . k_s) u_s), a lower-triangular linear system (I + A) U = ..., solved
at once instead of token after token.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array
from mha.numpy.linear import check_chunk_size, check_sequences, start_state
from mha.numpy.parts import silu


def l2_normalize(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (the eps inside the root, as transformers' l2norm)."""
    x = as_float_array("x", x)
    validate.check_ndim("x", x, 1)
    eps = validate.check_eps(eps)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def check_gates(g, beta, shape):
    """g (log decays, <= 0, or None) and beta of shape `shape` (the keys' shape without d_k)."""
    beta = as_float_array("beta", beta)
    if beta.shape != shape:
        raise ValueError(f"beta must have shape {validate.shape_str(shape)}, one per key (the keys' shape without "
                         f"d_k), got {validate.shape_str(beta.shape)}")
    if g is None:
        return None, beta
    g = as_float_array("g", g)
    if g.shape != shape:
        raise ValueError(f"g must have shape {validate.shape_str(shape)}, one per key (the keys' shape without "
                         f"d_k), got {validate.shape_str(g.shape)}")
    if np.any(g > 0):
        raise ValueError(f"g is the log of the decay and must be <= 0 (the state is multiplied by exp(g) <= 1), "
                         f"got a largest g of {np.max(g)}")
    return g, beta


def check_update(state, k, v, g, beta):
    """The arrays of one update, checked: state (..., d_k, d_v), k (..., d_k), v (..., d_v), g, beta (...)."""
    state, k, v = (as_float_array(n, a) for n, a in (("state", state), ("k", k), ("v", v)))
    if state.ndim < 2 or state.shape[:-2] != k.shape[:-1] or state.shape[:-2] != v.shape[:-1] \
            or state.shape[-2:] != (k.shape[-1], v.shape[-1]):
        raise ValueError(f"state must have shape (..., d_k, d_v), k (..., d_k) and v (..., d_v) with one (...), got "
                         f"state {validate.shape_str(state.shape)}, k {validate.shape_str(k.shape)}, "
                         f"v {validate.shape_str(v.shape)}")
    g, beta = check_gates(g, beta, k.shape[:-1])
    return state, k, v, g, beta


def gated_delta_update(state, k, v, g, beta):
    """One write of the gated delta rule. state (..., d_k, d_v), k (..., d_k), v (..., d_v), g and beta (...):
    S' = exp(g) S (g None: no decay), then S'' = S' + k^T (beta (v - k @ S')). Returns S'' (..., d_k, d_v)."""
    state, k, v, g, beta = check_update(state, k, v, g, beta)
    if g is not None:
        state = np.exp(g)[..., None, None] * state  # (..., d_k, d_v): the whole state fades
    predicted = (k[..., None, :] @ state)[..., 0, :]  # (..., d_v): what the state holds for k
    correction = beta[..., None] * (v - predicted)  # (..., d_v): a share beta of the error
    return state + k[..., :, None] * correction[..., None, :]  # (..., d_k, d_v): k^T u


def gated_delta_step(state, q, k, v, g, beta):
    """One token: `gated_delta_update`, then the read out = q @ new_state. q (..., d_k) (already scaled).
    Returns (out (..., d_v), new_state (..., d_k, d_v))."""
    q = as_float_array("q", q)
    if q.shape != np.shape(k):
        raise ValueError(f"q and k must have one shape (..., d_k), got q {validate.shape_str(q.shape)}, "
                         f"k {validate.shape_str(np.shape(k))}")
    new_state = gated_delta_update(state, k, v, g, beta)
    return (q[..., None, :] @ new_state)[..., 0, :], new_state  # (..., d_v), (..., d_k, d_v)


def check_rule(q, k, v, g, beta, scale):
    """The sequences of the rule: q, k (..., T, d_k), v (..., T, d_v), g and beta (..., T); q times scale."""
    q, k, v = check_sequences(q, k, v)
    g, beta = check_gates(g, beta, k.shape[:-1])
    scale = validate.check_scale(scale)
    return q * (k.shape[-1] ** -0.5 if scale is None else scale), k, v, g, beta


def gated_delta_rule_recurrent(q, k, v, g, beta, *, scale=None, initial_state=None):
    """The gated delta rule over T tokens, one `gated_delta_step` after another. q, k (..., h, T, d_k) (no
    L2 norm here: callers normalise), v (..., h, T, d_v), g (log decays, or None) and beta (..., h, T); q is
    multiplied by scale (default d_k ** -0.5) first, as transformers does. initial_state (..., h, d_k, d_v)
    or None (zeros). Returns (out (..., h, T, d_v), state (..., h, d_k, d_v))."""
    q, k, v, g, beta = check_rule(q, k, v, g, beta, scale)
    state = start_state(initial_state, k, v)
    outs = []
    for t in range(q.shape[-2]):
        g_t = None if g is None else g[..., t]
        out, state = gated_delta_step(state, q[..., t, :], k[..., t, :], v[..., t, :], g_t, beta[..., t])
        outs.append(out)
    return np.stack(outs, axis=-2), state  # (..., T, d_v), (..., d_k, d_v)


def gated_delta_chunk(state, q, k, v, g, beta):
    """One chunk of C tokens of the gated delta rule, all at once (no loop over tokens): state (..., d_k, d_v),
    q (already scaled) and k (..., C, d_k), v (..., C, d_v), g (log decays, or None) and beta (..., C).
    Equal to C recurrent steps. Returns (out (..., C, d_v), new_state (..., d_k, d_v))."""
    q, k, v = check_sequences(q, k, v)
    g, beta = check_gates(g, beta, k.shape[:-1])
    state = start_state(state, k, v)
    C = k.shape[-2]
    G = np.zeros_like(beta) if g is None else np.cumsum(g, axis=-1)  # (..., C): log decay since the start
    below = np.tril(np.ones((C, C), dtype=bool), -1)  # (C, C): s < t
    gap = np.where(below | np.eye(C, dtype=bool), G[..., :, None] - G[..., None, :], -np.inf)  # (..., C, C)
    decay = np.exp(gap)  # (..., C, C): exp(G_t - G_s) where s <= t, else 0
    kk = k @ np.swapaxes(k, -1, -2)  # (..., C, C): k_t . k_s
    A = np.where(below, beta[..., :, None] * decay * kk, 0)  # (..., C, C): how u_s enters u_t
    rhs = beta[..., None] * (v - np.exp(G)[..., None] * (k @ state))  # (..., C, d_v): the error against S_0
    u = np.linalg.solve(np.eye(C, dtype=A.dtype) + A, rhs)  # (..., C, d_v): (I + A) U = rhs, lower triangular
    qk = (q @ np.swapaxes(k, -1, -2)) * decay  # (..., C, C): q_t . k_s, decayed from s to t, s <= t
    out = np.exp(G)[..., None] * (q @ state) + qk @ u  # (..., C, d_v): the old state read, plus the chunk
    to_end = np.exp(G[..., -1:] - G)  # (..., C): decay from each token to the chunk's end
    new_state = np.exp(G[..., -1])[..., None, None] * state + np.swapaxes(to_end[..., None] * k, -1, -2) @ u
    return out, new_state  # (..., C, d_v), (..., d_k, d_v)


def gated_delta_rule_chunked(q, k, v, g, beta, *, chunk_size=64, scale=None, initial_state=None):
    """The gated delta rule in chunks of `chunk_size` tokens (the last one may be shorter), one
    `gated_delta_chunk` after another: the same arguments and result as `gated_delta_rule_recurrent`."""
    q, k, v, g, beta = check_rule(q, k, v, g, beta, scale)
    chunk_size = check_chunk_size(chunk_size)
    state = start_state(initial_state, k, v)
    outs = []
    for start in range(0, q.shape[-2], chunk_size):
        part = slice(start, start + chunk_size)
        g_c = None if g is None else g[..., part]
        out, state = gated_delta_chunk(state, q[..., part, :], k[..., part, :], v[..., part, :], g_c,
                                       beta[..., part])
        outs.append(out)
    return np.concatenate(outs, axis=-2), state  # (..., T, d_v), (..., d_k, d_v)


def check_conv(x, weight, state, activation):
    """x (..., T, C), weight (C, K), state None or (..., K - 1, C), activation None or "silu"."""
    x, weight = as_float_array("x", x), as_float_array("weight", weight)
    validate.check_sequence("x", x)
    if weight.ndim != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape (C, K) = ({x.shape[-1]}, K), one filter per channel of x "
                         f"{validate.shape_str(x.shape)}, got {validate.shape_str(weight.shape)}")
    if activation not in (None, "silu"):
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    shape = x.shape[:-2] + (weight.shape[1] - 1, x.shape[-1])
    if state is None:
        return x, weight, np.zeros(shape, dtype=x.dtype)
    state = as_float_array("state", state)
    if state.shape != shape:
        raise ValueError(f"state must hold the K - 1 inputs before x, shape (..., K - 1, C) = "
                         f"{validate.shape_str(shape)}, got {validate.shape_str(state.shape)}")
    return x, weight, state


def causal_conv1d(x, weight, *, state=None, activation="silu"):
    """Depthwise causal convolution along time: y[t, c] = act(sum_j weight[c, j] * xpad[t + j, c]), xpad
    the K - 1 inputs before x (state, zeros if None) then x. x (..., T, C), weight (C, K). Returns
    (y (..., T, C), new_state (..., K - 1, C): the last K - 1 inputs)."""
    x, weight, state = check_conv(x, weight, state, activation)
    T, K = x.shape[-2], weight.shape[1]
    xpad = np.concatenate([state.astype(x.dtype), x], axis=-2)  # (..., K - 1 + T, C)
    y = sum(weight[:, j] * xpad[..., j:j + T, :] for j in range(K))  # (..., T, C)
    y = silu(y) if activation == "silu" else y
    return y.astype(x.dtype, copy=False), xpad[..., xpad.shape[-2] - (K - 1):, :]


def gated_rms_norm(x, gate, weight, eps=1e-6):
    """RMSNorm(x) * weight * silu(gate) over the last axis (Qwen3-Next's gated norm: norm, then gate).
    x and gate (..., d), weight (d,). Half inputs computed in float32 and returned in their dtype."""
    x, gate, weight = (as_float_array(n, a) for n, a in (("x", x), ("gate", gate), ("weight", weight)))
    validate.check_ndim("x", x, 1)
    if gate.shape != x.shape:
        raise ValueError(f"gate must have the shape of x {validate.shape_str(x.shape)}, "
                         f"got {validate.shape_str(gate.shape)}")
    validate.check_vector("weight", weight, x.shape[-1])
    eps = validate.check_eps(eps)
    work = np.float64 if x.dtype == np.float64 else np.float32
    h = x.astype(work)
    normed = (h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)).astype(x.dtype)  # (..., d)
    return (weight * normed * silu(gate.astype(work))).astype(x.dtype)  # (..., d)


def gated_delta_state_bytes(*, n_key_heads, n_value_heads, key_head_dim, value_head_dim, conv_kernel, batch=1,
                            bytes_per_value=2):
    """Bytes a Gated DeltaNet layer holds while decoding, whatever T: the recurrent state (H_v d_k d_v
    values) and the convolution's last K - 1 inputs of its 2 H_k d_k + H_v d_v channels, per sequence."""
    sizes = {name: validate.check_int(name, value) for name, value in (
        ("n_key_heads", n_key_heads), ("n_value_heads", n_value_heads), ("key_head_dim", key_head_dim),
        ("value_head_dim", value_head_dim), ("conv_kernel", conv_kernel), ("batch", batch),
        ("bytes_per_value", bytes_per_value))}
    recurrent = sizes["n_value_heads"] * sizes["key_head_dim"] * sizes["value_head_dim"]
    channels = 2 * sizes["n_key_heads"] * sizes["key_head_dim"] + sizes["n_value_heads"] * sizes["value_head_dim"]
    conv = (sizes["conv_kernel"] - 1) * channels
    return (recurrent + conv) * sizes["batch"] * sizes["bytes_per_value"]


LAYER_PARAMS = ("W_qkv", "W_z", "W_b", "W_a", "conv", "A_log", "dt_bias", "norm", "W_o")


def layer_params(params, d_model, n_key_heads, n_value_heads, key_head_dim, value_head_dim):
    """The layer's weights as float arrays, each checked against the sizes given."""
    missing = [name for name in LAYER_PARAMS if name not in params]
    if missing:
        raise ValueError(f"params is missing {missing}: expected GatedDeltaNet.numpy_params()'s {list(LAYER_PARAMS)}")
    channels, values = 2 * n_key_heads * key_head_dim + n_value_heads * value_head_dim, n_value_heads * value_head_dim
    shapes = {"W_qkv": (d_model, channels), "W_z": (d_model, values), "W_b": (d_model, n_value_heads),
              "W_a": (d_model, n_value_heads), "A_log": (n_value_heads,), "dt_bias": (n_value_heads,),
              "norm": (value_head_dim,), "W_o": (values, d_model)}
    p = {name: as_float_array(name, params[name]) for name in LAYER_PARAMS}
    for name, shape in shapes.items():
        if p[name].shape != shape:
            raise ValueError(f"params[{name!r}] must have shape {validate.shape_str(shape)}, "
                             f"got {validate.shape_str(p[name].shape)}")
    if p["conv"].ndim != 2 or p["conv"].shape[0] != channels:
        raise ValueError(f"params['conv'] must have shape (C, K) = ({channels}, K), got "
                         f"{validate.shape_str(p['conv'].shape)}")
    return p


def softplus(x):
    """log(1 + e^x), and x itself above 20, as torch.nn.functional.softplus."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def gated_delta_net(x, params, *, n_key_heads, n_value_heads, key_head_dim, value_head_dim, norm_eps=1e-6,
                    keep=None):
    """Gated DeltaNet, the whole layer, from an empty state: x (..., T, d_model) -> (..., T, d_model).
    params: `GatedDeltaNet.numpy_params()`. keep (..., T) booleans or None: False (left padding) zeroes
    that token's input, as transformers does. The rule runs token by token (`gated_delta_rule_recurrent`)."""
    x = as_float_array("x", x)
    validate.check_sequence("x", x)
    sizes = [validate.check_int(n, s) for n, s in (("n_key_heads", n_key_heads), ("n_value_heads", n_value_heads),
                                                   ("key_head_dim", key_head_dim), ("value_head_dim", value_head_dim))]
    H_k, H_v, d_k, d_v = sizes
    if H_v % H_k:
        raise ValueError(f"n_value_heads={H_v} is not a multiple of n_key_heads={H_k}")
    p = layer_params(params, x.shape[-1], H_k, H_v, d_k, d_v)
    if keep is not None:
        keep = np.asarray(keep)
        if keep.dtype != bool or keep.shape != x.shape[:-1]:
            raise ValueError(f"keep must be booleans of shape {validate.shape_str(x.shape[:-1])} (False = padding), "
                             f"got {keep.dtype} of shape {validate.shape_str(keep.shape)}")
        x = x * keep[..., None]  # (..., T, d_model): padding tokens zeroed
    T = x.shape[-2]
    qkv, _ = causal_conv1d(x @ p["W_qkv"], p["conv"])  # (..., T, C), silu
    q, k, v = np.split(qkv, [H_k * d_k, 2 * H_k * d_k], axis=-1)
    q, k = (np.swapaxes(l2_normalize(t.reshape(*t.shape[:-1], H_k, d_k)), -2, -3) for t in (q, k))  # (..., H_k, T, d_k)
    q, k = np.repeat(q, H_v // H_k, axis=-3), np.repeat(k, H_v // H_k, axis=-3)  # (..., H_v, T, d_k), consecutive
    v = np.swapaxes(v.reshape(*v.shape[:-1], H_v, d_v), -2, -3)  # (..., H_v, T, d_v)
    with np.errstate(over="ignore"):
        beta = np.swapaxes(1 / (1 + np.exp(-(x @ p["W_b"]))), -1, -2)  # (..., H_v, T), the sigmoid
    g = np.swapaxes(-np.exp(p["A_log"]) * softplus(x @ p["W_a"] + p["dt_bias"]), -1, -2)  # (..., H_v, T)
    out, _ = gated_delta_rule_recurrent(q, k, v, g, beta)  # (..., H_v, T, d_v)
    z = (x @ p["W_z"]).reshape(*x.shape[:-1], H_v, d_v)  # (..., T, H_v, d_v)
    out = gated_rms_norm(np.swapaxes(out, -2, -3), z, p["norm"], norm_eps)  # (..., T, H_v, d_v)
    return out.reshape(*x.shape[:-2], T, H_v * d_v) @ p["W_o"]  # (..., T, d_model)
