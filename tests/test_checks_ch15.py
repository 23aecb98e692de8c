"""The checks of chapter 15 (heads across devices): a right solution written from scratch passes on every seed
(0..9); every wrong solution that a learner writes fails on a fixed named case, on every seed, with the hint
that fits; every catalogued mistake fails with its own hint; an input written in place is refused; the
references agree with what they stand for (shards put together give W back, two merged halves are attention
over all the keys, the bytes are 2(P - 1)/P of the payload); the traps are in the named cases; a malformed
answer or a check handed no function gets a plain message; and what each exercise may not call (`forbids`)
agrees with its text, so that the student edition of mha refuses the library's routes to the answer."""

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from learners import SEEDS, exercise_texts, student_edition

import mha.numpy as mnp
from mha.checks import ch15
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, CheckFailed, expected_answer

CHAPTER_15 = ["shard_by_heads", "merge_partials", "all_reduce_bytes"]
ROOT = Path(__file__).resolve().parents[1]


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


def test_every_check_of_chapter_15_has_a_solution_from_scratch_here():
    assert {name_of(f) for f in FROM_SCRATCH} == set(CHAPTER_15)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ == "mha.checks.ch15"} == \
        set(CHAPTER_15)


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
    messages = failures_on_every_seed(name, fn)
    assert hint in hint_of(messages[0]), messages[0]
    for message in messages:
        assert f"on the case '{case}" in message, message


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
    which dtype it expected."""
    def in_integers(n_elements, world_size, bytes_per_element=4):
        return 2 * (world_size - 1) * n_elements * bytes_per_element // world_size
    for message in failures_on_every_seed("all_reduce_bytes", in_integers, seeds=SEEDS[:3]):
        assert "on the case 'P = 4 ranks" in message and "expected dtype float64, got int64" in message


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


# The traps are in the named cases ------------------------------------------------------------------------------------


def test_the_named_traps_of_shard_by_heads_are_there():
    cases = CHECKS["shard_by_heads"].named_cases(0)
    assert cases[-1].raises is ValueError and all(c.raises is None for c in cases[:-1]), "the raise comes last"
    W, h, P = cases[-1].args
    assert h % P and W.shape[-1] % P == 0, "np.split by P succeeds there, cutting heads"
    assert {c.args[2] for c in cases} >= {1, 2, 4, 8}
    assert any(c.args[0].dtype == np.float32 for c in cases) and any(c.args[0].ndim == 1 for c in cases)
    W, h, P = cases[0].args
    assert W.shape[-1] // h > 1 and h > P > 1, "heads of several columns, several per rank"
    by_rows = [c for c in cases if c.kwargs.get("axis") == 0]
    assert by_rows and all(c.args[0].shape[-1] % c.args[2] == 0 for c in by_rows), "the wrong axis answers too"
    assert cases[1].args[1] == cases[1].args[2] > 1, "P = h: one head per rank, before P = 1"


def test_the_named_traps_of_merge_partials_are_there():
    cases = CHECKS["merge_partials"].named_cases(0)
    out_a, lse_a, _, _ = cases[0].args
    assert out_a.ndim == 2 and out_a.shape[0] == out_a.shape[1], "one head's out with T = d_v comes first"
    with np.errstate(over="ignore", under="ignore"):
        assert np.isinf(np.exp(labelled("merge_partials", "about 1e4").args[1])).all()
        assert (np.exp(labelled("merge_partials", "about -1e4").args[1]) == 0).all()
    _, lse_a, _, lse_b = labelled("merge_partials", "both sides").args
    assert (np.isneginf(lse_a) & np.isneginf(lse_b)).any()
    for words, side in (("lse_b = -inf", 3), ("lse_a = -inf", 1)):
        args = labelled("merge_partials", words).args
        assert np.isneginf(args[side]).any() and not np.isneginf(args[4 - side]).any()
    assert labelled("merge_partials", "float32").args[0].dtype == np.float32
    both = [i for i, c in enumerate(cases) if "both sides" in c.label][0]
    overflow = [i for i, c in enumerate(cases) if "about 1e4" in c.label][0]
    assert overflow < both, "exp overflowing is caught before the NaN of two empty sides (they give the same NaN)"


def test_the_named_traps_of_all_reduce_bytes_are_there():
    cases = CHECKS["all_reduce_bytes"].named_cases(0)
    n, P, b = cases[0].args
    assert len({2 / P, (P - 1) / P, 2 * (P - 1) / P}) == 3, "the first case tells the three shares apart"
    assert any(int(c.args[1]) == 1 for c in cases)
    assert any(expected_answer("all_reduce_bytes", c) % 1 for c in cases), "a share that is no whole number"
    assert any(len(c.args) == 2 and not c.kwargs for c in cases), "the default bytes_per_element"


def test_the_random_cases_hold_float32_and_4_d_arrays_where_the_exercise_takes_arrays():
    for name in ("shard_by_heads", "merge_partials"):
        for seed in range(5):
            arrays = [a for case in CHECKS[name].make_random_cases(np.random.default_rng(seed)) for a in case.args
                      if isinstance(a, np.ndarray)]
            assert any(a.dtype == np.float32 for a in arrays) and any(a.ndim >= 4 for a in arrays), (name, seed)


# Inputs written in place, malformed answers, and what is not a function ---------------------------------------------


def merge_into_out_a(out_a, lse_a, out_b, lse_b):
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
    out_a[...] = out  # into the caller's array
    return out_a, lse


def test_an_input_written_in_place_is_refused_on_every_seed():
    for message in failures_on_every_seed("merge_partials", merge_into_out_a):
        assert "out_a was changed in place" in message and "work on a copy" in message, message


@pytest.mark.parametrize("name,fn,words", [
    ("shard_by_heads", lambda W, n_heads, world_size, *, axis=-1: None, "expected a list of 2 arrays (one shard "
                                                                        "each), got NoneType"),
    ("shard_by_heads", lambda W, n_heads, world_size, *, axis=-1: [W], "expected a list of 2 arrays (one shard "
                                                                       "each), got a list of 1"),
    ("shard_by_heads", lambda W, n_heads, world_size, *, axis=-1: [W, W], "shard 0: expected shape (8, 6) float64, "
                                                                          "got shape (8, 12) float64"),
    ("merge_partials", lambda out_a, lse_a, out_b, lse_b: out_a, "expected a tuple (out, lse), got ndarray"),
    ("merge_partials", lambda out_a, lse_a, out_b, lse_b: (out_a,), "expected a tuple of 2 (out, lse), got a tuple "
                                                                     "of length 1"),
    ("all_reduce_bytes", lambda n_elements, world_size, bytes_per_element=4: "6000 bytes",
     "result: expected numbers, got dtype <U10"),
])
def test_a_malformed_answer_gets_a_plain_message(name, fn, words):
    fn.__name__ = "mine"
    message = failures_on_every_seed(name, fn, seeds=[0])[0]
    assert words in message and "on the case '" in message, message


@pytest.mark.parametrize("name", CHAPTER_15)
def test_a_check_needs_a_function_and_refuses_the_library_s_own(name):
    with pytest.raises(CheckFailed, match=f"check_{name} needs a function, got int"):
        getattr(ch15, f"check_{name}")(3)
    with pytest.raises(CheckFailed, match=f"this is mha's own {name}, not yours: write it yourself"):
        getattr(ch15, f"check_{name}")(getattr(mnp, name))

    def calls_the_library(*args, **kwargs):
        return getattr(mnp, name)(*args, **kwargs)
    message = failures_on_every_seed(name, calls_the_library, seeds=[0])[0]
    assert f"calls mha's own {name}" in message and CHECKS[name].may_use in message


def shards_as_a_tuple(W, n_heads, world_size, *, axis=-1):
    return tuple(shard_by_heads(W, n_heads, world_size, axis=axis))


def shards_stacked(W, n_heads, world_size, *, axis=-1):
    return np.stack(shard_by_heads(W, n_heads, world_size, axis=axis))  # one array (P, ...)


def shards_as_views(W, n_heads, world_size, *, axis=-1):
    if n_heads % world_size:
        raise ValueError("world_size must divide n_heads")
    return np.split(W, world_size, axis=axis)  # the right numbers, as views of W


@pytest.mark.parametrize("fn,words", [(shards_as_a_tuple, "expected a list of 2 arrays (one shard each), got tuple"),
                                      (shards_stacked, "expected a list of 2 arrays (one shard each), got shape "
                                                       "(2, 8, 6) float64")], ids=["tuple", "stacked"])
def test_the_text_says_a_list_of_shards_so_a_tuple_or_one_stacked_array_fails(fn, words):
    """The comparison sees the container: the grader too (a list crosses the wire as a list)."""
    for message in failures_on_every_seed("shard_by_heads", fn):
        assert words in message and "on the case 'W_Q (d, h * d_head) = (8, 12)" in message, message


def test_the_text_says_copies_so_shards_that_are_views_of_w_fail_in_the_notebook():
    """The numbers are right on every case; the notebook's check then says which shard is a view of W."""
    for message in failures_on_every_seed("shard_by_heads", shards_as_views):
        assert "array 0 of the result shares memory with the input W" in message and "hint:" not in message, message


