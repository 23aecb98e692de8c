"""The delta rule and Gated DeltaNet, the PyTorch face of `mha.numpy.delta` (chapter 18): the same names
and results, on tensors, differentiable, and fast.

`gated_delta_rule_chunked` is the form that prefill runs (Yang et al., 2024, the chunked WY form; Yang et
al., 2025, Gated DeltaNet): every chunk's triangular system is solved at once, one batched
`torch.linalg.solve_triangular` (unit lower triangular), and only the state crosses from chunk to chunk
in a Python loop, one iteration per chunk, never per token. `gated_delta_step` is what decoding runs:
a handful of tensor operations per token. float16 and bfloat16 inputs are computed in float32, as
transformers computes them; outputs come back in the input's dtype and states stay in float32.
The numpy face refuses g > 0; this one does not look (it would cost a synchronisation per call).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.hf import linear as hf_linear
from mha.torch.linear import check_floats, check_sequences, start_state, to_chunks, work_dtype
from mha.torch.tensors import check_input, check_is_tensor


def l2_normalize(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (the eps inside the root, as transformers' l2norm)."""
    check_floats(x=x)
    validate.check_ndim("x", x, 1)
    eps = validate.check_eps(eps)
    h = x.to(work_dtype(x.dtype))
    return (h * torch.rsqrt((h * h).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


def check_gates(g, beta, shape):
    """g (log decays, or None) and beta of shape `shape`, the keys' shape without d_k."""
    check_floats(beta=beta)
    if beta.shape != shape:
        raise ValueError(f"beta must have shape {validate.shape_str(shape)}, one per key (the keys' shape without "
                         f"d_k), got {validate.shape_str(beta.shape)}")
    if g is not None:
        check_floats(g=g)
        if g.shape != shape:
            raise ValueError(f"g must have shape {validate.shape_str(shape)}, one per key (the keys' shape without "
                             f"d_k), got {validate.shape_str(g.shape)}")


def gated_delta_update(state, k, v, g, beta):
    """One write of the gated delta rule: S' = exp(g) S (g None: no decay), S'' = S' + k^T (beta (v - k @ S')).
    state (..., d_k, d_v), k (..., d_k), v (..., d_v), g and beta (...). Returns S'' in the state's dtype."""
    check_floats(state=state, k=k, v=v)
    if state.dim() < 2 or state.shape[:-2] != k.shape[:-1] or state.shape[:-2] != v.shape[:-1] \
            or state.shape[-2:] != (k.shape[-1], v.shape[-1]):
        raise ValueError(f"state must have shape (..., d_k, d_v), k (..., d_k) and v (..., d_v) with one (...), got "
                         f"state {validate.shape_str(state.shape)}, k {validate.shape_str(k.shape)}, "
                         f"v {validate.shape_str(v.shape)}")
    check_gates(g, beta, k.shape[:-1])
    return update(state, k, v, g, beta)


def update(state, k, v, g, beta):
    """`gated_delta_update` without the checks (the decoding step calls it once per token)."""
    work = work_dtype(state.dtype)
    state = state.to(work)
    k, v, beta = k.to(work), v.to(work), beta.to(work)
    if g is not None:
        state = state * g.to(work).exp()[..., None, None]  # (..., d_k, d_v): the whole state fades
    predicted = (k.unsqueeze(-2) @ state).squeeze(-2)  # (..., d_v): what the state holds for k
    correction = beta.unsqueeze(-1) * (v - predicted)  # (..., d_v): a share beta of the error
    return state + k.unsqueeze(-1) * correction.unsqueeze(-2)  # (..., d_k, d_v)


def gated_delta_step(state, q, k, v, g, beta):
    """One token: `gated_delta_update`, then out = q @ new_state. q (..., d_k) already scaled.
    Returns (out (..., d_v) in q's dtype, new_state (..., d_k, d_v), float32 for half inputs)."""
    check_floats(q=q)
    if q.shape != k.shape:
        raise ValueError(f"q and k must have one shape (..., d_k), got q {validate.shape_str(q.shape)}, "
                         f"k {validate.shape_str(k.shape)}")
    new_state = gated_delta_update(state.to(work_dtype(q.dtype)), k, v, g, beta)
    out = (q.to(new_state.dtype).unsqueeze(-2) @ new_state).squeeze(-2)  # (..., d_v)
    return out.to(q.dtype), new_state


def check_rule(q, k, v, g, beta, scale):
    """The sequences of the rule, checked; returns the scale (default d_k ** -0.5)."""
    check_sequences(q, k, v)
    check_gates(g, beta, k.shape[:-1])
    scale = validate.check_scale(scale)
    return k.shape[-1] ** -0.5 if scale is None else scale


def gated_delta_rule_recurrent(q, k, v, g, beta, *, scale=None, initial_state=None):
    """The gated delta rule over T tokens, one step after another. q, k (..., h, T, d_k) (no L2 norm here),
    v (..., h, T, d_v), g (log decays, or None) and beta (..., h, T); q times scale (default d_k ** -0.5).
    initial_state (..., h, d_k, d_v) or None. Returns (out (..., h, T, d_v), state (..., h, d_k, d_v))."""
    scale = check_rule(q, k, v, g, beta, scale)
    dtype, work = q.dtype, work_dtype(q.dtype)
    state = start_state(initial_state, k, v, work)
    q, k, v, beta = q.to(work) * scale, k.to(work), v.to(work), beta.to(work)
    outs = []
    for t in range(q.shape[-2]):
        state = update(state, k[..., t, :], v[..., t, :], None if g is None else g[..., t], beta[..., t])
        outs.append((q[..., t, :].unsqueeze(-2) @ state).squeeze(-2))  # (..., d_v)
    return torch.stack(outs, dim=-2).to(dtype), state  # (..., T, d_v), (..., d_k, d_v)


def chunk_decays(g, shape, chunk_size, like):
    """G (..., n, C), the log decay from each chunk's start to each token (zeros when g is None), and the
    decays exp(G_t - G_s) (..., n, C, C) for s <= t, 0 above the diagonal."""
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=like.device).tril()  # (C, C): s <= t
    if g is None:
        return like.new_zeros(shape), causal.to(like.dtype)
    G = to_chunks(g.to(like.dtype).unsqueeze(-1), chunk_size).squeeze(-1).cumsum(dim=-1)  # (..., n, C)
    gap = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf"))  # (..., n, C, C)
    return G, gap.exp()


def solve_chunks(k, v, beta, G, decay):
    """Every chunk's unit lower-triangular system (I + A) X = [beta v | beta exp(G) k] at once, A[t, s] =
    beta_t exp(G_t - G_s) (k_t . k_s) for s < t. Returns (W, D): U = W - D @ S_0 are the chunk's corrections."""
    A = beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decay  # (..., n, C, C); the diagonal is ignored
    rhs = torch.cat([beta.unsqueeze(-1) * v, (beta * G.exp()).unsqueeze(-1) * k], dim=-1)  # (..., n, C, d_v + d_k)
    x = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)  # (..., n, C, d_v + d_k)
    return x[..., :v.shape[-1]], x[..., v.shape[-1]:]


