"""Right solutions of chapter 15's exercises written from scratch, for the tests of its checks
(tests/test_checks_ch15.py, test_checks_cases_ch15.py, test_checks_routes_ch15.py, and the gathering of right
solutions in tests/learners.py), and what those tests share: running a check, its failures on every seed, the
hint of a failure, and the cases of a check."""

import io
from contextlib import redirect_stdout

import numpy as np
import pytest

from learners import SEEDS

from mha.checks import ch15, ch15_ranks
from mha.checks.registry import CHECKS, CheckFailed

CHAPTER_15 = ["shard_by_heads", "merge_partials", "all_reduce_bytes"]
RANKS_15 = ["ulysses_all_to_all", "ring_attention_lists", "rank_partial_output"]  # mha.checks.ch15_ranks


def run(name, fn, seed):
    """The check of `name` on fn with `seed`; the line it printed (its confirmation)."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        getattr(ch15 if name in CHAPTER_15 else ch15_ranks, f"check_{name}")(fn, seed=seed)
    return printed.getvalue().strip()


def failures_on_every_seed(name, fn, seeds=SEEDS):
    """The messages of check_<name>(fn) on `seeds`; fails the test if any seed lets fn pass."""
    messages = []
    for seed in seeds:
        with pytest.raises(CheckFailed) as info:
            run(name, fn, seed)
        messages.append(str(info.value))
    return messages


def labelled(name, words):
    return next(case for case in CHECKS[name].named_cases(0) if words in case.label)


def all_cases(name, seeds=SEEDS):
    """The named cases of check_<name>, then the random ones of every seed."""
    check = CHECKS[name]
    drawn = [check.make_random_cases(np.random.default_rng(seed)) for seed in seeds]
    return check.named_cases(0) + [case for cases in drawn for case in cases]


# Right solutions written from scratch: NumPy only ---------------------------------------------------------------


def shard_by_heads(W, n_heads, world_size, *, axis=-1):
    if n_heads % world_size:
        raise ValueError(f"{n_heads} heads cannot be shared equally by {world_size} ranks")
    W = np.moveaxis(np.asarray(W), axis, 0)  # (h * d_head, ...): the heads' axis first
    per_rank = W.shape[0] // world_size  # h/P heads of d_head
    return [np.moveaxis(W[r * per_rank:(r + 1) * per_rank], 0, axis).copy() for r in range(world_size)]  # copies


def shard_by_heads_head_by_head(W, n_heads, world_size, *, axis=-1):
    """Each head's block, then the blocks grouped by rank (a reshape to (h, d_head))."""
    if n_heads % world_size:
        raise ValueError("world_size must divide n_heads")
    moved = np.moveaxis(np.asarray(W), axis, -1)  # (..., h * d_head)
    heads = moved.reshape(*moved.shape[:-1], n_heads, -1)  # (..., h, d_head)
    g = n_heads // world_size
    groups = [heads[..., r * g:(r + 1) * g, :] for r in range(world_size)]  # (..., h/P, d_head) each
    return [np.moveaxis(group.reshape(*moved.shape[:-1], -1), -1, axis).copy() for group in groups]


def merge_partials(out_a, lse_a, out_b, lse_b):
    m = np.maximum(lse_a, lse_b)
    m = np.where(np.isfinite(m), m, 0.0)  # a row with no key on either side: shift by 0
    s_a, s_b = np.exp(lse_a - m), np.exp(lse_b - m)  # (..., T), at most 1
    total = s_a + s_b
    with np.errstate(divide="ignore"):
        lse = m + np.log(total)  # -inf where total = 0
    out = (s_a[..., None] * out_a + s_b[..., None] * out_b) / np.where(total > 0, total, 1.0)[..., None]
    return out, lse


def all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    return 2 * (world_size - 1) * n_elements * bytes_per_element / world_size


def all_reduce_bytes_step_by_step(n_elements, world_size, bytes_per_element=4):
    """A reduce-scatter and an all-gather, P - 1 steps each, each step sending one n/P piece."""
    steps = 2 * (world_size - 1)
    return steps * (n_elements / world_size) * bytes_per_element


def ulysses_all_to_all(held):
    """Each rank's array cut by heads, the pieces for rank s stacked along the positions."""
    P = len(held)
    if held[0].shape[-3] % P:
        raise ValueError("world_size must divide the heads")
    pieces = [np.split(np.asarray(a), P, axis=-3) for a in held]  # pieces[r][s]: (..., h/P, T/P, d)
    return [np.concatenate([pieces[r][s] for r in range(P)], axis=-2) for s in range(P)]


def ring_attention_lists(Q_chunks, K_chunks, V_chunks, *, causal=False):
    """The loop with NumPy only: each rank's running maximum, sum and weighted values (chapter 8's online softmax)."""
    P, n = len(Q_chunks), Q_chunks[0].shape[-2]
    outs = []
    for r in range(P):
        q = Q_chunks[r] / np.sqrt(Q_chunks[r].shape[-1])
        top, total, acc = None, None, None
        for step in range(P):
            owner = (r - step) % P
            if causal and owner > r:
                continue
            scores = q @ np.swapaxes(K_chunks[owner], -1, -2)  # (..., n, n)
            if causal and owner == r:
                scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
            new_top = scores.max(axis=-1, keepdims=True) if top is None else np.maximum(top, scores.max(-1, keepdims=True))
            e = np.exp(scores - new_top)
            if top is None:
                total, acc = e.sum(-1, keepdims=True), e @ V_chunks[owner]
            else:
                shrink = np.exp(top - new_top)
                total, acc = total * shrink + e.sum(-1, keepdims=True), acc * shrink + e @ V_chunks[owner]
            top = new_top
        outs.append(acc / total)
    return outs


def rank_partial_output(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    """Head by head: each of the rank's heads attends, and its output meets its own rows of W_o."""
    if n_heads % world_size:
        raise ValueError("world_size must divide n_heads")
    d_head, g = W_q.shape[1] // n_heads, n_heads // world_size
    total = 0
    for i in range(rank * g, (rank + 1) * g):
        cols = slice(i * d_head, (i + 1) * d_head)
        q, k, v = X @ W_q[:, cols], X @ W_k[:, cols], X @ W_v[:, cols]  # (..., T, d_head)
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_head)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        total = total + (w / w.sum(-1, keepdims=True)) @ v @ W_o[cols]  # (..., T, d_out)
    return total


FROM_SCRATCH = [shard_by_heads, shard_by_heads_head_by_head, merge_partials, all_reduce_bytes,
                all_reduce_bytes_step_by_step, ulysses_all_to_all, ring_attention_lists, rank_partial_output]


def name_of(fn):
    return next(name for name in CHAPTER_15 + RANKS_15 if fn.__name__.startswith(name))
