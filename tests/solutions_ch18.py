"""Right solutions of chapter 18's exercises written from scratch, for the tests of their checks
(tests/test_checks_ch18.py, and the gathering of right solutions in tests/learners.py), and what those tests share:
running a check, its failures on every seed, a named case by its words, the cases of several seeds.

The recurrence they all follow (a state S of shape (..., d_k, d_v); a token reads with q @ S, writes k^T v):
linear attention S_t = S_{t-1} + k_t^T v_t, o_t = q_t S_t (Katharopoulos et al., 2020); the gated delta rule
S_t = exp(g_t) S_{t-1} + beta_t k_t^T (v_t - k_t exp(g_t) S_{t-1}) (Schlag et al., 2021; Yang et al., 2025), whose
chunk of C tokens is computed at once in the WY form (Yang et al., 2024): one triangular solve gives the values
actually written, u = (I + A)^-1 beta (v - Gamma k S_0)."""

import numpy as np

from learners import SEEDS, all_cases, failures_on_every_seed, labelled, run  # noqa: F401 (the tests import them here)

CHAPTER_18 = ["linear_attention_step", "gated_delta_update", "gated_delta_chunk"]


# linear_attention_step: NumPy only -------------------------------------------------------------------------------


def linear_attention_step(state, q, k, v):
    """Write k^T v (an outer product), then read with q: einsum."""
    new_state = state + np.einsum("...k,...v->...kv", k, v)  # (..., d_k, d_v)
    return np.einsum("...k,...kv->...v", q, new_state), new_state  # (..., d_v)


def linear_attention_step_by_matmul(state, q, k, v):
    """The same with @: k as a column (..., d_k, 1), v and q as rows (..., 1, d)."""
    new_state = state + k[..., :, None] @ v[..., None, :]  # (..., d_k, d_v)
    return (q[..., None, :] @ new_state)[..., 0, :], new_state  # (..., d_v)


# gated_delta_update: NumPy only ----------------------------------------------------------------------------------


def gated_delta_update(state, k, v, g, beta):
    """Decay, predict what the state holds for k, write beta times the error at k."""
    decayed = state if g is None else np.exp(g)[..., None, None] * state  # (..., d_k, d_v)
    error = v - np.einsum("...k,...kv->...v", k, decayed)  # (..., d_v)
    return decayed + np.einsum("...k,...v->...kv", k, beta[..., None] * error)


def gated_delta_update_as_a_projection(state, k, v, g, beta):
    """S' = (I - beta k^T k) exp(g) S + beta k^T v: the old content along k is partly erased, then written."""
    d_k = k.shape[-1]
    b = np.asarray(beta)[..., None, None]  # (..., 1, 1)
    erase = np.eye(d_k, dtype=k.dtype) - b * (k[..., :, None] * k[..., None, :])  # (..., d_k, d_k)
    decay = 1 if g is None else np.exp(np.asarray(g))[..., None, None]
    return erase @ (decay * state) + b * (k[..., :, None] * v[..., None, :])


# gated_delta_chunk: NumPy only, no loop over the tokens -----------------------------------------------------------


def gated_delta_chunk(state, q, k, v, g, beta):
    """The WY form: the values actually written u solve (I + A) u = beta (v - Gamma k S_0), A_ti = beta_t
    Gamma_t / Gamma_i k_t . k_i below the diagonal; outputs and the new state are products with u."""
    C = k.shape[-2]
    below, on_and_below = np.tril(np.ones((C, C), bool), -1), np.tril(np.ones((C, C), bool))
    G = np.zeros(k.shape[:-1], k.dtype) if g is None else np.cumsum(g, axis=-1)  # (..., C): log Gamma_t
    log_ratio = G[..., :, None] - G[..., None, :]  # (..., C, C): log Gamma_t / Gamma_i
    ratio = np.exp(np.where(on_and_below, log_ratio, 0)) * on_and_below  # never exp of a large positive
    A = beta[..., :, None] * ratio * below * (k @ np.swapaxes(k, -1, -2))  # (..., C, C)
    right = beta[..., None] * (v - np.exp(G)[..., None] * (k @ state))  # (..., C, d_v)
    u = np.linalg.solve(np.eye(C, dtype=k.dtype) + A, right)  # (..., C, d_v)
    out = np.exp(G)[..., None] * (q @ state) + (ratio * (q @ np.swapaxes(k, -1, -2))) @ u  # (..., C, d_v)
    to_end = np.exp(G[..., -1:] - G)  # (..., C): Gamma_C / Gamma_i
    new_state = np.exp(G[..., -1])[..., None, None] * state + np.swapaxes(to_end[..., None] * k, -1, -2) @ u
    return out, new_state


def gated_delta_chunk_by_the_ut_transform(state, q, k, v, g, beta):
    """fla's arrangement: T = (I + A)^-1 once (np.linalg.inv), w = T (beta Gamma k) and u = T (beta v), the written
    values u - w S_0; einsum throughout, no exp of a positive number."""
    C = k.shape[-2]
    G = np.zeros(beta.shape, k.dtype) if g is None else np.cumsum(g, axis=-1)  # (..., C)
    diff = G[..., :, None] - G[..., None, :]  # (..., C, C)
    causal = np.arange(C)[:, None] >= np.arange(C)[None, :]  # i <= t
    decay = np.where(causal, np.exp(np.minimum(diff, 0)), 0).astype(k.dtype)  # (..., C, C)
    strict = causal & (np.arange(C)[:, None] != np.arange(C)[None, :])
    A = np.where(strict, beta[..., :, None] * decay * np.einsum("...td,...id->...ti", k, k), 0)
    T = np.linalg.inv(np.eye(C, dtype=k.dtype) + A)  # (..., C, C)
    w = np.einsum("...ti,...id->...td", T, (beta * np.exp(G))[..., None] * k)  # (..., C, d_k)
    u = np.einsum("...ti,...iv->...tv", T, beta[..., None] * v) - np.einsum("...td,...dv->...tv", w, state)
    out = (np.exp(G)[..., None] * np.einsum("...td,...dv->...tv", q, state)
           + np.einsum("...ti,...iv->...tv", decay * np.einsum("...td,...id->...ti", q, k), u))
    last = np.exp(G[..., -1])  # (...,)
    new_state = (last[..., None, None] * state
                 + np.einsum("...id,...iv->...dv", np.exp(G[..., -1:] - G)[..., None] * k, u))
    return out, new_state


def gated_delta_chunk_token_by_token(state, q, k, v, g, beta):
    """Right answers, the wrong route: C steps of the recurrence (the check's rule refuses the loop)."""
    outs = []
    for t in range(k.shape[-2]):
        state = gated_delta_update(state, k[..., t, :], v[..., t, :], None if g is None else g[..., t],
                                   beta[..., t])
        outs.append(np.einsum("...k,...kv->...v", q[..., t, :], state))
    return np.stack(outs, axis=-2), state


FROM_SCRATCH = [linear_attention_step, linear_attention_step_by_matmul, gated_delta_update,
                gated_delta_update_as_a_projection, gated_delta_chunk, gated_delta_chunk_by_the_ut_transform]
