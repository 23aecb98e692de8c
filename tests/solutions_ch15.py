"""Right solutions of chapter 15's exercises written from scratch, for the tests of its checks
(tests/test_checks_ch15.py, test_checks_cases_ch15.py, test_checks_routes_ch15.py, and the gathering of right
solutions in tests/learners.py), and what those tests share: running a check, its failures on every seed, the
hint of a failure, and the cases of a check."""

import io
from contextlib import redirect_stdout

import numpy as np
import pytest

from learners import SEEDS

from mha.checks import ch15
from mha.checks.registry import CHECKS, CheckFailed

CHAPTER_15 = ["shard_by_heads", "merge_partials", "all_reduce_bytes"]


def run(name, fn, seed):
    """The check of `name` on fn with `seed`; the line it printed (its confirmation)."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        getattr(ch15, f"check_{name}")(fn, seed=seed)
    return printed.getvalue().strip()


def failures_on_every_seed(name, fn, seeds=SEEDS):
    """The messages of check_<name>(fn) on `seeds`; fails the test if any seed lets fn pass."""
    messages = []
    for seed in seeds:
        with pytest.raises(CheckFailed) as info:
            run(name, fn, seed)
        messages.append(str(info.value))
    return messages


def hint_of(message):
    """The hint of a failure message ("" when it has none)."""
    return message.split("\n  hint: ")[1].split("\n")[0] if "\n  hint: " in message else ""


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


FROM_SCRATCH = [shard_by_heads, shard_by_heads_head_by_head, merge_partials, all_reduce_bytes,
                all_reduce_bytes_step_by_step]


def name_of(fn):
    return next(name for name in CHAPTER_15 if fn.__name__.startswith(name))
