"""Grading that an instructor can trust: tools/grading/grade.py.

The checks expected of a notebook come from the handout's list of exercises,
and the grader runs each one itself on the student's function. Proven on
chapter 5 (five checks; one exercise has two): a class of three notebooks (the
handout's stubs, the key, a tampered copy) is graded in parallel; the key scores
every point, a stub or a missing function scores nothing and is named, a wrong
function fails with the check's whole message, hint included, and every
tampered check cell (printed over, removed, edited, renamed) fails and is named.
"""

import contextlib
import csv
import io
import json

import nbformat
import pytest

from conftest import CHAPTERS, ROOT
from handouts import shared_handout, student_notebook, with_key_code

from tools.grading import check_cells, grade, notebook_slice
from tools.publishing import handout_manifest

CHAPTER = ROOT / "book" / "05_fused_heads_and_masks.ipynb"
WRONG_MERGE = '''def merge_heads(X):
    *batch, h, T, d_head = X.shape
    return X.reshape(*batch, T, h * d_head)  # no transpose back
'''
HIDDEN_HELPER = '''exec("def _block(X, i, w):\\n    return X[..., i * w:(i + 1) * w]")  # no slice sees this name

def split_heads(X, n_heads):
    w = X.shape[-1] // n_heads
    return np.stack([_block(X, i, w) for i in range(n_heads)], axis=-3)
'''


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    """The handout that the test files of this run share (tests/handouts.py): read only."""
    return shared_handout(tmp_path_factory)


def cell_with(notebook, text):
    return next(c for c in notebook.cells if c.cell_type == "code" and text in c.source)


def tampered(notebook):
    """The key's answers, then: split_heads through a helper that only a whole run defines; a
    wrong merge_heads; the check cells of causal_mask printed over, of padding_mask removed,
    of multihead_attention edited."""
    cell_with(notebook, "def split_heads").source = HIDDEN_HELPER + "\n\n" + WRONG_MERGE
    cell_with(notebook, "check_causal_mask(causal_mask)").source = 'print("check_causal_mask: all 4 cases passed.")'
    notebook.cells.remove(cell_with(notebook, "check_padding_mask(padding_mask)"))
    cell_with(notebook, "check_multihead_attention(multihead_attention)").source += "\nprint('done')"
    return notebook


@pytest.fixture(scope="module")
def graded(handout, tmp_path_factory):
    """grade.py run on a class of three: (exit code, rows of grades.json, of grades.csv, stdout, stderr)."""
    folder = tmp_path_factory.mktemp("submissions")
    stubs = student_notebook(handout, CHAPTER)
    stubs.cells.remove(cell_with(stubs, "def multihead_attention"))  # a missing function
    for name, notebook in [("ada", with_key_code(student_notebook(handout, CHAPTER), CHAPTER)), ("bob", stubs),
                           ("cy", tampered(with_key_code(student_notebook(handout, CHAPTER), CHAPTER)))]:
        nbformat.write(notebook, folder / f"{name}.ipynb")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = grade.main([str(folder / f"{n}.ipynb") for n in ("ada", "bob", "cy")] + [
            "--manifest", str(handout / "student" / "exercises.json"), "--out", str(folder), "--jobs", "2"])
    rows = json.loads((folder / "grades.json").read_text())
    with open(folder / "grades.csv", newline="") as table:
        return code, rows, list(csv.DictReader(table)), out.getvalue(), err.getvalue()


def rows_of(graded, student):
    return {row["check"]: row for row in graded[1] if row["student"] == student}


def test_the_list_of_exercises_names_every_check_with_its_points(handout):
    manifest = handout_manifest.read_manifest(handout / "student" / "exercises.json")
    chapters = {c["notebook"]: c for c in manifest["chapters"]}
    assert set(chapters) == {f"book/{c.name}" for c in CHAPTERS} and f"book/{CHAPTER.name}" in chapters
    for notebook, chapter in chapters.items():
        student = nbformat.read(handout / "student" / notebook, as_version=4)
        sources = [c.source for c in student.cells if c.cell_type == "code"]
        for exercise in chapter["exercises"]:
            assert exercise["points"] == exercise["difficulty"].count("★")
            assert bool(exercise["checks"]) == (exercise["kind"] == "Implement"), exercise["label"]
            assert not exercise["checks"] or exercise["check_cell"] in sources, exercise["label"]


