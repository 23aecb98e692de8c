"""Chapter 18, attention without the T x T matrix: the check of `gated_delta_chunk`, one chunk of C tokens of the gated
delta rule in the parallel (WY) form, its cases and its catalogued mistakes. (The chapter's other checks are in
`mha.checks.ch18`.)

With Gamma_t = exp(g_1 + ... + g_t) (the decay from the chunk's start to token t), the values actually written u
solve (I + A) u = beta (v - Gamma k S_0), A_ti = beta_t (Gamma_t / Gamma_i) k_t . k_i below the diagonal; then
out_t = Gamma_t q_t S_0 + sum_{i <= t} (Gamma_t / Gamma_i) (q_t . k_i) u_i and S_C = Gamma_C S_0 + sum_i (Gamma_C /
Gamma_i) k_i^T u_i (Yang et al., 2024 and 2025). The first named case holds every trap at once, whatever the seed:
C = 5 (I - A is not (I + A)^-1 once C >= 3), a state from earlier chunks (the inter-chunk part), decays and write
strengths that differ from token to token (the decay inside the chunk; beta of the row, not the column), d_k != d_v.
Two cases of strong decays refuse ratios of exponentials (float64, g about -100: exp of the cumulated g
underflows, 0 / 0) and a mask applied after exp (float32, g in -25 .. -15: exp of G_t - G_i above the diagonal
overflows, inf * 0). The text asks for no loop over the tokens: a rule (mha.checks.rules) refuses one, since C steps
of the recurrence give the same answers.
"""

import numpy as np

from mha.checks.inputs import batch, normal, sizes
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import GATED_DELTA_CHUNK_FORBIDS
from mha.checks.rules import GATED_DELTA_CHUNK_RULES


def unit_keys(k):
    """k divided by its length along the last axis (keys of unit length, as the models' L2 norm makes them)."""
    return k / np.sqrt((k * k).sum(axis=-1, keepdims=True))


def chunk_inputs(r, lead, C, d_k, d_v, dtype=np.float64, *, empty=False, decay=(-1.5, -0.1), unit=True):
    """(state, q, k, v, g, beta): a state (*lead, d_k, d_v) from earlier chunks (zeros with empty=True), q, k
    (*lead, C, d_k) (k of unit length with unit=True; q scaled by 1 / sqrt(d_k), as the models do), v (*lead, C, d_v),
    log decays g (*lead, C) drawn from `decay` (None for no decay), write strengths beta (*lead, C) in 0.2 .. 0.9."""
    state = np.zeros(lead + (d_k, d_v), dtype) if empty else normal(r, lead + (d_k, d_v), dtype, 0.7)
    q, k = normal(r, lead + (C, d_k), dtype, d_k ** -0.5), normal(r, lead + (C, d_k), dtype)
    v = normal(r, lead + (C, d_v), dtype)
    g = None if decay is None else r.uniform(*decay, lead + (C,)).astype(dtype)
    return state, q, unit_keys(k) if unit else k, v, g, r.uniform(0.2, 0.9, lead + (C,)).astype(dtype)


@cases_for("gated_delta_chunk", returns=("out", "new_state"), forbids=GATED_DELTA_CHUNK_FORBIDS, float32_promised=True,
           may_use="NumPy, nothing from mha", rules=GATED_DELTA_CHUNK_RULES)
def gated_delta_chunk_cases(r):
    """Every trap first (C = 5, a state, varied g and beta, d_k != d_v), one token, an empty state, no decay, no batch
    axis with a longer chunk, strong decays (exp(G) underflows; in float32 exp(G_t - G_i) above the diagonal
    overflows as well), float32."""
    return [
        Case("2 sequences of 3 heads, a chunk of C = 5 tokens, d_k = 4, d_v = 3, a state from earlier chunks, g in "
             "-1.5 .. -0.1 and beta in 0.2 .. 0.9 token by token", chunk_inputs(r, (2, 3), 5, 4, 3)),
        Case("C = 1: one token, one step of the recurrence", chunk_inputs(r, (2,), 1, 3, 4)),
        Case("an empty state (zeros): the first chunk", chunk_inputs(r, (2,), 4, 3, 2, empty=True)),
        Case("g = None: no decay (DeltaNet)", chunk_inputs(r, (2,), 4, 2, 3, decay=None)),
        Case("no batch axis, C = 8, d_k = 6, d_v = 2, keys not normalised", chunk_inputs(r, (), 8, 6, 2, unit=False)),
        Case("strong decays: g in -100.5 .. -99.5 over C = 8 tokens (exp of their sum, about -800, underflows to 0)",
             chunk_inputs(r, (2,), 8, 3, 2, decay=(-100.5, -99.5))),
        Case("float32, strong decays: g in -25 .. -15 over C = 8 tokens (exp of their sum underflows, exp of "
             "G_t - G_i above the diagonal overflows)", chunk_inputs(r, (2,), 8, 3, 3, np.float32, decay=(-25, -15))),
        Case("float32 inputs: float32 answers", chunk_inputs(r, (2,), 6, 4, 3, np.float32)),
    ]