# What each exercise may not call, and the library's routes to its answer ----------------------------------------------


def test_forbids_names_library_functions_and_never_what_may_use_permits():
    """Each may_use permits NumPy or Python arithmetic only: it names no function of mha but to rule it out."""
    for name in CHAPTER_15:
        check = CHECKS[name]
        assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
        for named in re.findall(r"mnp\.(\w+)", check.may_use):
            assert f"(not mnp.{named})" in check.may_use and named in check.forbids, named
        assert check.packages == () and not check.float32_promised and check.make_random_cases is not None
    assert {"heads_from_fused", "split_heads"} <= set(CHECKS["shard_by_heads"].forbids)
    assert {"attention_partial", "scaled_dot_product_attention", "softmax", "ring_attention"} <= set(
        CHECKS["merge_partials"].forbids) and CHECKS["merge_partials"].returns == ("out", "lse")
    assert CHECKS["all_reduce_bytes"].forbids == ("wire_bytes",)


def shard_through_heads_from_fused(W, n_heads, world_size, *, axis=-1):
    if n_heads % world_size:
        raise ValueError("world_size must divide n_heads")
    moved = np.moveaxis(W, axis, -1)  # (..., h * d_head)
    flat = moved.reshape(-1, moved.shape[-1])  # (rows, h * d_head)
    heads = [W_q for W_q, _, _ in mnp.heads_from_fused(flat, flat, flat, n_heads)]  # h blocks (rows, d_head)
    g = n_heads // world_size
    return [np.moveaxis(np.concatenate(heads[r * g:(r + 1) * g], axis=-1).reshape(*moved.shape[:-1], -1), -1, axis)
            for r in range(world_size)]


