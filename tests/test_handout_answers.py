"""No answer in sight: the students' edition shows no library code that answers an Implement exercise.

For every Implement exercise of every chapter, the handout's student notebooks (which the student website
renders) hold no `{literalinclude}` of the library function that the exercise replaces, nor of its routes
(tools/publishing/hidden_listings.py), and no code cell defining a function equal to one of them by syntax
tree (tools/grading/copies.py); the stubs' docstrings hold no line of the answer's code; the student website
holds none of those bodies; the instructor's edition keeps every listing.
"""

import ast
import functools
import inspect

import nbformat
import pytest

import mha.numpy as mnp

from conftest import CHAPTERS, ROOT
from handouts import key_codes, shared_handout, student_notebook
from leaks import found_in, normal, readable_texts

from tools.grading.copies import is_docstring, normalised
from tools.publishing import hidden_listings, make_handout, nbgrader_source
from tools.publishing.listings import find_object, listings

EXERCISES = hidden_listings.implement_exercises()
EXERCISE_IDS = [f"{e.label}:{e.function}" for e in EXERCISES]


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    """The shared handout's notebooks (tests/handouts.py), built once per run. Read only."""
    return shared_handout(tmp_path_factory)


@functools.cache
def student_notebooks(handout):
    return {chapter.name: student_notebook(handout, chapter) for chapter in CHAPTERS}


def answer_nodes(function):
    """{(file, qualname): syntax tree} of the library function of `function` and of its routes."""
    return {(file, name): find_object(hidden_listings.module_tree(file), name)
            for file, name in hidden_listings.answer_objects(function)}


def shown_answer(listing, function):
    """The answer objects of `function` whose body lines `listing` shows."""
    path, lines = hidden_listings.shown_lines(listing)
    return sorted(name for file, name in hidden_listings.answer_objects(function)
                  if file == path and hidden_listings.body_lines(file, name) & lines)


def test_the_routes_are_derived_where_the_library_delegates():
    """The routes come from the syntax trees: the functions each answer calls in mha.numpy, transitively, and the
    check's forbidden functions that compute the answer on their own (outside mha.numpy too)."""
    def names(function):
        return {name for _, name in hidden_listings.answer_objects(function)}
    assert {"causal_lm_loss", "log_softmax", "cross_entropy"} <= names("causal_lm_loss")
    assert {"swiglu", "gated_feed_forward", "silu"} <= names("swiglu")
    assert {"sliding_window_mask", "causal_mask_after"} <= names("sliding_window_mask")
    assert {"repeat_kv", "apply_rotary", "rotary_embedding", "rotate_half", "KVCache"} <= names("attend_with_cache")
    assert {"split_heads", "heads_from_fused"} <= names("split_heads")  # forbidden, and computes it on its own
    assert ("src/mha/text/tokenizer.py", "bits_per_character") in hidden_listings.answer_objects(
        "loss_to_bits_per_character")
    assert "encoder" not in names("encoder_block")  # it calls encoder_block: its code shows only a call
    assert "decoder_only_transformer" not in names("causal_lm_loss")
    assert "head_attention" not in names("scaled_dot_product_attention")  # a caller is no route


@pytest.mark.parametrize("exercise", EXERCISES, ids=EXERCISE_IDS)
def test_no_student_notebook_lists_the_answer_or_its_routes(handout, exercise):
    for name, notebook in student_notebooks(handout).items():
        shown = [(listing.cell, found) for listing in listings(notebook)
                 if (found := shown_answer(listing, exercise.function))]
        assert not shown, f"{name} lists {shown} of {exercise.function}'s answer (cell, objects)"


def copied_answers(notebook, function):
    """[(cell, function defined there, the answer object it equals)] for the code cells of `notebook` that define a
    function or class equal by syntax tree (names, docstrings aside) to one of `function`'s answer objects."""
    answers = {normalised(node): name for (_, name), node in answer_nodes(function).items()}
    found = []
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or "def " not in cell.source and "class " not in cell.source:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell of IPython magics
            continue
        found += [(i, node.name, answers[normalised(node)]) for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and normalised(node) in answers]
    return found


