"""Chapter 18, attention without the T x T matrix: the checks of `linear_attention_step` and `gated_delta_update`,
their cases and their catalogued mistakes (those of `gated_delta_chunk` are in `mha.checks.ch18_chunk`, re-exported
here).

A state S has shape (..., d_k, d_v); a token reads with q @ S (q a row) and writes the outer product k^T v. Each first
named case is built so that every catalogued mistake of its exercise answers otherwise, with its own hint, whatever the
seed: a square state (d_k = d_v: a transposed write or read adds up without an error, and gets its hint; the next case,
d_k != d_v, makes it raise), a batch axis (q @ S without a row axis pairs every query with every state), a state that
already holds earlier tokens (reading before the write, or reading the new token alone, differs); for the update, g in
-1.5 .. -0.1 and beta in 0.2 .. 0.9 (forgetting either, or exp(g) written g, differs) and as many heads as values per
key (g and beta without their new axes line up with d_v, silently).
"""

import numpy as np

from mha.checks.ch18_chunk import check_gated_delta_chunk, unit_keys
from mha.checks.inputs import batch, normal, sizes
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import GATED_DELTA_UPDATE_FORBIDS, LINEAR_STEP_FORBIDS
from mha.checks.rules import GATED_DELTA_UPDATE_RULES, LINEAR_STEP_RULES

STATE_AND_OUT = ("out", "new_state")  # the structure of a result `(out, new_state)`

# linear_attention_step: write k^T v into the state, read with q ---------------------------------------------------


def step_inputs(r, lead, d_k, d_v, dtype=np.float64, empty=False):
    """(state, q, k, v): a state (*lead, d_k, d_v) holding earlier writes (zeros with empty=True), and one token's
    q, k (*lead, d_k) (positive: features after elu + 1) and v (*lead, d_v)."""
    state = np.zeros(lead + (d_k, d_v), dtype) if empty else normal(r, lead + (d_k, d_v), dtype, 0.7)
    q, k = (np.abs(normal(r, lead + (d_k,), dtype)) + dtype(0.1) for _ in range(2))
    return state, q, k, normal(r, lead + (d_v,), dtype)


@cases_for("linear_attention_step", returns=STATE_AND_OUT, forbids=LINEAR_STEP_FORBIDS, float32_promised=True,
           may_use="NumPy, nothing from mha", rules=LINEAR_STEP_RULES)
def linear_attention_step_cases(r):
    """A square state that holds earlier tokens, with a batch, first; d_k != d_v, no batch axis, two batch axes, an
    empty state, float32."""
    return [
        Case("a batch of 2, a square state (d_k = d_v = 3) that already holds earlier tokens",
             step_inputs(r, (2,), 3, 3)),
        Case("d_k = 4, d_v = 3, a batch of 3", step_inputs(r, (3,), 4, 3)),
        Case("no batch axis: q, k (3,), v (5,), state (3, 5)", step_inputs(r, (), 3, 5)),
        Case("two batch axes (2, 3): 2 sequences of 3 heads, d_k = 2, d_v = 5", step_inputs(r, (2, 3), 2, 5)),
        Case("an empty state (zeros): the first token reads (q . k) v", step_inputs(r, (2,), 3, 2, empty=True)),
        Case("float32 inputs: float32 answers", step_inputs(r, (2,), 5, 3, np.float32)),
    ]


@random_cases_for("linear_attention_step")
def linear_attention_step_random_cases(r):
    """A 4-D batch of random sizes, and float32 without a batch axis."""
    d_k, d_v = sizes(r, 2, 1, 6)
    return [
        Case("random: a 4-D batch (B, B', h, d)", step_inputs(r, batch(r, 3), d_k, d_v)),
        Case("random: float32, no batch axis", step_inputs(r, (), d_k + 1, d_v, np.float32)),
    ]


def outer(k, v):
    """k^T v for every batch entry: (..., d_k, d_v)."""
    return k[..., :, None] * v[..., None, :]


def read(q, state):
    """q @ state for every batch entry: (..., d_v)."""
    return np.einsum("...k,...kv->...v", q, state)


@mistake("linear_attention_step", "read after the write: out = q @ (state + k^T v), the new state, so that the token "
         "sees its own value; q @ state reads the old one")
def step_reads_before_writing(state, q, k, v):
    return read(q, state), state + outer(k, v)


@mistake("linear_attention_step", "read the whole new state, the earlier tokens' writes included: out = q @ (state + "
         "k^T v), not (q . k) v, the new token's part alone")
def step_reads_the_new_token_only(state, q, k, v):
    return read(q, outer(k, v)), state + outer(k, v)


@mistake("linear_attention_step", "return the new state, state + k^T v, as the second result: not the state you were "
         "given")
