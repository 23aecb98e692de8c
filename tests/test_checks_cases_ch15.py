"""The cases of chapter 15's checks (heads across devices): the traps are in the named cases and the random
ones hold float32 and 4-D arrays; an input written in place is refused; a malformed answer, or a check handed no
function or the library's own, gets a plain message; a tuple or a stacked array where the text says a list of
shards fails, and so do shards that are views where the text says copies."""

import numpy as np
import pytest

from solutions_ch15 import CHAPTER_15, failures_on_every_seed, labelled, merge_partials, shard_by_heads

import mha.numpy as mnp
from mha.checks import ch15
from mha.checks.registry import CHECKS, CheckFailed, expected_answer


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