@pytest.mark.parametrize("exercise", EXERCISES, ids=EXERCISE_IDS)
def test_no_student_code_cell_holds_the_answer_or_its_routes(handout, exercise):
    for name, notebook in student_notebooks(handout).items():
        copies = copied_answers(notebook, exercise.function)
        assert not copies, f"{name} defines the library's code (cell, name, library's): {copies}"


def renamed(function, old, new):
    """The source of a library function with its name and the variable `old` renamed, its docstring dropped."""
    tree = ast.parse(inspect.getsource(function))
    tree.body[0].name, tree.body[0].body = f"my_{function.__name__}", tree.body[0].body[1:]
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == old:
            node.id = new
        elif isinstance(node, ast.arg) and node.arg == old:
            node.arg = new
    return ast.unparse(tree)


def test_a_code_cell_with_the_librarys_code_renamed_is_seen():
    cells = [nbformat.v4.new_code_cell("import numpy as np\n\n" + renamed(mnp.causal_lm_loss, "logits", "z")),
             nbformat.v4.new_code_cell("# the route\n" + renamed(mnp.log_softmax, "shifted", "s")),
             nbformat.v4.new_code_cell(renamed(mnp.softmax, "x", "y")),  # forbidden, and a softmax of its own
             nbformat.v4.new_code_cell(renamed(mnp.alibi_slopes, "n_heads", "h"))]  # no route of the loss
    found = copied_answers(nbformat.v4.new_notebook(cells=cells), "causal_lm_loss")
    assert [(cell, name) for cell, _, name in found] == [(0, "causal_lm_loss"), (1, "log_softmax"), (2, "softmax")]


def body_text(text, node):
    """The lines of a function's body in its source `text` (docstrings aside) worth searching for, normalised:
    16 characters or more."""
    body = node.body[1:] if node.body and is_docstring(node.body[0]) else node.body
    lines = text.splitlines()
    found = {normal(lines[n - 1]) for statement in body for n in range(statement.lineno, statement.end_lineno + 1)}
    return {line for line in found if len(line) >= 16}


def answer_lines(function):
    """{line: qualname} of the bodies of `function`'s answer objects in the library's files."""
    return {line: name for (file, name), node in answer_nodes(function).items()
            for line in body_text((ROOT / file).read_text(), node)}


def solution_code_lines(chapter):
    """Every distinctive line of the key's code of a chapter's stubs (signatures and docstrings aside)."""
    return {line for code in key_codes(chapter) for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)
            for line in body_text(code, node)}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_the_stubs_docstrings_hold_no_line_of_the_answer(handout, chapter):
    notebook = student_notebooks(handout)[chapter.name]
    exercises = [e for e in EXERCISES if e.chapter == int(chapter.name[:2])]
    answer = solution_code_lines(chapter)
    for exercise in exercises:
        answer |= set(answer_lines(exercise.function))
    stubs = [c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])]
    assert len(stubs) == len(key_codes(chapter)), f"{chapter.name}: a stub for each code solution"
    for stub in stubs:
        for node in ast.parse(stub.source).body:
            docstring = normal(ast.get_docstring(node) or "")
            leaked = {line for line in answer if line in docstring}
            assert not leaked, f"{chapter.name}: the docstring of {node.name} holds the answer's {sorted(leaked)}"


