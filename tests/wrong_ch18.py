"""Wrong solutions of chapter 18's exercises, as learners write them, for tests/test_checks_ch18.py: each with the
words of the hint it must get and the named case it must fail on (TRAPPED), or with the words of its message where no
hint fits (a NumPy error, an input changed in place, the route: MESSAGES)."""

import numpy as np

from solutions_ch18 import CHAPTER_18, gated_delta_update

from mha.checks.registry import CHECKS, DTYPE_HINT

STEP, UPDATE, CHUNK = CHAPTER_18


def step_written(*, read_old=False, write=None, read=None, scale=1.0):
    """A linear attention step as a learner writes it, with one step changed."""
    def solution(state, q, k, v):
        new_state = state + (write(k, v) if write else np.einsum("...i,...j->...ij", k, v))
        seen = state if read_old else new_state
        out = read(q, seen) if read else (q[..., None, :] @ seen)[..., 0, :]
        return out * scale, new_state
    return solution


def step_new_token_only(state, q, k, v):
    return np.sum(q * k, axis=-1, keepdims=True) * v, state + k[..., :, None] * v[..., None, :]


def step_with_np_outer(state, q, k, v):
    new_state = state + np.outer(k, v)  # flattens the batch axes
    return (q[..., None, :] @ new_state)[..., 0, :], new_state


def step_in_place(state, q, k, v):
    state += k[..., :, None] * v[..., None, :]
    return (q[..., None, :] @ state)[..., 0, :], state


def step_out_only(state, q, k, v):
    return (q[..., None, :] @ (state + k[..., :, None] * v[..., None, :]))[..., 0, :]


def update_written(*, decay=None, axes=True, decay_after=False, predict_old=False, k_beta=False, error=True):
    """A gated delta update as a learner writes it, with one step changed."""
    def solution(state, k, v, g, beta):
        a = 1.0 if g is None else (decay or np.exp)(g)
        a, b = (np.asarray(a)[..., None, None], beta[..., None]) if axes else (a, beta)
        decayed = state if decay_after else a * state
        predicted = np.einsum("...k,...kv->...v", k, state if predict_old else decayed)
        key = b * k if k_beta else k
        written = decayed + key[..., :, None] * (b * (v - predicted) if error else b * v)[..., None, :]
        return a * written if decay_after else written
    return solution


def update_ignores_none(state, k, v, g, beta):
    decayed = np.exp(g)[..., None, None] * state  # g = None: TypeError
    return decayed + k[..., :, None] * (beta[..., None] * (v - (k[..., None, :] @ decayed)[..., 0, :]))[..., None, :]


def update_in_place(state, k, v, g, beta):
    if g is not None:
        state *= np.exp(g)[..., None, None]
    state += k[..., :, None] * (beta[..., None] * (v - (k[..., None, :] @ state)[..., 0, :]))[..., None, :]
    return state


def chunk_written(*, first_order=False, eye_dtype=None, how="difference", exclusive=False, with_state=True):
    """A gated delta chunk as a learner writes it (the WY form, no loop), with one step changed."""
    def solution(state, q, k, v, g, beta):
        C = k.shape[-2]
        G = np.zeros_like(beta) if g is None else np.cumsum(g, axis=-1)
        G = G - g if exclusive and g is not None else G
        low = np.tril(np.ones((C, C), dtype=bool))
        if how == "quotient":
            D = np.where(low, np.exp(G)[..., :, None] / np.exp(G)[..., None, :], 0)
        elif how == "masked after exp":
            D = np.exp(G[..., :, None] - G[..., None, :]) * low
        else:
            D = np.where(low, np.exp(np.where(low, G[..., :, None] - G[..., None, :], 0)), 0)
        A = np.tril(beta[..., :, None] * D * (k @ np.swapaxes(k, -1, -2)), -1)
        eye = np.eye(C, dtype=k.dtype if eye_dtype is None else eye_dtype)
        S0 = state if with_state else np.zeros_like(state)
        rhs = beta[..., None] * (v - np.exp(G)[..., None] * (k @ S0))
        u = (eye - A) @ rhs if first_order else np.linalg.solve(eye + A, rhs)
        out = np.exp(G)[..., None] * (q @ S0) + (D * (q @ np.swapaxes(k, -1, -2))) @ u
        end = np.exp(G[..., -1:] - G)[..., None] * k
        return out, np.exp(G[..., -1])[..., None, None] * S0 + np.swapaxes(end, -1, -2) @ u
    return solution


def chunk_token_by_token(state, q, k, v, g, beta):
    """Right answers by the recurrence: the rule refuses the loop."""
    outs = []
    for t in range(k.shape[-2]):
        state = gated_delta_update(state, k[..., t, :], v[..., t, :], None if g is None else g[..., t], beta[..., t])
        outs.append((q[..., t, None, :] @ state)[..., 0, :])
    return np.stack(outs, axis=-2), state