def gated_delta_chunk(state, q, k, v, g, beta):
    """One chunk of C tokens in the parallel (WY / UT) form, equal to C recurrent steps: state (..., d_k, d_v),
    q (already scaled) and k (..., C, d_k), v (..., C, d_v), g (log decays, or None) and beta (..., C).
    Returns (out (..., C, d_v), new_state (..., d_k, d_v))."""
    check_sequences(q, k, v)
    check_gates(g, beta, k.shape[:-1])
    return chunked(q, k, v, g, beta, q.shape[-2], start_state(state, k, v, work_dtype(q.dtype)), q.dtype)


def chunked(q, k, v, g, beta, chunk_size, state, dtype):
    """The chunked rule on checked inputs, state already in the work dtype, q already scaled; the output
    returned in `dtype`."""
    work, T = state.dtype, q.shape[-2]
    q, k, v = (to_chunks(x.to(work), chunk_size) for x in (q, k, v))  # (..., n, C, d)
    beta = to_chunks(beta.to(work).unsqueeze(-1), chunk_size).squeeze(-1)  # (..., n, C); padding writes nothing
    G, decay = chunk_decays(g, beta.shape, chunk_size, q)  # (..., n, C), (..., n, C, C)
    W, D = solve_chunks(k, v, beta, G, decay)  # (..., n, C, d_v), (..., n, C, d_k)
    reads = (q @ k.transpose(-1, -2)) * decay  # (..., n, C, C): q_t . k_s decayed from s to t, s <= t
    q_from_start = q * G.exp().unsqueeze(-1)  # (..., n, C, d_k): reads the state at the chunk's start
    k_to_end = k * (G[..., -1:] - G).exp().unsqueeze(-1)  # (..., n, C, d_k): writes decayed to the chunk's end
    chunk_decay = G[..., -1].exp()[..., None, None]  # (..., n, 1, 1)
    outs = []
    for i in range(q.shape[-3]):  # one iteration per chunk: the state crosses over
        u = W[..., i, :, :] - D[..., i, :, :] @ state  # (..., C, d_v): the chunk's corrections
        outs.append(q_from_start[..., i, :, :] @ state + reads[..., i, :, :] @ u)  # (..., C, d_v)
        state = chunk_decay[..., i, :, :] * state + k_to_end[..., i, :, :].transpose(-1, -2) @ u
    out = torch.cat(outs, dim=-2)[..., :T, :]  # (..., T, d_v)
    return out.to(dtype), state


