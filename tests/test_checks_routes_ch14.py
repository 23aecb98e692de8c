"""The routes to an answer of chapter 14 (a model that writes): what each exercise may not call (`forbids`)
agrees with its text, so that the student edition of mha refuses the library's routes to the answer while a
solution from scratch passes in it; and the exercises' text agrees with the checks."""

import re
from pathlib import Path

import pytest

from learners import SEEDS, exercise_texts, failures_on_every_seed, run, student_edition
from solutions_ch14 import CHAPTER_14, FILTERS, FROM_SCRATCH

import mha.numpy as mnp
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer

ROOT = Path(__file__).resolve().parents[1]


# What each exercise may not call, and the library's routes to its answer -----------------------------------------


def named(forbidden):
    """How the text names a forbidden function: mnp.<name>, or its dotted name in another module of mha."""
    return forbidden if "." in forbidden else f"mnp.{forbidden}"


def test_forbids_names_library_functions_and_never_what_may_use_permits():
    for name in CHAPTER_14:
        check = CHECKS[name]
        assert {f for f in check.forbids if "." not in f} <= set(mnp.__all__) and name not in check.forbids
        for forbidden in check.forbids:
            assert not re.search(rf"(?<!not )(?<!without ){re.escape(named(forbidden))}\b", check.may_use), forbidden
        assert check.packages == () and not check.float32_promised
    for name in FILTERS:
        assert CHECKS[name].forbids == ("filter_logits",) and "not mnp.filter_logits" in CHECKS[name].may_use
    assert "mnp.softmax" in CHECKS["top_p_filter"].may_use and "softmax" not in CHECKS["top_p_filter"].forbids


def bits_by_mha_text(mean_loss, n_tokens, n_characters):
    from mha.text import bits_per_character as renamed
    return renamed(float(mean_loss) * int(n_tokens), int(n_characters))


def test_the_bits_route_of_mha_text_is_right_but_refused_in_the_notebook_and_out_of_the_graders_reach():
    """mha.text.bits_per_character gives the answer from the total nats: the notebook's check refuses it by its
    dotted name (renamed too), and the student edition that grades copies mha.numpy and what it imports, never
    mha.text."""
    from tools.grading import student_edition
    assert CHECKS["loss_to_bits_per_character"].forbids == ("mha.text.bits_per_character",)
    for case in CHECKS["loss_to_bits_per_character"].named_cases(0):
        assert compare_result(expected_answer("loss_to_bits_per_character", case), case.call(bits_by_mha_text),
                              None) is None, case.label
    for message in failures_on_every_seed("loss_to_bits_per_character", bits_by_mha_text, seeds=SEEDS[:2]):
        assert message.startswith("loss_to_bits_per_character calls mha's own mha.text.bits_per_character, which "
                                  "does this exercise's work"), message
    assert "numpy" in student_edition.COPIED and not any("text" in part for part in student_edition.COPIED)


def by_filter_logits(option):
    def route(logits, value):
        return mnp.filter_logits(logits, **{option: value})
    return route


ROUTES = [("apply_temperature", by_filter_logits("temperature")), ("top_k_filter", by_filter_logits("top_k")),
          ("top_p_filter", by_filter_logits("top_p"))]


@pytest.mark.parametrize("name,route", ROUTES, ids=[name for name, _ in ROUTES])
def test_a_library_route_is_right_in_the_notebook_and_fails_in_the_student_edition(name, route, monkeypatch):
    check = CHECKS[name]
    for case in check.named_cases(0):
        assert compare_result(expected_answer(name, case), case.call(route), check.returns) is None, case.label
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route):
            assert "this is the exercise" in message, message


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_solution_from_scratch_passes_in_the_student_edition(fn, monkeypatch):
    name = fn.__name__.replace("_row_by_row", "")
    with student_edition(name, monkeypatch):
        for seed in SEEDS[:3]:
            assert run(name, fn, seed).startswith(f"check_{name}: all "), seed


# The exercises' text, once chapter 14 is written ------------------------------------------------------------------


CHAPTER = next(iter(sorted((ROOT / "book").glob("14_*.ipynb"))), None)


@pytest.mark.skipif(CHAPTER is None, reason="chapter 14 is not written yet: its exercises' text cannot be read")
def test_the_exercises_text_agrees_with_the_checks():
    """Each check's exercise exists, asks for no error, rules out by name what the check forbids, and never
    permits it; the top-p exercise says where its cut is (the mass of the tokens above < p)."""
    texts = {name: " ".join(text.split()) for name, text in exercise_texts(14).items()}
    assert sorted(texts) == sorted(CHAPTER_14)
    for name, text in texts.items():
        assert not re.search(r"ValueError|TypeError|\braise", text), name
        for forbidden in CHECKS[name].forbids:
            assert re.search(rf"without `{re.escape(named(forbidden))}`", text), (name, forbidden)
            assert not re.search(rf"(?<!not )(?<!without )`{re.escape(named(forbidden))}`", text), (name, forbidden)
    assert "-np.inf" in texts["top_k_filter"] and "tied" in texts["top_k_filter"]
    assert "less than" in texts["top_p_filter"] and "at least one" in texts["top_p_filter"]
