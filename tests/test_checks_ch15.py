"""The checks of chapter 15 (heads across devices): a right solution written from scratch passes on every seed
(0..9); every wrong solution that a learner writes fails on a fixed named case, on every seed, with the hint
that fits; every catalogued mistake fails with its own hint; the references agree with what they stand for
(shards put together give W back, two merged halves are attention over all the keys, the bytes are 2(P - 1)/P
of the payload). The named cases, inputs written in place and malformed answers:
tests/test_checks_cases_ch15.py; what each exercise may call: tests/test_checks_routes_ch15.py."""

import numpy as np
import pytest

from learners import SEEDS, assert_trap_fails_on_its_case, hint_of
from solutions_ch15 import (CHAPTER_15, FROM_SCRATCH, RANKS_15, all_cases, failures_on_every_seed, labelled,
                            merge_partials, name_of, run)

import mha.numpy as mnp
from mha.checks import ch15
from mha.checks.registry import CHECKS, expected_answer


def test_every_check_of_chapter_15_has_a_solution_from_scratch_here():
    assert {name_of(f) for f in FROM_SCRATCH} == set(CHAPTER_15 + RANKS_15)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ == "mha.checks.ch15"} == \
        set(CHAPTER_15)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ == "mha.checks.ch15_ranks"} == \
        set(RANKS_15)


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_right_solution_from_scratch_passes_on_every_seed(fn):
    name = name_of(fn)
    for seed in SEEDS:
        assert run(name, fn, seed) == f"check_{name}: all {len(CHECKS[name].named_cases(0))} cases passed.", seed


# The references are what they stand for -------------------------------------------------------------------------


def test_the_shards_of_every_case_put_together_give_w_back_in_rank_order():
    for case in all_cases("shard_by_heads"):
        if case.raises:
            continue
        W, n_heads, world_size = case.args
        axis = case.kwargs.get("axis", -1)
        shards = expected_answer("shard_by_heads", case)
        assert len(shards) == world_size, case.label
        np.testing.assert_array_equal(np.concatenate(shards, axis=axis), W, err_msg=case.label)
        assert all(s.dtype == W.dtype and s.shape[axis] == W.shape[axis] // world_size for s in shards)


def test_the_reference_raises_where_the_case_requires_it():
    case = labelled("shard_by_heads", "6 heads over 4 ranks")
    with pytest.raises(ValueError, match="n_heads=6 is not divisible by world_size=4"):
        case.call(mnp.shard_by_heads)


def test_two_merged_halves_are_attention_over_all_the_keys():
    """Build the first cases' halves again from their queries, keys and values: merged, they are the attention of
    the queries over every key, and its log-sum-exp."""
    r = np.random.default_rng(2026)  # the named cases' numbers (mha.checks.inputs.rng)
    Q, K, V = r.standard_normal((4, 4)), r.standard_normal((6, 4)), r.standard_normal((6, 4))
    case = CHECKS["merge_partials"].named_cases(0)[0]
    np.testing.assert_array_equal(case.args[0], ch15.attention_on(Q, K[:3], V[:3])[0])
    out, lse = expected_answer("merge_partials", case)
    scores = Q @ K.T / 2.0  # sqrt(d_head = 4)
    np.testing.assert_allclose(out, mnp.softmax(scores) @ V, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), rtol=0, atol=1e-12)


def test_every_merged_case_has_no_nan_and_minus_inf_only_where_both_sides_have_it():
    for case in all_cases("merge_partials"):
        out_a, lse_a, out_b, lse_b = case.args
        out, lse = expected_answer("merge_partials", case)
        assert np.isfinite(out).all() and not np.isnan(lse).any(), case.label
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_a) & np.isneginf(lse_b))
        assert out.dtype == out_a.dtype and lse.dtype == lse_a.dtype, case.label


def test_the_bytes_of_every_case_are_2_p_minus_1_over_p_of_the_payload():
    for case in all_cases("all_reduce_bytes"):
        n, P = (int(a) for a in case.args[:2])
        b = int(case.args[2]) if len(case.args) > 2 else int(case.kwargs.get("bytes_per_element", 4))
        assert expected_answer("all_reduce_bytes", case) == pytest.approx(2 * (P - 1) / P * n * b, rel=1e-15)