def gated_delta_rule_chunked(q, k, v, g, beta, *, chunk_size=64, scale=None, initial_state=None):
    """The gated delta rule in chunks of `chunk_size` tokens (the last padded with tokens that write nothing):
    the same arguments and result as `gated_delta_rule_recurrent`, one triangular solve for all chunks."""
    scale = check_rule(q, k, v, g, beta, scale)
    chunk_size = validate.check_int("chunk_size", chunk_size, minimum=1)
    state = start_state(initial_state, k, v, work_dtype(q.dtype))
    return chunked(q.to(state.dtype) * scale, k, v, g, beta, chunk_size, state, q.dtype)


def causal_conv1d(x, weight, *, state=None, activation="silu"):
    """Depthwise causal convolution along time: y[t, c] = act(sum_j weight[c, j] * xpad[t + j, c]), xpad the
    K - 1 inputs before x (state, zeros if None) then x. x (..., T, C), weight (C, K). Returns (y (..., T, C),
    new_state (..., K - 1, C), the last K - 1 inputs, in x's dtype)."""
    check_floats(x=x, weight=weight)
    validate.check_sequence("x", x)
    if weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape (C, K) = ({x.shape[-1]}, K), one filter per channel of x "
                         f"{validate.shape_str(x.shape)}, got {validate.shape_str(weight.shape)}")
    if activation not in (None, "silu"):
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    K = weight.shape[1]
    shape = x.shape[:-2] + (K - 1, x.shape[-1])
    if state is None:
        state = x.new_zeros(shape)
    elif state.shape != shape:
        raise ValueError(f"state must hold the K - 1 inputs before x, shape (..., K - 1, C) = "
                         f"{validate.shape_str(shape)}, got {validate.shape_str(state.shape)}")
    return conv(x, weight, state, activation)


