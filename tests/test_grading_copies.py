"""The copy column of grade.py (tools/grading/copies.py): a graded function that is the library's code,
or a listing of the chapter, is named; a solution written from scratch is not.

Unit tests of the comparison (a renamed copy, a near copy with its similarity, a helper's copy, the
methods of a class that the chapter lists, the definition the notebook leaves in force, one-liners),
every from-scratch solution of tests/solutions_*.py compared with its library function and its
chapter's listings, and one grade.py run on two notebooks of chapter 1.
"""

import ast
import contextlib
import csv
import inspect
import io
import json
import re
import textwrap

import nbformat
import pytest

import mha.numpy as mn
from conftest import CHAPTERS, ROOT
from handouts import shared_handout, student_notebook
from learners import right_solutions
import solutions_ch01_06

from tools.grading import copies, grade
from tools.publishing.handout_manifest import chapter_exercises

CHAPTER_1 = ROOT / "book" / "01_weighted_average.ipynb"
CHAPTER_5 = ROOT / "book" / "05_fused_heads_and_masks.ipynb"


class Disguise(ast.NodeTransformer):
    """What a learner does to hide a copy: every name and argument renamed, docstrings dropped."""

    def visit_Name(self, node):
        node.id = f"my_{node.id}"
        return node

    def visit_arg(self, node):
        node.arg = f"my_{node.arg}"
        return node

    def visit_FunctionDef(self, node):
        node.body = [s for s in node.body if not copies.is_docstring(s)]
        self.generic_visit(node)
        return node


def library_source(fn):
    return textwrap.dedent(inspect.getsource(fn))


def disguised(fn, name=None, extra=""):
    """The library's `fn` renamed throughout (its name `name`), with `extra` statements first in its body."""
    node = Disguise().visit(ast.parse(library_source(fn)).body[0])
    node.name = name or fn.__name__
    node.body = ast.parse(extra).body + node.body
    return "# my own work\n" + ast.unparse(node)


def test_a_renamed_copy_without_its_docstring_is_the_library_s_code():
    found = copies.copies_of([disguised(mn.softmax)], "softmax", CHAPTER_1)
    assert found.startswith("the library's code: mha.numpy.softmax"), found
    assert "%" not in found and "short" not in found, "an identical tree is a copy, not a near one"


def test_a_from_scratch_solution_is_no_copy():
    code = inspect.getsource(solutions_ch01_06)
    assert copies.copies_of([code], "softmax", CHAPTER_1) == ""
    assert copies.copies_of([code], "multihead_attention", CHAPTER_5) == ""


def test_a_near_copy_is_reported_with_its_similarity():
    code = disguised(mn.multihead_attention, extra="print('shapes', X.shape)")
    found = copies.copies_of([code], "multihead_attention", CHAPTER_5)
    said = re.fullmatch(r"nearly the library's code \((\d+)% alike\): mha\.numpy\.multihead_attention.*", found)
    assert said and copies.NEAR * 100 <= int(said.group(1)) < 100, found


def test_a_changed_function_is_no_copy_at_all():
    code = disguised(mn.multihead_attention, extra="\n".join(f"print('step', {i}, X.shape, X.sum())" for i in range(8)))
    assert copies.copies_of([code], "multihead_attention", CHAPTER_5) == ""


def test_a_helper_that_is_the_library_s_code_is_named():
    helper = disguised(mn.scaled_dot_product_attention, name="attend")
    graded = inspect.getsource(solutions_ch01_06.multihead_attention).replace(
        "scaled_dot_product_attention(", "attend(")
    assert "attend(" in graded, "the from-scratch solution must call the helper"
    found = copies.copies_of([helper, graded], "multihead_attention", CHAPTER_5)
    assert found == "helper `attend`: the library's code: mha.numpy.scaled_dot_product_attention", found


def test_the_methods_of_a_class_the_chapter_lists_are_compared(tmp_path):
    chapter = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "```{literalinclude} /src/mha/torch/attention.py\n:language: python\n:pyobject: MultiHeadAttentionLoop\n```")])
    nbformat.write(chapter, tmp_path / "chapter.ipynb")
    import mha.torch.attention as attention
    code = disguised(attention.MultiHeadAttentionLoop.forward, name="multihead_attention_loop")
    found = copies.copies_of([code], "multihead_attention_loop", tmp_path / "chapter.ipynb")
    assert found == ("the library's code: mha.torch.attention.MultiHeadAttentionLoop.forward "
                     "(the chapter's listing)"), found
    assert copies.copies_of([code], "multihead_attention_loop", None) == "", "no listing, no match"