@random_cases_for("gated_delta_chunk")
def gated_delta_chunk_random_cases(r):
    """A 4-D batch of random sizes, float32 without a batch axis, and no decay."""
    C, d_k, d_v = sizes(r, 3, 1, 7)
    return [
        Case("random: a 4-D batch (B, B', h, C, d)", chunk_inputs(r, batch(r, 2), C, d_k, d_v)),
        Case("random: float32, no batch axis", chunk_inputs(r, (), C + 1, d_k, d_v, np.float32)),
        Case("random: g = None", chunk_inputs(r, batch(r, 1), C + 2, d_k, d_v, decay=None)),
    ]


def T(x):
    """x with its last two axes swapped."""
    return np.swapaxes(x, -1, -2)


def cumulated(g, beta, exclusive=False):
    """log Gamma (..., C): the cumulated log decays (zeros without decay); exclusive=True leaves token t's own out."""
    if g is None:
        return np.zeros(beta.shape, beta.dtype)
    G = np.cumsum(g, axis=-1)
    return G - g if exclusive else G


def ratios(G, how="difference"):
    """(..., C, C): Gamma_t / Gamma_i on and below the diagonal, 0 above; `how` says how a mistake computes it."""
    C = G.shape[-1]
    on_and_below = np.tril(np.ones((C, C), dtype=bool))
    if how == "quotient":
        return np.where(on_and_below, np.exp(G)[..., :, None] / np.exp(G)[..., None, :], 0)
    elif how == "masked after exp":
        whole = np.exp(G[..., :, None] - G[..., None, :])
    elif how == "inverted":
        whole = np.exp(np.where(on_and_below, G[..., None, :] - G[..., :, None], 0))
    elif how == "none":
        whole = np.ones(G.shape + (C,), G.dtype)
    else:
        whole = np.exp(np.where(on_and_below, G[..., :, None] - G[..., None, :], 0))
    return whole * on_and_below


def chunk(state, q, k, v, g, beta, *, exclusive=False, how="difference", A_decay=True, out_decay=True, row_beta=True,
          A_diagonal=False, solve="solve", state_in_u=True, state_in_out="per token", out_diagonal=True,
          end_ratio=True, end_decay=True):
    """The WY form, right with the defaults; each keyword changes one step as a mistake does."""
    C = k.shape[-2]
    G = cumulated(g, beta, exclusive)
    R = ratios(G, how)  # (..., C, C)
    below = np.tril(np.ones((C, C), dtype=bool), 0 if A_diagonal else -1)
    b = beta[..., :, None] if row_beta else beta[..., None, :]
    A = np.where(below, b * (R if A_decay else 1) * (k @ T(k)), 0)  # (..., C, C)
    Gamma = np.exp(G)[..., None]  # (..., C, 1)
    right = beta[..., None] * (v - Gamma * (k @ state) if state_in_u else v)  # (..., C, d_v)
    eye = np.eye(C, dtype=k.dtype)
    u = np.linalg.solve(eye + A, right) if solve == "solve" else (eye - A) @ right  # (..., C, d_v)
    mask = np.tril(np.ones((C, C), dtype=bool), 0 if out_diagonal else -1)
    attend = (R if out_decay else np.tril(np.ones((C, C), k.dtype))) * mask * (q @ T(k))  # (..., C, C)
    earlier = {"per token": Gamma * (q @ state), "undecayed": q @ state, "none": 0.0}[state_in_out]
    out = earlier + attend @ u
    to_end = np.exp(G[..., -1:] - G) if end_ratio else np.ones_like(G)  # (..., C)
    start = np.exp(G[..., -1])[..., None, None] * state if end_decay else state
    return out, start + T(to_end[..., None] * k) @ u