def conv(x, weight, state, activation):
    """`causal_conv1d` without the checks."""
    K, work = weight.shape[1], work_dtype(x.dtype)
    xpad = torch.cat([state.to(x.dtype), x], dim=-2)  # (..., K - 1 + T, C)
    windows = xpad.to(work).unfold(-2, K, 1)  # (..., T, C, K): each step's K inputs
    y = (windows * weight.to(work)).sum(dim=-1).to(x.dtype)  # (..., T, C), rounded once as conv1d rounds it
    y = F.silu(y) if activation == "silu" else y
    return y, xpad[..., xpad.shape[-2] - (K - 1):, :].clone()  # a copy: xpad may be long


def gated_rms_norm(x, gate, weight, eps=1e-6):
    """RMSNorm(x) * weight * silu(gate) over the last axis, as Qwen3-Next's RMSNormGated: norm in float32,
    back to x's dtype, times weight, times silu(gate) in float32, returned in x's dtype. x, gate (..., d)."""
    check_floats(x=x, gate=gate, weight=weight)
    validate.check_ndim("x", x, 1)
    if gate.shape != x.shape:
        raise ValueError(f"gate must have the shape of x {validate.shape_str(x.shape)}, "
                         f"got {validate.shape_str(gate.shape)}")
    validate.check_vector("weight", weight, x.shape[-1])
    return rms_gate(x, gate, weight, validate.check_eps(eps))


def rms_gate(x, gate, weight, eps):
    """`gated_rms_norm` without the checks."""
    work = work_dtype(x.dtype)
    h = x.to(work)
    normed = (h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)  # (..., d)
    return (weight * normed * F.silu(gate.to(work))).to(x.dtype)  # (..., d)


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