def step_returns_the_old_state(state, q, k, v):
    new_state = state + outer(k, v)
    return read(q, new_state), state


@mistake("linear_attention_step", "the state is (d_k, d_v): write the outer product k^T v, k as a column and v as a "
         "row (k[..., :, None] * v[..., None, :]), not v^T k")
def step_write_transposed(state, q, k, v):
    new_state = state + np.swapaxes(outer(k, v), -1, -2)
    return read(q, new_state), new_state


@mistake("linear_attention_step", "read with q as a row: out = q @ S sums over S's d_k axis (the second-to-last); "
         "S @ q sums over its d_v axis")
def step_read_transposed(state, q, k, v):
    new_state = state + outer(k, v)
    return np.einsum("...kv,...v->...k", new_state, q), new_state


@mistake("linear_attention_step", "with batch axes, q @ state multiplies every sequence's query by every sequence's "
         "state: make q a row, (q[..., None, :] @ state)[..., 0, :], or use np.einsum('...k,...kv->...v', q, state)")
def step_matmul_across_the_batch(state, q, k, v):
    new_state = state + outer(k, v)
    return q @ new_state, new_state


@mistake("linear_attention_step", "q and k come with the feature map already applied (elu(x) + 1 is the caller's): "
         "use them as they are")
def step_feature_map_again(state, q, k, v):
    def features(x):
        return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
    new_state = state + outer(features(k), v)
    return read(features(q), new_state), new_state


@mistake("linear_attention_step", "linear attention has no 1 / sqrt(d_k): the output is q @ S itself")
def step_scaled(state, q, k, v):
    new_state = state + outer(k, v)
    return read(q, new_state) / np.sqrt(q.shape[-1]), new_state


check_linear_attention_step = make_check("linear_attention_step")

# gated_delta_update: decay, predict, write the error ------------------------------------------------------------


def update_inputs(r, lead, d_k, d_v, dtype=np.float64, *, decay=True, unit=True, beta=None, g=None):
    """(state, k, v, g, beta): a state (*lead, d_k, d_v), one token's k (*lead, d_k) (of unit length with unit=True,
    as the models normalise it) and v (*lead, d_v), log decays g in -1.5 .. -0.1 (None with decay=False) and write
    strengths beta in 0.2 .. 0.9, one per batch entry (*lead); `g`, `beta`: numbers given to every entry."""
    state = normal(r, lead + (d_k, d_v), dtype, 0.7)
    k, v = normal(r, lead + (d_k,), dtype), normal(r, lead + (d_v,), dtype)
    gates = np.asarray(r.uniform(-1.5, -0.1, lead) if g is None else np.full(lead, g), dtype)
    strengths = np.asarray(r.uniform(0.2, 0.9, lead) if beta is None else np.full(lead, beta), dtype)
    return state, unit_keys(k) if unit else k, v, gates if decay else None, strengths


@cases_for("gated_delta_update", forbids=GATED_DELTA_UPDATE_FORBIDS, float32_promised=True,
           may_use="NumPy, nothing from mha", rules=GATED_DELTA_UPDATE_RULES)
def gated_delta_update_cases(r):
    """3 heads and d_v = 3 first (g and beta without their axes line up with d_v), g = None, a full write at a unit
    key, d_k != d_v, g and beta of one sequence (0-d), keys not normalised, float32."""
    return [
        Case("3 heads, a square state (d_k = d_v = 3), keys of unit length, g in -1.5 .. -0.1, beta in 0.2 .. 0.9",
             update_inputs(r, (3,), 3, 3)),
        Case("g = None: no decay (plain DeltaNet)", update_inputs(r, (2,), 4, 3, decay=False)),
        Case("g = 0 and beta = 1 at a key of unit length: afterwards k @ S = v exactly", update_inputs(
            r, (2,), 3, 4, g=0.0, beta=1.0)),
        Case("d_k = 5, d_v = 3, 2 heads", update_inputs(r, (2,), 5, 3)),
        Case("no batch axis: g and beta are 0-d arrays, d_k = 2, d_v = 5", update_inputs(r, (), 2, 5)),
        Case("two batch axes (2, 3), keys not normalised", update_inputs(r, (2, 3), 3, 2, unit=False)),
        Case("float32 inputs: float32 answers", update_inputs(r, (2,), 4, 3, np.float32)),
    ]


@random_cases_for("gated_delta_update")
def gated_delta_update_random_cases(r):
    """A 4-D batch of random sizes, float32 without a batch axis, and no decay."""
    d_k, d_v = sizes(r, 2, 1, 6)
    return [
        Case("random: a 4-D batch (B, B', h, d)", update_inputs(r, batch(r, 3), d_k, d_v, unit=bool(r.integers(2)))),
        Case("random: float32, no batch axis", update_inputs(r, (), d_k + 1, d_v, np.float32)),
        Case("random: g = None", update_inputs(r, batch(r, 1), d_k, d_v + 1, decay=False)),
    ]


