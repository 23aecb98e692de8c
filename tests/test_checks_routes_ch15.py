"""The routes to an answer of chapter 15 (heads across devices): what each exercise may not call (`forbids`)
agrees with its text, so that the student edition of mha refuses the library's routes to the answer while a
solution from scratch passes in it; and the exercises' text agrees with the checks."""

import re
from pathlib import Path

import numpy as np
import pytest

from learners import SEEDS, exercise_texts, student_edition
from solutions_ch15 import CHAPTER_15, FROM_SCRATCH, RANKS_15, failures_on_every_seed, name_of, run

import mha.numpy as mnp
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer

ROOT = Path(__file__).resolve().parents[1]


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
    assert sorted(texts) == sorted(CHAPTER_15 + RANKS_15)
    assert "ValueError" in texts["shard_by_heads"]
    for name in ("merge_partials", "all_reduce_bytes"):
        assert not re.search(r"ValueError|TypeError|\braise", texts[name]), name
    for name, text in texts.items():  # what it rules out by name, it forbids; "with NumPy" rules out the rest
        assert re.search(r"with (NumPy|Python arithmetic)", text), name
        for named in re.findall(r"without `mnp\.(\w+)`", text):
            assert named in CHECKS[name].forbids, (name, named)
    assert "-inf" in texts["merge_partials"] and "float" in texts["all_reduce_bytes"]