def test_a_listing_of_part_of_a_file_shows_only_the_functions_it_cuts_into(tmp_path):
    chapter = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "```{literalinclude} /src/mha/numpy/attention.py\n:language: python\n"
        ":start-at: def merge_heads\n:end-before: def attention_shape\n```")])
    nbformat.write(chapter, tmp_path / "chapter.ipynb")
    labels = {c.label for c in copies.listed_candidates(str(tmp_path / "chapter.ipynb"))}
    assert labels == {"mha.numpy.attention.merge_heads", "mha.numpy.attention.heads_from_fused"}, labels
    shown = disguised(mn.heads_from_fused, name="fused_weights")
    assert copies.copies_of([shown], "fused_weights", tmp_path / "chapter.ipynb").startswith("the library's code")
    unshown = disguised(mn.multihead_attention_loop, name="loop")
    assert copies.copies_of([unshown], "loop", tmp_path / "chapter.ipynb") == ""


def test_the_definition_in_force_is_the_one_compared():
    copied, own = disguised(mn.softmax), inspect.getsource(solutions_ch01_06.softmax)
    assert copies.copies_of([own, copied], "softmax", CHAPTER_1).startswith("the library's code")
    assert copies.copies_of([copied, own], "softmax", CHAPTER_1) == "", "redefined after: the copy is gone"
    assert copies.copies_of([copied, "softmax = None"], "softmax", CHAPTER_1) == ""
    assert copies.copies_of([copied, "from scipy.special import softmax"], "softmax", CHAPTER_1) == ""
    assert copies.copies_of(["def softmax(:", copied], "softmax", CHAPTER_1), "a broken cell is skipped"


def test_a_one_liner_is_reported_only_when_identical_and_marked_short():
    one_liner = "def soft_cap(x, cap):\n    return np.tanh(x / cap) * cap\n"
    node = ast.parse(one_liner).body[0]
    assert copies.Shape.of(node).nodes < copies.SHORT_NODES
    library = copies.library_candidates("soft_cap")[0].shape
    assert copies.similarity(copies.Shape.of(node), library) < 1.0
    assert copies.copies_of([one_liner], "soft_cap", None) == "", "a near short function is not reported"
    exact = disguised(mn.causal_mask)
    assert copies.copies_of([exact], "causal_mask", None) == \
        "the library's code, short, often written alike: mha.numpy.causal_mask"


def test_the_library_candidates_follow_the_calls_inside_mha_numpy():
    labels = [c.label for c in copies.library_candidates("multihead_attention")]
    assert labels[0] == "mha.numpy.multihead_attention"
    assert {"mha.numpy.split_heads", "mha.numpy.merge_heads", "mha.numpy.scaled_dot_product_attention"} <= set(labels)
    assert copies.library_candidates("not_in_the_library") == ()


def test_a_comparison_that_fails_never_stops_the_grading(monkeypatch):
    def broken(*args):
        raise RuntimeError("unreadable")
    monkeypatch.setattr(copies, "copies_of", broken)
    found = copies.copy_column(["x = 1"], ["softmax", "softmax"], "book/01_weighted_average.ipynb")
    assert found == {"softmax": "not compared (RuntimeError: unreadable)"}


def test_comparisons_past_their_time_are_said_to_be_so():
    found = copies.copies_of([disguised(mn.softmax)], "softmax", None, deadline=0.0)
    assert found == f"`softmax` and the functions after it not compared (past {copies.COMPARE_SECONDS:g} s)"


def chapters_of_functions():
    """{graded function: its chapter's notebook}."""
    return {check["function"]: path for path in CHAPTERS for exercise in chapter_exercises(path)
            for check in exercise["checks"]}