def test_points_in_the_exercise_metadata_replace_the_stars(tmp_path):
    notebook = nbformat.read(CHAPTER, as_version=4)
    cell = next(c for c in notebook.cells if ":label: ex-ch5-multihead" in c.source)
    cell.metadata["points"] = 5
    nbformat.write(notebook, tmp_path / CHAPTER.name)
    found = {e["label"]: e["points"] for e in handout_manifest.chapter_exercises(tmp_path / CHAPTER.name)}
    assert found["ex-ch5-multihead"] == 5 and found["ex-ch5-causal-mask"] == 1
    cell.metadata["points"] = "many"
    nbformat.write(notebook, tmp_path / CHAPTER.name)
    with pytest.raises(ValueError, match="points"):
        handout_manifest.chapter_exercises(tmp_path / CHAPTER.name)


def test_the_key_scores_every_point(graded):
    ada = rows_of(graded, "ada")
    assert all(row["passed"] for row in ada.values()), ada
    assert sum(row["points"] for row in ada.values()) == 6  # ★☆☆ + ★☆☆ + ★☆☆ + ★★★
    assert ada["check_split_heads"]["points"] == ada["check_merge_heads"]["points"] == 0.5


def test_stubs_and_missing_functions_score_nothing_and_are_named(graded):
    bob = rows_of(graded, "bob")
    assert set(bob) == {"check_split_heads", "check_merge_heads", "check_causal_mask", "check_padding_mask",
                        "check_multihead_attention"}
    assert not any(row["passed"] or row["points"] for row in bob.values())
    assert "`causal_mask` is not written yet" in bob["check_causal_mask"]["message"]
    assert "`multihead_attention` is not defined" in bob["check_multihead_attention"]["message"]


def test_a_wrong_function_fails_with_the_whole_message_hint_included(graded):
    cy = rows_of(graded, "cy")
    message = cy["check_merge_heads"]["message"]
    assert not cy["check_merge_heads"]["passed"] and message.startswith("merge_heads gives a wrong answer")
    assert "input:" in message and "hint: swap the h and T axes back" in message
    assert cy["check_split_heads"]["passed"], "a name the slice missed: the whole notebook must run"
    assert grade.indent(message, 10) in graded[3], "the summary shows each failure in full"


@pytest.mark.parametrize("check,how", [("check_causal_mask", "printed over"), ("check_padding_mask", "removed"),
                                       ("check_multihead_attention", "edited")])
def test_a_tampered_check_cell_fails_and_is_named(graded, check, how):
    row = rows_of(graded, "cy")[check]
    assert not row["passed"] and row["points"] == 0
    assert row["message"].startswith(f"check cell {how}") and "the check passes" in row["message"]


def test_grades_csv_and_json_hold_the_same_rows_and_the_exit_code_says_not_all_passed(graded):
    code, rows, table, _, progress = graded
    assert code == 1 and len(rows) == len(table) == 15
    assert list(table[0])[:6] == ["student", "exercise", "check", "passed", "message", "points"]
    for row, line in zip(rows, table):
        assert line["passed"] == str(row["passed"]).lower() and float(line["points"]) == row["points"]
        assert line["message"] == row["message"] and line["exercise"] == row["exercise"]
    assert "grading [" in progress and "3/3" in progress


CHECK_CELL = "from mha.checks import check_causal_mask\ncheck_causal_mask(causal_mask)"


@pytest.mark.parametrize("replacement,how", [
    (CHECK_CELL.replace("\n", "  # my comment\n"), None),
    ('print("check_causal_mask: all 4 cases passed.")', "printed over"),
    ("x = 1", "removed"),
    (CHECK_CELL + "\nprint('ok')", "edited"),
    (CHECK_CELL.replace("(causal_mask)", "(np.tril)"), "renamed"),
    ("from mha.checks import check_causal_mask as c\nc(causal_mask)", "renamed"),
])
def test_each_way_of_tampering_is_named(handout, replacement, how):
    notebook = student_notebook(handout, CHAPTER)
    cell_with(notebook, CHECK_CELL).source = replacement
    manifest = handout_manifest.read_manifest(handout / "student" / "exercises.json")
    exercise = next(e for c in manifest["chapters"] for e in c["exercises"] if e["label"] == "ex-ch5-causal-mask")
    found = check_cells.tampered_checks(notebook.cells, exercise)
    assert (found["check_causal_mask"].split(":")[0] if found else None) == how, found


def test_the_slice_runs_what_a_function_needs_and_skips_the_rest():
    notebook = nbformat.read(ROOT / "book" / "07_why_heads_differ.ipynb", as_version=4)
    code = "\n".join(code for _, code in notebook_slice.code_binding(notebook.cells, {"attention_at_offset"}))
    assert "def attention_at_offset" in code and "import numpy as np" in code
    assert "train(" not in code and "import torch" not in code, "the slice took what the function never uses"