def delta(state, k, v, g, beta, *, decay=lambda g: np.exp(g), decay_first=True, predict_decayed=True, sign=1.0,
          strength=lambda beta: beta, predict=True, axes=True, predict_of=None, write_of=None):
    """The update, right with the defaults; each keyword changes one step as a mistake does."""
    factor = 1.0 if g is None else decay(g)
    factor = np.asarray(factor)[..., None, None] if axes and g is not None else factor
    b = strength(beta)
    b = np.asarray(b)[..., None] if axes else b
    decayed = factor * state if decay_first else state
    seen = decayed if predict_decayed else state
    prediction = (predict_of or read)(k, seen) if predict else 0.0
    written = decayed + (write_of or outer)(k, b * sign * (v - prediction))
    return written if decay_first else factor * written


@mistake("gated_delta_update", "decay the state first: S' = exp(g) S, with g the log of the decay (g <= 0, so "
         "exp(g) is in (0, 1]); without it the old content is never forgotten")
def update_without_decay(state, k, v, g, beta):
    return delta(state, k, v, g, beta, decay=lambda g: 1.0)


@mistake("gated_delta_update", "g is a LOG decay: multiply the state by exp(g), not by g itself")
def update_decay_by_g(state, k, v, g, beta):
    return delta(state, k, v, g, beta, decay=lambda g: g)


@mistake("gated_delta_update", "the decay is exp(g), not exp(-g): g <= 0, and the state must shrink")
def update_decay_by_exp_minus_g(state, k, v, g, beta):
    return delta(state, k, v, g, beta, decay=lambda g: np.exp(-g))


@mistake("gated_delta_update", "decay first, then predict and write: S' = exp(g) S, S'' = S' + k^T (beta (v - k "
         "S')); decaying after the write shrinks the new value too")
def update_decay_after_the_write(state, k, v, g, beta):
    return delta(state, k, v, g, beta, decay_first=False)


@mistake("gated_delta_update", "predict from the decayed state: the error is v - k @ (exp(g) S), not v - k @ S")
def update_predicts_from_the_old_state(state, k, v, g, beta):
    return delta(state, k, v, g, beta, predict_decayed=False)


@mistake("gated_delta_update", "scale the write by beta: S' + k^T (beta (v - k S')); without beta the whole error is "
         "written, as if beta were 1")
def update_without_beta(state, k, v, g, beta):
    return delta(state, k, v, g, beta, strength=lambda beta: np.ones_like(beta))


@mistake("gated_delta_update", "beta once: the write is k^T (beta (v - k S')); beta on the key and on the error both "
         "writes beta^2 times the error")
def update_beta_twice(state, k, v, g, beta):
    return delta(state, k, v, g, beta, strength=lambda beta: beta * beta)


@mistake("gated_delta_update", "the error is v - k S' (what should be stored at k, minus what is): k S' - v pushes "
         "the state the wrong way")
def update_error_sign(state, k, v, g, beta):
    return delta(state, k, v, g, beta, sign=-1.0)


@mistake("gated_delta_update", "the delta rule writes the ERROR, beta (v - k S'), not beta v: without subtracting "
         "the prediction k S' this is linear attention's write")
def update_without_the_prediction(state, k, v, g, beta):
    return delta(state, k, v, g, beta, predict=False)


@mistake("gated_delta_update", "g and beta hold one number per sequence (shape (...)): give them new axes, "
         "exp(g)[..., None, None] * S and beta[..., None] * error; without them they line up with the last axis, d_v")
def update_gates_without_axes(state, k, v, g, beta):
    return delta(state, k, v, g, beta, axes=False)


@mistake("gated_delta_update", "predict with k as a row: k @ S' sums over S's d_k axis (the second-to-last); S' @ k "
         "sums over its d_v axis")
def update_prediction_transposed(state, k, v, g, beta):
    return delta(state, k, v, g, beta, predict_of=lambda k, S: np.einsum("...kv,...v->...k", S, k))


@mistake("gated_delta_update", "the state is (d_k, d_v): write k^T e (k as a column, the error e as a row), not e^T k")
def update_write_transposed(state, k, v, g, beta):
    return delta(state, k, v, g, beta, write_of=lambda k, e: np.swapaxes(outer(k, e), -1, -2))


check_gated_delta_update = make_check("gated_delta_update")

# The chapter's three checks, the chunk's from mha.checks.ch18_chunk: `from mha.checks.ch18 import ...` finds each.
CHAPTER_CHECKS = (check_linear_attention_step, check_gated_delta_update, check_gated_delta_chunk)