# Wrong solutions, as learners write them ---------------------------------------------------------------------------


def shard_reshaped_d_head_first(W, n_heads, world_size, *, axis=-1):
    if n_heads % world_size:
        raise ValueError("no")
    W = np.moveaxis(W, axis, -1)
    d_head = W.shape[-1] // n_heads
    heads = W.reshape(*W.shape[:-1], d_head, n_heads)  # (..., d_head, h): the columns misread
    g = n_heads // world_size
    return [np.moveaxis(heads[..., r * g:(r + 1) * g].reshape(*W.shape[:-1], -1), -1, axis)
            for r in range(world_size)]


def shard_columns_whatever_the_axis(W, n_heads, world_size, *, axis=-1):
    if n_heads % world_size:
        raise ValueError("no")
    width = W.shape[-1] // world_size
    return [W[..., r * width:(r + 1) * width] for r in range(world_size)]


def shard_dealing_heads_round_robin(W, n_heads, world_size, *, axis=-1):
    if n_heads % world_size:
        raise ValueError("no")
    heads = np.split(W, n_heads, axis=axis)
    return [np.concatenate(heads[r::world_size], axis=axis) for r in range(world_size)]


def shard_one_per_head(W, n_heads, world_size, *, axis=-1):
    return np.split(W, n_heads, axis=axis)


def shard_without_checking_the_heads(W, n_heads, world_size, *, axis=-1):
    return np.split(W, world_size, axis=axis)  # right whenever P divides h


def merge_with_exp_of_lse(out_a, lse_a, out_b, lse_b):
    s_a, s_b = np.exp(lse_a), np.exp(lse_b)  # e^1e4 = inf
    return (s_a[..., None] * out_a + s_b[..., None] * out_b) / (s_a + s_b)[..., None], np.log(s_a + s_b)


def merge_summing_outs(out_a, lse_a, out_b, lse_b):
    return out_a + out_b, np.logaddexp(lse_a, lse_b)