def test_the_instructors_edition_keeps_every_listing(handout):
    """The key (and so the full site) keeps each listing that the students do not see: 30 and more of them."""
    hidden = 0
    for chapter in CHAPTERS:
        book = nbformat.read(chapter, as_version=4)
        key = nbformat.read(handout / "key" / chapter.name, as_version=4)
        assert [listing.text for listing in listings(key)] == [listing.text for listing in listings(book)]
        hidden += sum(hidden_listings.hidden(listing, int(chapter.name[:2])) is not None for listing in listings(book))
    assert hidden >= 30


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_nbgrader_notebooks_list_no_answer(chapter):
    """nbgrader's release of a chapter (made from its source version) shows no answer either."""
    notebook = nbgrader_source.source_notebook(chapter)
    number = int(chapter.name[:2])
    assert not [listing.pyobject for listing in listings(notebook) if hidden_listings.hidden(listing, number)]


def shown_text(listing):
    """The normalised lines that a listing shows."""
    path, numbers = hidden_listings.shown_lines(listing)
    lines = (ROOT / path).read_text().splitlines()
    return {normal(lines[n - 1]) for n in numbers}


def test_the_student_site_shows_no_answer(tmp_path_factory):
    """The student website's chapter pages hold no distinctive line of any hidden body (one per answer object:
    the longest that no listing the students see holds too)."""
    site = shared_handout(tmp_path_factory, html=True) / "html"
    kept = set().union(*(shown_text(listing) for notebook in student_notebooks(site.parent).values()
                         for listing in listings(notebook)))
    distinctive = {}
    for exercise in EXERCISES:
        by_object = {}
        for line, name in answer_lines(exercise.function).items():
            if line not in kept and len(line) >= 30:
                by_object[name] = max(by_object.get(name, ""), line, key=len)
        distinctive.update({line: name for name, line in by_object.items()})
    assert len(distinctive) >= 30
    for page in sorted((site / "book").glob("*.html")):
        leaked = found_in(set(distinctive), readable_texts(page))
        assert not leaked, f"{page.name} shows {sorted(distinctive[line] for line in leaked)}"


# The hiding itself, on a made-up chapter ---------------------------------------------------------------------

def made_up_chapter(*listings_text):
    return [nbformat.v4.new_markdown_cell(f"Some text.\n\n{text}\nMore text.") for text in listings_text]


def directive(path, *options):
    return "\n".join([f"```{{literalinclude}} {path}", ":language: python", *options, "```"]) + "\n"


def test_a_listing_of_an_answer_becomes_a_note_naming_its_exercise():
    softmax = directive("/src/mha/numpy/attention.py", ":pyobject: softmax")
    unrelated = directive("/src/mha/experiments/tasks.py", ":pyobject: add_positions")
    cells = make_handout.student_cells(made_up_chapter(softmax, unrelated), chapter=2)
    assert "literalinclude" not in cells[0].source and cells[0].source.startswith("Some text.")
    assert cells[0].source.endswith("More text.")
    assert "`softmax`" in cells[0].source and "{ref}`ex-ch1-softmax-logsumexp` (chapter 1)" in cells[0].source
    assert "instructor's edition" in cells[0].source
    assert unrelated.strip() in cells[1].source  # kept as it was


def test_a_listing_of_lines_is_hidden_when_they_hold_an_answers_body():
    attention = (ROOT / "src/mha/numpy/attention.py").read_text().splitlines()
    first = next(i for i, line in enumerate(attention, 1) if line.startswith("def softmax("))
    whole = directive("/src/mha/numpy/attention.py")
    lines = directive("/src/mha/numpy/attention.py", f":lines: {first}-{first + 12}")
    header = directive("/src/mha/numpy/attention.py", ":lines: 1-3")
    start = directive("/src/mha/numpy/attention.py", ":start-at: def softmax(", ":end-before: def masked_softmax(")
    cells = make_handout.student_cells(made_up_chapter(whole, lines, header, start), chapter=1)
    assert ["literalinclude" in c.source for c in cells] == [False, False, True, False]
    assert "{ref}`ex-ch1-softmax-logsumexp`;" in cells[1].source  # its own chapter: no chapter named
    assert hidden_listings.hidden(listings(nbformat.v4.new_notebook(cells=made_up_chapter(header)))[0]) is None