def bytes_through_wire_bytes(n_elements, world_size, bytes_per_element=4):
    return mnp.wire_bytes({"forward": {"all_reduce": n_elements}}, world_size, bytes_per_element)["forward"][
        "all_reduce"]


def merge_through_attention_partial(out_a, lse_a, out_b, lse_b):
    """Each query alone, with two keys whose scores are lse_a and lse_b (q = 1, d = 1) and values out_a and out_b."""
    q = np.ones(lse_a.shape + (1, 1), dtype=lse_a.dtype)  # (..., T, 1, 1)
    k = np.stack([lse_a, lse_b], axis=-1)[..., None]  # (..., T, 2, 1)
    v = np.stack([out_a, out_b], axis=-2)  # (..., T, 2, d_v)
    keep = np.isfinite(k[..., 0])[..., None, :]  # (..., T, 1, 2): a side with lse = -inf has no key
    out, lse = mnp.attention_partial(q, np.where(np.isfinite(k), k, 0), v, keep)
    return out[..., 0, :], lse[..., 0]


ROUTES = [("shard_by_heads", shard_through_heads_from_fused), ("all_reduce_bytes", bytes_through_wire_bytes),
          ("merge_partials", merge_through_attention_partial)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[name for name, _ in ROUTES])
def test_a_library_route_is_refused_in_the_notebook_and_fails_in_the_student_edition(name, route, monkeypatch):
    """The route gives the right answer on every named case, where nothing looks; the notebook's check refuses it,
    naming the library function it calls, and so does the student edition in the grader."""
    check = CHECKS[name]
    for case in check.named_cases(0):
        if not case.raises:
            with np.errstate(all="ignore"):
                answer = case.call(route)
            assert compare_result(expected_answer(name, case), answer, check.returns) is None, case.label
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:3]):
        assert re.search(r"calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route, seeds=SEEDS[:3]):
            assert "this is the exercise" in message, message


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_solution_from_scratch_passes_in_the_student_edition(fn, monkeypatch):
    name = name_of(fn)
    with student_edition(name, monkeypatch):
        for seed in SEEDS[:3]:
            assert run(name, fn, seed).startswith(f"check_{name}: all "), seed


# The exercises' text, once chapter 15 is written ---------------------------------------------------------------------


CHAPTER = next(iter(sorted((ROOT / "book").glob("15_*.ipynb"))), None)


@pytest.mark.skipif(CHAPTER is None, reason="chapter 15 is not written yet: its exercises' text cannot be read")
def test_the_exercises_text_agrees_with_the_checks():
    """Each check's exercise exists; shard_by_heads asks for a ValueError when P does not divide h (its last named
    case requires it), the other two ask for no error; each rules out by name what its check forbids."""
    texts = {name: " ".join(text.split()) for name, text in exercise_texts(15).items()}
    assert sorted(texts) == sorted(CHAPTER_15)
    assert "ValueError" in texts["shard_by_heads"]
    for name in ("merge_partials", "all_reduce_bytes"):
        assert not re.search(r"ValueError|TypeError|\braise", texts[name]), name
    for name, text in texts.items():  # what it rules out by name, it forbids; "with NumPy" rules out the rest
        assert re.search(r"with (NumPy|Python arithmetic)", text), name
        for named in re.findall(r"without `mnp\.(\w+)`", text):
            assert named in CHECKS[name].forbids, (name, named)
    assert "-inf" in texts["merge_partials"] and "float" in texts["all_reduce_bytes"]