def merge_weights_without_new_axis(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    safe = np.where(np.isinf(lse), 0, lse)
    return np.exp(lse_a - safe) * out_a + np.exp(lse_b - safe) * out_b, lse


def merge_by_the_maximum_unguarded(out_a, lse_a, out_b, lse_b):
    m = np.maximum(lse_a, lse_b)
    s_a, s_b = np.exp(lse_a - m), np.exp(lse_b - m)
    return (s_a[..., None] * out_a + s_b[..., None] * out_b) / (s_a + s_b)[..., None], m + np.log(s_a + s_b)


def merge_logaddexp_unguarded(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    return np.exp(lse_a - lse)[..., None] * out_a + np.exp(lse_b - lse)[..., None] * out_b, lse


def merge_keeping_the_larger_lse(out_a, lse_a, out_b, lse_b):
    out, _ = merge_partials(out_a, lse_a, out_b, lse_b)
    return out, np.maximum(lse_a, lse_b)


def bytes_reduce_scatter_only(n_elements, world_size, bytes_per_element=4):
    return (world_size - 1) / world_size * n_elements * bytes_per_element


def bytes_two_copies_over_p(n_elements, world_size, bytes_per_element=4):
    return 2 * n_elements * bytes_per_element / world_size


def bytes_counting_elements(n_elements, world_size, bytes_per_element=4):
    return 2 * (world_size - 1) / world_size * n_elements


# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    ("shard_by_heads", shard_reshaped_d_head_first, "reshape it to (h, d_head), not (d_head, h)", "W_Q (d, h"),
    ("shard_by_heads", shard_columns_whatever_the_axis, "split the axis you are given", "W_O (h * d_head, d_out)"),
    ("shard_by_heads", shard_dealing_heads_round_robin, "not every P-th head", "W_Q (d, h"),
    ("shard_by_heads", shard_one_per_head, "not one shard per head", "W_Q (d, h"),
    ("merge_partials", merge_with_exp_of_lse, "never take exp of an lse itself", "lse of about 1e4"),
    ("merge_partials", merge_summing_outs, "counts the probabilities twice", "two halves"),
    ("merge_partials", merge_weights_without_new_axis, "w[..., None]", "two halves"),
    ("merge_partials", merge_by_the_maximum_unguarded, "np.where(np.isfinite(m), m, 0)", "lse = -inf on both"),
    ("merge_partials", merge_logaddexp_unguarded, "-inf - (-inf) is NaN, so", "lse = -inf on both"),
    ("merge_partials", merge_keeping_the_larger_lse, "forgets the other block's mass", "two halves"),
    ("all_reduce_bytes", bytes_reduce_scatter_only, "two passes", "P = 4 ranks"),
    ("all_reduce_bytes", bytes_two_copies_over_p, "a rank alone (P = 1) sends nothing", "P = 4 ranks"),
    ("all_reduce_bytes", bytes_counting_elements, "not in elements", "P = 4 ranks"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    assert_trap_fails_on_its_case(name, fn, hint, case, failures_on_every_seed)


def test_sharding_six_heads_over_four_ranks_must_raise():
    """np.split by P alone is right wherever P divides h; at 6 heads over 4 ranks it cuts heads in two."""
    for message in failures_on_every_seed("shard_by_heads", shard_without_checking_the_heads):
        assert "returned an answer on the case '6 heads over 4 ranks" in message
        assert "where it must raise ValueError" in message


def test_a_forgotten_axis_in_a_batch_raises_and_the_learner_reads_where():
    """Without [..., None], a batch of weights (..., T) meets out (..., T, d_v) and NumPy refuses to broadcast;
    the learner reads the case, NumPy's error, and the seed (the 2-D case before it carries the hint)."""
    def merge_without_axis_2d_ok(out_a, lse_a, out_b, lse_b):
        if out_a.ndim == 2:
            return merge_partials(out_a, lse_a, out_b, lse_b)
        return merge_weights_without_new_axis(out_a, lse_a, out_b, lse_b)
    for message in failures_on_every_seed("merge_partials", merge_without_axis_2d_ok, seeds=SEEDS[:3]):
        assert "raised ValueError: operands could not be broadcast together" in message
        assert "on the case 'a batch of heads" in message and "seed" in message


def test_whole_numbers_of_bytes_as_integers_fail_on_their_dtype():
    """2 (P - 1) n b // P is an int: the exercise asks for a float (the share is seldom whole), and the check says
    which dtype it expected, with the hint of integers (true division), not the float32 one (d ** 0.5)."""
    def in_integers(n_elements, world_size, bytes_per_element=4):
        return 2 * (world_size - 1) * n_elements * bytes_per_element // world_size
    for message in failures_on_every_seed("all_reduce_bytes", in_integers, seeds=SEEDS[:3]):
        assert "on the case 'P = 4 ranks" in message and "expected dtype float64, got int64" in message
        assert "true division (/)" in hint_of(message) and "float32" not in hint_of(message), message


def test_a_float32_answer_still_gets_the_hint_about_float_dtypes():
    """The hint of integers is for integers only: float32 where float64 is expected keeps the dtype hint."""
    def in_float32(out_a, lse_a, out_b, lse_b):
        out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
        return out.astype(np.float32), lse.astype(np.float32)
    message = failures_on_every_seed("merge_partials", in_float32, seeds=[0])[0]
    assert "expected dtype float64, got float32" in message and "d ** 0.5" in hint_of(message), message


@pytest.mark.parametrize("name", CHAPTER_15)
def test_every_catalogued_mistake_fails_with_its_own_hint_on_every_seed(name):
    assert len(CHECKS[name].mistakes) >= 5
    for m in CHECKS[name].mistakes:
        for message in failures_on_every_seed(name, m.fn, seeds=SEEDS[:3]):
            assert hint_of(message) == m.hint, (m.fn.__name__, message)


@pytest.mark.parametrize("name", CHAPTER_15)
def test_every_hint_is_a_sentence_of_its_own(name):
    hints = [m.hint for m in CHECKS[name].mistakes]
    assert all(len(h.split()) >= 5 for h in hints) and len(set(hints)) == len(hints)