def chunk_by_reduce(state, q, k, v, g, beta):
    """Right answers by the recurrence, looped by functools.reduce instead of a for statement: refused too."""
    from functools import reduce

    def step(carry, t):
        S, outs = carry
        S = gated_delta_update(S, k[..., t, :], v[..., t, :], None if g is None else g[..., t], beta[..., t])
        return S, outs + [(q[..., t, None, :] @ S)[..., 0, :]]

    state, outs = reduce(step, range(k.shape[-2]), (state, []))
    return np.stack(outs, axis=-2), state


def chunk_with_forward_substitution(state, q, k, v, g, beta):
    """The WY form, but the triangular system solved row by row in a loop: the rule refuses it too."""
    C = k.shape[-2]
    G = np.zeros_like(beta) if g is None else np.cumsum(g, axis=-1)
    low = np.tril(np.ones((C, C), dtype=bool))
    D = np.where(low, np.exp(np.where(low, G[..., :, None] - G[..., None, :], 0)), 0)
    A = np.tril(beta[..., :, None] * D * (k @ np.swapaxes(k, -1, -2)), -1)
    rhs = beta[..., None] * (v - np.exp(G)[..., None] * (k @ state))
    u = rhs.copy()
    for t in range(1, C):
        u[..., t, :] = rhs[..., t, :] - (A[..., t, None, :t] @ u[..., :t, :])[..., 0, :]
    out = np.exp(G)[..., None] * (q @ state) + (D * (q @ np.swapaxes(k, -1, -2))) @ u
    end = np.exp(G[..., -1:] - G)[..., None] * k
    return out, np.exp(G[..., -1])[..., None, None] * state + np.swapaxes(end, -1, -2) @ u


FIRST_STEP, FIRST_UPDATE, FIRST_CHUNK = (CHECKS[n].named_cases(0)[0].label for n in CHAPTER_18)
STRONG_64, STRONG_32 = "strong decays: g in -100.5", "float32, strong decays"
# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    (STEP, step_written(read_old=True), "read after the write", FIRST_STEP),
    (STEP, step_written(read=lambda q, S: q @ S), "with batch axes", FIRST_STEP),
    (STEP, step_written(scale=2.0), None, FIRST_STEP),  # no catalogued mistake doubles the output: no hint
    (STEP, step_new_token_only, "not (q . k) v", FIRST_STEP),
    (STEP, step_written(write=lambda k, v: np.einsum("...i,...j->...ji", k, v)), "not v^T k", FIRST_STEP),
    (STEP, step_written(read=lambda q, S: np.einsum("...kv,...v->...k", S, q)), "S @ q sums", FIRST_STEP),
    (UPDATE, update_written(axes=False), "give them new axes", FIRST_UPDATE),
    (UPDATE, update_written(decay_after=True), "decay first", FIRST_UPDATE),
    (UPDATE, update_written(predict_old=True), "predict from the decayed state", FIRST_UPDATE),
    (UPDATE, update_written(k_beta=True), "beta once", FIRST_UPDATE),
    (UPDATE, update_written(decay=lambda g: g), "not by g itself", FIRST_UPDATE),
    (UPDATE, update_written(decay=lambda g: 1 - np.exp(g)), None, FIRST_UPDATE),
    (UPDATE, update_written(error=False), "writes the ERROR", FIRST_UPDATE),
    (UPDATE, update_written(decay=lambda g: np.exp(g.astype(np.float64))), DTYPE_HINT, "float32 inputs"),
    (CHUNK, chunk_written(first_order=True), "not I - A", FIRST_CHUNK),
    (CHUNK, chunk_written(with_state=False), None, FIRST_CHUNK),  # two parts left out at once: no one hint
    (CHUNK, chunk_written(exclusive=True), "inclusive", FIRST_CHUNK),
    (CHUNK, chunk_written(how="quotient"), "never exp(G_t) / exp(G_i)", STRONG_64),
    (CHUNK, chunk_written(how="masked after exp"), "mask before exp", STRONG_32),
    (CHUNK, chunk_written(eye_dtype=np.float64), DTYPE_HINT, STRONG_32),
]

# (check, wrong solution, words of its message, the fixed named case it fails on)
MESSAGES = [
    (STEP, step_with_np_outer, "raised ValueError", FIRST_STEP),
    (STEP, step_in_place, "state was changed in place", FIRST_STEP),
    (STEP, step_out_only, "expected a tuple (out, new_state), got ndarray", FIRST_STEP),
    (UPDATE, update_ignores_none, "raised TypeError", "g = None"),
    (UPDATE, update_in_place, "state was changed in place", FIRST_UPDATE),
]

# Right answers by a route that the chunk's rule refuses: the words of the rule's message.
LOOPS = [chunk_token_by_token, chunk_with_forward_substitution, chunk_by_reduce]
