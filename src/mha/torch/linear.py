"""Linear attention, the PyTorch face of `mha.numpy.linear` (chapter 18; Katharopoulos et al., 2020):
the same names and results, on tensors, differentiable. The chunked form computes every chunk at once:
the states at the chunks' starts are a cumulative sum of the chunks' k^T v, so no loop is left.
float16 and bfloat16 inputs are computed in float32 and returned in their own dtype.
"""

import torch
import torch.nn.functional as F

from mha import validate
from mha.torch.tensors import check_is_tensor, check_tensor


def work_dtype(dtype):
    """The dtype the arithmetic runs in: float32 for half inputs, else the input's own."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def elu_feature_map(x):
    """elu(x) + 1, elementwise: positive features (x + 1 where x > 0, exp(x) where x <= 0)."""
    check_is_tensor("x", x)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    return torch.where(x > 0, x + 1, x.clamp(max=0).exp())  # exp(x) itself, not (exp(x) - 1) + 1


def check_floats(**tensors):
    for name, x in tensors.items():
        check_is_tensor(name, x)
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_step(state, q, k, v):
    """state (..., d_k, d_v), q and k (..., d_k), v (..., d_v), with shapes that agree."""
    check_floats(state=state, q=q, k=k, v=v)
    if state.dim() < 2 or q.dim() < 1 or k.dim() < 1 or v.dim() < 1 or q.shape[-1] != state.shape[-2] \
            or k.shape[-1] != state.shape[-2] or v.shape[-1] != state.shape[-1]:
        raise ValueError(f"state must have shape (..., d_k, d_v), q and k (..., d_k), v (..., d_v), got state "
                         f"{validate.shape_str(state.shape)}, q {validate.shape_str(q.shape)}, "
                         f"k {validate.shape_str(k.shape)}, v {validate.shape_str(v.shape)}")


def linear_attention_step(state, q, k, v):
    """One token of causal linear attention: new_state = state + k^T v, out = q @ new_state.
    state (..., d_k, d_v), q and k (..., d_k), v (..., d_v). Returns (out (..., d_v), new_state)."""
    check_step(state, q, k, v)
    new_state = state + k.unsqueeze(-1) * v.unsqueeze(-2)  # (..., d_k, d_v): the outer product k^T v
    return (q.unsqueeze(-2) @ new_state).squeeze(-2), new_state  # (..., d_v), (..., d_k, d_v)


def check_sequences(q, k, v):
    """q and k (..., T, d_k), v (..., T, d_v), with the same (..., T)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x)
    if q.shape != k.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"q and k must have one shape (..., T, d_k) and v (..., T, d_v) with the same (..., T), "
                         f"got q {validate.shape_str(q.shape)}, k {validate.shape_str(k.shape)}, "
                         f"v {validate.shape_str(v.shape)}")


def start_state(initial_state, k, v, dtype):
    """The state before the first token, in `dtype`: zeros (..., d_k, d_v) or `initial_state`, checked."""
    shape = k.shape[:-2] + (k.shape[-1], v.shape[-1])
    if initial_state is None:
        return torch.zeros(shape, dtype=dtype, device=k.device)
    check_floats(initial_state=initial_state)
    if initial_state.shape != shape:
        raise ValueError(f"initial_state must have shape (..., d_k, d_v) = {validate.shape_str(shape)}, "
                         f"got {validate.shape_str(initial_state.shape)}")
    return initial_state.to(dtype)


def linear_attention_recurrent(q, k, v, *, initial_state=None):
    """Causal linear attention as a loop of `linear_attention_step`. q, k (..., T, d_k), v (..., T, d_v),
    initial_state (..., d_k, d_v) or None. Returns (out (..., T, d_v), state (..., d_k, d_v))."""
    check_sequences(q, k, v)
    dtype, work = q.dtype, work_dtype(q.dtype)
    state = start_state(initial_state, k, v, work)
    q, k, v = q.to(work), k.to(work), v.to(work)
    outs = []
    for t in range(q.shape[-2]):
        out, state = linear_attention_step(state, q[..., t, :], k[..., t, :], v[..., t, :])
        outs.append(out)
    return torch.stack(outs, dim=-2).to(dtype), state  # (..., T, d_v), (..., d_k, d_v)


def linear_attention_parallel(q, k, v):
    """Causal linear attention with the T x T matrix: ((q @ k^T) masked to j <= i) @ v. Returns (..., T, d_v)."""
    check_sequences(q, k, v)
    dtype, work = q.dtype, work_dtype(q.dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    T = q.shape[-2]
    scores = q @ k.transpose(-1, -2)  # (..., T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T): j <= i
    return (scores.masked_fill(~causal, 0) @ v).to(dtype)  # (..., T, d_v)


def to_chunks(x, chunk_size):
    """(..., T, d) padded with zero rows to n * chunk_size, as (..., n, chunk_size, d)."""
    pad = -x.shape[-2] % chunk_size
    x = F.pad(x, (0, 0, 0, pad))  # (..., n * C, d)
    return x.reshape(*x.shape[:-2], -1, chunk_size, x.shape[-1])  # (..., n, C, d)


def linear_attention_chunked(q, k, v, *, chunk_size=64, initial_state=None):
    """Causal linear attention in chunks of `chunk_size` tokens: inside each chunk the masked parallel form,
    plus the read of the state at the chunk's start. Any T (the last chunk padded with zeros, which add
    nothing). Returns (out (..., T, d_v), state (..., d_k, d_v))."""
    check_sequences(q, k, v)
    chunk_size = validate.check_int("chunk_size", chunk_size, minimum=1)
    dtype, work, T = q.dtype, work_dtype(q.dtype), q.shape[-2]
    state = start_state(initial_state, k, v, work)
    q, k, v = (to_chunks(x.to(work), chunk_size) for x in (q, k, v))  # (..., n, C, d)
    writes = k.transpose(-1, -2) @ v  # (..., n, d_k, d_v): each chunk's sum of k^T v
    after = state.unsqueeze(-3) + writes.cumsum(dim=-3)  # (..., n, d_k, d_v): the state after each chunk
    before = torch.cat([state.unsqueeze(-3), after[..., :-1, :, :]], dim=-3)  # (..., n, d_k, d_v)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()  # (C, C)
    inside = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0) @ v  # (..., n, C, d_v)
    out = q @ before + inside  # (..., n, C, d_v)
    out = out.reshape(*out.shape[:-3], -1, out.shape[-1])[..., :T, :]  # (..., T, d_v)
    return out.to(dtype), after[..., -1, :, :]