class StateCache:
    """What a Gated DeltaNet layer keeps while decoding: `conv_state` (B, K - 1, C), the convolution's last K - 1
    inputs, and `recurrent_state` (B, H_v, d_k, d_v) (float32 for half models, as transformers keeps it), both
    None until the first forward. Its size never grows with T: `position` counts the tokens seen, `dropped` is
    always 0, `nbytes` the bytes held (`gated_delta_state_bytes` of the layer)."""

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget every token: empty states, position 0."""
        self.conv_state, self.recurrent_state, self.position, self.dropped = None, None, 0, 0

    @property
    def nbytes(self):
        held = (self.conv_state, self.recurrent_state)
        return sum(a.numel() * a.element_size() for a in held if a is not None)

    def __repr__(self):
        shape = "empty" if self.recurrent_state is None else f"state {validate.shape_str(self.recurrent_state.shape)}"
        return f"{type(self).__name__}({shape}, position {self.position})"


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet as Qwen3-Next and Qwen3.5 compute it (Yang et al., 2025): x (..., T, d_model) -> the same.

    qkv = silu(causal_conv1d(x W_qkv)) split into H_k query heads, H_k key heads (both L2-normalised, each
    serving H_v / H_k consecutive value heads) and H_v value heads; beta = sigmoid(x W_b); the log decay
    g = -exp(A_log) softplus(x W_a + dt_bias); the gated delta rule; per value head gated_rms_norm(out, x W_z);
    then W_o. A prompt runs the chunked form, a cached token the recurrent step."""

    def __init__(self, d_model, *, n_key_heads, n_value_heads, key_head_dim, value_head_dim, conv_kernel=4,
                 norm_eps=1e-6, chunk_size=64, device=None, dtype=None):
        super().__init__()
        sizes = dict(d_model=d_model, n_key_heads=n_key_heads, n_value_heads=n_value_heads,
                     key_head_dim=key_head_dim, value_head_dim=value_head_dim, conv_kernel=conv_kernel,
                     chunk_size=chunk_size)
        for name, value in sizes.items():
            setattr(self, name, validate.check_int(name, value))
        if n_value_heads % n_key_heads:
            raise ValueError(f"n_value_heads={n_value_heads} is not a multiple of n_key_heads={n_key_heads}: each "
                             f"query/key head serves n_value_heads / n_key_heads value heads")
        self.norm_eps = validate.check_eps(norm_eps)
        self.widths = [n_key_heads * key_head_dim] * 2 + [n_value_heads * value_head_dim]  # q, k, v channels
        made = dict(device=device, dtype=dtype)
        self.W_qkv = nn.Linear(d_model, sum(self.widths), bias=False, **made)
        self.W_z = nn.Linear(d_model, n_value_heads * value_head_dim, bias=False, **made)
        self.W_b = nn.Linear(d_model, n_value_heads, bias=False, **made)
        self.W_a = nn.Linear(d_model, n_value_heads, bias=False, **made)
        self.conv_weight = nn.Parameter(torch.empty(sum(self.widths), conv_kernel, **made))
        self.A_log = nn.Parameter(torch.empty(n_value_heads, **made))
        self.dt_bias = nn.Parameter(torch.empty(n_value_heads, **made))
        self.norm_weight = nn.Parameter(torch.empty(value_head_dim, **made))
        self.W_o = nn.Linear(n_value_heads * value_head_dim, d_model, bias=False, **made)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """The convolution as nn.Conv1d starts, A = exp(A_log) uniform in [1, 16] and dt = softplus(x W_a +
        dt_bias) near log-uniform in [0.001, 0.1] at the start (Mamba's and Gated DeltaNet's initialisation)."""
        bound = 1 / math.sqrt(self.conv_kernel)
        self.conv_weight.uniform_(-bound, bound)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        dt = (torch.rand_like(self.dt_bias) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).exp()
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.norm_weight.fill_(1.0)

    def new_cache(self):
        return StateCache()

    def state_bytes(self, batch=1):
        """The bytes its StateCache holds for `batch` sequences: `gated_delta_state_bytes` at the weights' size,
        but a half model's recurrent state at float32's 4 bytes (as it is kept)."""
        sizes = dict(n_key_heads=self.n_key_heads, n_value_heads=self.n_value_heads, key_head_dim=self.key_head_dim,
                     value_head_dim=self.value_head_dim, batch=batch)
        size, kept = self.W_o.weight.element_size(), torch.finfo(work_dtype(self.W_o.weight.dtype)).bits // 8
        recurrent = gated_delta_state_bytes(**sizes, conv_kernel=1, bytes_per_value=size)  # no convolution part
        whole = gated_delta_state_bytes(**sizes, conv_kernel=self.conv_kernel, bytes_per_value=size)
        return whole + recurrent * (kept - size) // size

    def forward(self, x, *, keep=None, cache=None):
        """x (B, T, d_model) or (T, d_model); keep (B, T) booleans (False: a padding token, its input zeroed, as
        transformers does) or None; cache a StateCache, advanced in place, or None. Returns x's shape."""
        check_input(self, "x", x, self.d_model, "GatedDeltaNet", weight=self.W_o.weight)
        validate.check_ndim("x", x, 2, 3)
        one = x.dim() == 2
        x = x.unsqueeze(0) if one else x  # (B, T, d_model)
        if keep is not None:
            x = x * self.checked_keep(keep, x, one).unsqueeze(-1).to(x.dtype)  # padding tokens zeroed
        if cache is not None and not isinstance(cache, StateCache):
            raise TypeError(f"cache must be a StateCache (layer.new_cache()), got {type(cache).__name__}")
        y = self.mix(x, cache)
        return y.squeeze(0) if one else y

    def checked_keep(self, keep, x, one):
        check_is_tensor("keep", keep)
        keep = keep.unsqueeze(0) if one and keep.dim() == 1 else keep
        if keep.dtype != torch.bool or tuple(keep.shape) != tuple(x.shape[:2]):
            raise ValueError(f"keep must be booleans (B, T) = {validate.shape_str(x.shape[:2])}, this call's tokens "
                             f"(False = padding), got {keep.dtype} of shape {validate.shape_str(keep.shape)}")
        return keep

    def heads(self, x, cache):
        """q, k (B, H_v, T, d_k) normalised (and shared by their value heads), v (B, H_v, T, d_v), and the
        convolution's new state (B, K - 1, C)."""
        B, T, _ = x.shape
        held = None if cache is None else cache.conv_state
        if held is not None and held.shape[0] != B:
            raise ValueError(f"the cache holds {held.shape[0]} sequences, x has {B}: one cache per batch")
        held = x.new_zeros(B, self.conv_kernel - 1, sum(self.widths)) if held is None else held
        qkv, conv_state = conv(self.W_qkv(x), self.conv_weight, held, "silu")  # (B, T, C), (B, K - 1, C)
        q, k, v = qkv.split(self.widths, dim=-1)
        work, share = work_dtype(x.dtype), self.n_value_heads // self.n_key_heads
        q, k = (t.view(B, T, self.n_key_heads, self.key_head_dim).transpose(1, 2).to(work) for t in (q, k))
        q, k = (t * torch.rsqrt((t * t).sum(dim=-1, keepdim=True) + 1e-6) for t in (q, k))  # l2_normalize
        if share > 1:
            q, k = q.repeat_interleave(share, dim=1), k.repeat_interleave(share, dim=1)  # (B, H_v, T, d_k)
        v = v.view(B, T, self.n_value_heads, self.value_head_dim).transpose(1, 2)  # (B, H_v, T, d_v)
        return q, k, v, conv_state

    def mix(self, x, cache):
        B, T, _ = x.shape
        q, k, v, conv_state = self.heads(x, cache)
        work = q.dtype
        beta = self.W_b(x).sigmoid().transpose(1, 2)  # (B, H_v, T)
        g = -self.A_log.to(work).exp() * F.softplus(self.W_a(x).to(work) + self.dt_bias.to(work))  # (B, T, H_v)
        g, scale = g.transpose(1, 2), self.key_head_dim ** -0.5  # (B, H_v, T)
        state = None if cache is None else cache.recurrent_state
        if state is None:
            state = q.new_zeros(B, self.n_value_heads, self.key_head_dim, self.value_head_dim)
        if T == 1:  # one token: the recurrent step
            state = update(state, k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0])  # (B, H_v, d_k, d_v)
            out = (q * scale) @ state  # (B, H_v, 1, d_v)
        else:
            out, state = chunked(q * scale, k, v, g, beta, self.chunk_size, state, work)  # (B, H_v, T, d_v)
        out = out.to(x.dtype).transpose(1, 2)  # (B, T, H_v, d_v)
        z = self.W_z(x).view(B, T, self.n_value_heads, self.value_head_dim)  # (B, T, H_v, d_v)
        out = rms_gate(out, z, self.norm_weight, self.norm_eps).reshape(B, T, -1)  # (B, T, H_v d_v)
        if cache is not None:
            cache.conv_state, cache.recurrent_state, cache.position = conv_state, state, cache.position + T
        return self.W_o(out)  # (B, T, d_model)

    def numpy_params(self):
        """The weights as `mha.numpy.gated_delta_net` takes them: row vectors (W of shape (d_in, d_out))."""
        def array(t):
            return t.detach().cpu().numpy()
        params = {name: array(getattr(self, name).weight).T for name in ("W_qkv", "W_z", "W_b", "W_a", "W_o")}
        params.update(conv=array(self.conv_weight), A_log=array(self.A_log), dt_bias=array(self.dt_bias),
                      norm=array(self.norm_weight))
        return params

    @classmethod
    def from_hf(cls, layer, *, chunk_size=64):
        """A copy of transformers' Qwen3_5GatedDeltaNet or Qwen3NextGatedDeltaNet (read in mha.torch.hf.linear),
        on the layer's device and in its dtype."""
        weight = hf_linear.check_gated_delta_net(layer).out_proj.weight
        ours = cls(layer.hidden_size, **hf_linear.gated_delta_net_arguments(layer), chunk_size=chunk_size,
                   device=weight.device, dtype=weight.dtype)
        return hf_linear.copy_gated_delta_net(ours, layer)