@mistake("gated_delta_chunk", "mask before exp: above the diagonal G_t - G_i is positive and large with strong decays, "
         "exp overflows to inf, and inf * 0 is NaN (take exp of np.where(mask, G_t - G_i, 0))")
def chunk_masked_after_exp(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, how="masked after exp")


@mistake("gated_delta_chunk", "take exp of the difference G_t - G_i, never exp(G_t) / exp(G_i): with strong decays "
         "exp(G) underflows to 0, and 0 / 0 is NaN")
def chunk_quotient_of_exponentials(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, how="quotient")


@mistake("gated_delta_chunk", "solve the triangular system (I + A) u = ... (np.linalg.solve): (I + A)^-1 is not I - A "
         "once C >= 3, it holds A^2, A^3, ... too (token 3 feels token 1 through what token 2 wrote)")
def chunk_first_order_inverse(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, solve="I - A")


@mistake("gated_delta_chunk", "decay inside the chunk: token t reads token i's write decayed by Gamma_t / Gamma_i = "
         "exp(G_t - G_i), G the cumulative sum of g; the output's q_t . k_i needs that factor")
def chunk_no_decay_in_the_output(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, out_decay=False)


@mistake("gated_delta_chunk", "decay inside A too: A_ti = beta_t (Gamma_t / Gamma_i) k_t . k_i, since token t "
         "predicts from what token i wrote, decayed since")
def chunk_no_decay_in_A(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, A_decay=False)


@mistake("gated_delta_chunk", "add the earlier chunks' part of the output: Gamma_t q_t S_0, the state from before the "
         "chunk decayed to token t")
def chunk_without_the_state_in_the_output(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, state_in_out="none")


@mistake("gated_delta_chunk", "the state from before the chunk reaches token t decayed by Gamma_t = exp(g_1 + ... + "
         "g_t): the output's first part is Gamma_t q_t S_0, not q_t S_0")
def chunk_state_undecayed_in_the_output(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, state_in_out="undecayed")


@mistake("gated_delta_chunk", "each token writes its error against what the state already holds: the right side is "
         "beta (v - Gamma k S_0), not beta v")
def chunk_without_the_state_in_u(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, state_in_u=False)


@mistake("gated_delta_chunk", "the new state weighs token i's write by Gamma_C / Gamma_i, its decay to the chunk's "
         "end: S_C = Gamma_C S_0 + sum_i (Gamma_C / Gamma_i) k_i^T u_i")
def chunk_end_without_ratios(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, end_ratio=False)


@mistake("gated_delta_chunk", "decay the old state over the whole chunk: S_C = Gamma_C S_0 + ..., with Gamma_C = "
         "exp(g_1 + ... + g_C)")
def chunk_end_without_decay(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, end_decay=False)


@mistake("gated_delta_chunk", "token t reads after its own write: the output's mask keeps the diagonal (i <= t)")
def chunk_reads_before_writing(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, out_diagonal=False)


@mistake("gated_delta_chunk", "A is strictly below the diagonal: token t's prediction holds only earlier tokens' "
         "writes (i < t), not its own")
def chunk_A_with_its_diagonal(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, A_diagonal=True)


@mistake("gated_delta_chunk", "row t of A carries beta_t, the strength of the token that writes (beta[..., :, None]), "
         "not beta_i of the column")
def chunk_beta_of_the_column(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, row_beta=False)


@mistake("gated_delta_chunk", "Gamma_t includes token t's own decay: G = np.cumsum(g) (inclusive), not the sum "
         "of the earlier g alone")
def chunk_exclusive_cumsum(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, exclusive=True)


@mistake("gated_delta_chunk", "the decay from token i to token t is Gamma_t / Gamma_i = exp(G_t - G_i) <= 1, "
         "not its inverse exp(G_i - G_t)")
def chunk_ratio_inverted(state, q, k, v, g, beta):
    return chunk(state, q, k, v, g, beta, how="inverted")


check_gated_delta_chunk = make_check("gated_delta_chunk")
