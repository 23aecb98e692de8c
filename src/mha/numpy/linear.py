"""Linear attention (chapter 18): attention without the T x T matrix (Katharopoulos et al., 2020,
"Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention").

Drop the softmax and the output of query i is q_i @ (sum_{j <= i} k_j^T v_j): the sum in brackets is a
d_k x d_v matrix, the state S, which every token updates with one outer product and reads with one
vector-matrix product. Three ways to compute the same numbers:

    recurrent   a loop over tokens: S <- S + k_t^T v_t, out_t = q_t @ S        (fixed memory, T steps)
    parallel    ((Q K^T) masked to j <= i) @ V                                   (the T x T matrix again)
    chunked     within a chunk of C tokens the parallel form, across chunks the state

Katharopoulos et al. divide by q_i @ (sum_j k_j^T); today's linear attentions (Gated DeltaNet among them)
leave that normaliser out and normalise the output instead, so it is left out here. The feature map
(elu + 1, positive features) is applied by the caller: these functions take q and k as they are.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array


def elu_feature_map(x):
    """elu(x) + 1, elementwise: x + 1 where x > 0, exp(x) where x <= 0. Always positive."""
    x = as_float_array("x", x)
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def check_step(state, q, k, v):
    """state (..., d_k, d_v), q and k (..., d_k), v (..., d_v) as float arrays with shapes that agree."""
    state, q, k, v = (as_float_array(n, a) for n, a in (("state", state), ("q", q), ("k", k), ("v", v)))
    if state.ndim < 2 or q.ndim < 1 or k.ndim < 1 or v.ndim < 1:
        raise ValueError(f"state must have shape (..., d_k, d_v) and q, k, v (..., d), got state "
                         f"{validate.shape_str(state.shape)}, q {validate.shape_str(q.shape)}, "
                         f"k {validate.shape_str(k.shape)}, v {validate.shape_str(v.shape)}")
    d_k, d_v = state.shape[-2:]
    if q.shape[-1] != d_k or k.shape[-1] != d_k or v.shape[-1] != d_v:
        raise ValueError(f"state has shape {validate.shape_str(state.shape)}, so q and k need width d_k={d_k} "
                         f"and v width d_v={d_v}, got q {validate.shape_str(q.shape)}, "
                         f"k {validate.shape_str(k.shape)}, v {validate.shape_str(v.shape)}")
    return state, q, k, v


def linear_attention_step(state, q, k, v):
    """One token of causal linear attention. state (..., d_k, d_v), q and k (..., d_k), v (..., d_v).
    Writes first, then reads: new_state = state + k^T v (an outer product), out = q @ new_state.
    Returns (out (..., d_v), new_state (..., d_k, d_v))."""
    state, q, k, v = check_step(state, q, k, v)
    new_state = state + k[..., :, None] * v[..., None, :]  # (..., d_k, d_v): k^T v, one outer product
    out = (q[..., None, :] @ new_state)[..., 0, :]  # (..., d_v): the row vector q times the state
    return out, new_state


def check_sequences(q, k, v):
    """q and k (..., T, d_k), v (..., T, d_v), with the same leading shape and length."""
    q, k, v = (as_float_array(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    for name, a in (("q", q), ("k", k), ("v", v)):
        validate.check_sequence(name, a)
    if q.shape != k.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"q and k must have one shape (..., T, d_k) and v (..., T, d_v) with the same (..., T), "
                         f"got q {validate.shape_str(q.shape)}, k {validate.shape_str(k.shape)}, "
                         f"v {validate.shape_str(v.shape)}")
    return q, k, v


def start_state(initial_state, k, v):
    """The state before the first token: zeros (..., d_k, d_v), or `initial_state` checked against k and v."""
    shape = k.shape[:-2] + (k.shape[-1], v.shape[-1])
    dtype = np.result_type(k.dtype, v.dtype)
    if initial_state is None:
        return np.zeros(shape, dtype=dtype)
    state = as_float_array("initial_state", initial_state)
    if state.shape != shape:
        raise ValueError(f"initial_state must have shape (..., d_k, d_v) = {validate.shape_str(shape)}, "
                         f"got {validate.shape_str(state.shape)}")
    return state


def check_chunk_size(chunk_size):
    return validate.check_int("chunk_size", chunk_size, minimum=1)


def linear_attention_recurrent(q, k, v, *, initial_state=None):
    """Causal linear attention as a recurrence: a loop of `linear_attention_step` over the T tokens.
    q, k (..., T, d_k) (features already applied), v (..., T, d_v), initial_state (..., d_k, d_v) or None
    (zeros). Returns (out (..., T, d_v), state (..., d_k, d_v) after the last token)."""
    q, k, v = check_sequences(q, k, v)
    state = start_state(initial_state, k, v)
    outs = []
    for t in range(q.shape[-2]):
        out, state = linear_attention_step(state, q[..., t, :], k[..., t, :], v[..., t, :])
        outs.append(out)
    return np.stack(outs, axis=-2), state  # (..., T, d_v)


def linear_attention_parallel(q, k, v):
    """Causal linear attention with the T x T matrix: ((q @ k^T) masked to j <= i) @ v.
    q, k (..., T, d_k), v (..., T, d_v). Returns out (..., T, d_v)."""
    q, k, v = check_sequences(q, k, v)
    T = q.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2)  # (..., T, T): q_i . k_j, no softmax
    causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T): j <= i
    return np.where(causal, scores, 0) @ v  # (..., T, d_v)


def linear_attention_chunked(q, k, v, *, chunk_size=64, initial_state=None):
    """Causal linear attention in chunks of `chunk_size` tokens (the last one may be shorter): inside a
    chunk the parallel form, plus each query's read of the state left by the chunks before; then the
    chunk's keys and values are added to the state. Returns (out (..., T, d_v), state (..., d_k, d_v))."""
    q, k, v = check_sequences(q, k, v)
    chunk_size = check_chunk_size(chunk_size)
    state = start_state(initial_state, k, v)
    outs = []
    for start in range(0, q.shape[-2], chunk_size):
        part = slice(start, start + chunk_size)
        q_c, k_c, v_c = q[..., part, :], k[..., part, :], v[..., part, :]  # (..., C, d)
        inside = linear_attention_parallel(q_c, k_c, v_c)  # (..., C, d_v): j in this chunk, j <= i
        outs.append(q_c @ state + inside)  # (..., C, d_v): plus every j of the earlier chunks
        state = state + np.swapaxes(k_c, -1, -2) @ v_c  # (..., d_k, d_v): the chunk's C outer products
    return np.concatenate(outs, axis=-2), state  # (..., T, d_v)