def test_no_from_scratch_solution_is_reported_as_a_copy():
    """Every right solution of tests/solutions_*.py, with its helpers of the same module, against its library
    function and its chapter's listings. (No exact one-liner of them matches today; one that did would be
    reported "short, often written alike", and would be listed here.)"""
    chapters = chapters_of_functions()
    solutions = {name: fn for name, fn in right_solutions().items() if name in chapters}  # a chapter in writing waits
    assert len(solutions) >= 36, sorted(set(chapters) - set(solutions))
    reported = {}
    for name, fn in solutions.items():
        code = inspect.getsource(inspect.getmodule(fn)).replace(f"def {fn.__name__}(", f"def {name}(")
        reported[name] = copies.copies_of([code], name, chapters[name])
    assert {n: r for n, r in reported.items() if r} == {}


# One grade.py run: a pasted library function is named, a from-scratch notebook is not -------------------

def stub(notebook, function):
    return next(c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])
                and f"def {function}(" in c.source)


ATTENTION_THROUGH_SOFTMAX = """import math

def self_attention(X, exclude_self=False):
    T = X.shape[-2]
    scores = X @ np.swapaxes(X, -1, -2) / math.sqrt(X.shape[-1])  # (..., T, T)
    w = softmax(np.where(np.eye(T, dtype=bool) & exclude_self, -np.inf, scores), axis=-1)
    return w @ X, w
"""


def own_self_attention():
    """The from-scratch self_attention of tests/solutions_ch01_06.py, with its helper."""
    return "import math\n\n" + "\n\n".join(inspect.getsource(f) for f in (
        solutions_ch01_06.rows_softmax, solutions_ch01_06.self_attention))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """grade.py on two notebooks of chapter 1: (rows of grades.json by student and check, grades.csv, stdout)."""
    handout, folder = shared_handout(tmp_path_factory), tmp_path_factory.mktemp("copies")
    pasted, scratch = (student_notebook(handout, CHAPTER_1) for _ in range(2))
    stub(pasted, "softmax").source = library_source(mn.softmax)
    stub(pasted, "self_attention").source = ATTENTION_THROUGH_SOFTMAX
    stub(scratch, "softmax").source = inspect.getsource(solutions_ch01_06.softmax)
    stub(scratch, "self_attention").source = own_self_attention()
    for name, notebook in (("pasted", pasted), ("scratch", scratch)):
        nbformat.write(notebook, folder / f"{name}.ipynb")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        grade.main([str(folder / "pasted.ipynb"), str(folder / "scratch.ipynb"), "--out", str(folder),
                    "--manifest", str(handout / "student" / "exercises.json"), "--jobs", "2"])
    rows = {(r["student"], r["check"]): r for r in json.loads((folder / "grades.json").read_text())}
    with open(folder / "grades.csv", newline="") as table:
        return rows, list(csv.DictReader(table)), out.getvalue()


def test_grade_py_names_a_pasted_library_function(graded):
    rows, _, printed = graded
    softmax, attention = rows["pasted", "check_softmax"]["copy"], rows["pasted", "check_self_attention"]["copy"]
    assert softmax.startswith("the library's code: mha.numpy.softmax"), softmax
    assert attention.startswith("helper `softmax`: the library's code: mha.numpy.softmax"), attention
    assert f"copy: {softmax}" in printed


def test_grade_py_leaves_the_column_empty_for_a_from_scratch_notebook(graded):
    rows, table, _ = graded
    assert rows["scratch", "check_softmax"]["passed"] and rows["scratch", "check_self_attention"]["passed"]
    assert rows["scratch", "check_softmax"]["copy"] == rows["scratch", "check_self_attention"]["copy"] == ""
    assert list(table[0])[-1] == "copy" and len(table) == len(rows) == 4
    assert all(line["copy"] == rows[line["student"], line["check"]]["copy"] for line in table)


def test_the_copy_goes_to_gradescope_s_extra_data_never_to_what_the_student_reads(graded):
    from tools.grading.exports import gradescope_results
    rows, _, _ = graded
    results = gradescope_results([r for (student, _), r in rows.items() if student == "pasted"])
    copied = next(t for t in results["tests"] if t["name"].endswith("check_softmax"))
    assert copied["extra_data"]["copy"] == rows["pasted", "check_softmax"]["copy"]
    assert "library's code" not in results["output"] + "".join(t["output"] for t in results["tests"])
