"""Exercises and the instructors' handout.

Every chapter has exercises of the three kinds with worked solutions; the
handout made by tools/make_handout.py holds no line of any solution, its
notebooks stop at the first stub, and the key's code passes every check.
"""

import contextlib
import io
import re
import sys
from html.parser import HTMLParser

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from conftest import CHAPTERS, ROOT

sys.path.insert(0, str(ROOT / "tools"))
import make_handout  # noqa: E402

EXERCISE = re.compile(r"^:{3,}\{exercise\}[^\n]*\n:label: (\S+)\n\n\*(\w+) · (★+☆*) ·", re.M)
KINDS = {"Implement", "Predict", "Experiment"}


def exercises(path):
    """(label, kind, difficulty) of each exercise in a chapter."""
    notebook = nbformat.read(path, as_version=4)
    found = []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            found += EXERCISE.findall(cell.source)
    return found


def code_solutions(path):
    """[(label, solution code, check code)] for the code exercises of a chapter."""
    cells = nbformat.read(path, as_version=4).cells
    found = []
    for i, cell in enumerate(cells):
        start = cell.cell_type == "markdown" and re.match(r":{3,}\{solution-start\} (\S+)", cell.source)
        if start:
            end = next(j for j in range(i, len(cells)) if "{solution-end}" in cells[j].source)
            code = "\n\n".join(c.source for c in cells[i + 1: end] if c.cell_type == "code")
            check = cells[end + 1].source if end + 1 < len(cells) else ""
            found.append((start.group(1), code, check))
    return found


def solution_lines(path):
    """What must not leak from a chapter's solutions: every line of solution code
    (stub lines and imports excepted) and every sentence of the prose solutions."""
    cells = nbformat.read(path, as_version=4).cells
    pieces = []
    for _, code, _ in code_solutions(path):
        stub = set(make_handout.stub_for(code).splitlines())
        pieces += [line for line in code.splitlines()
                   if line not in stub and not re.match(r"\s*(import|from) \S+", line)]
    for body in prose_solutions(cells):
        pieces += [sentence for sentence in re.split(r"(?<=[.!?])\s+", body) if len(sentence) >= 30]
    return [normal(piece) for piece in pieces if len(normal(piece)) >= 12]


def prose_solutions(cells):
    """The explanations of the solutions: Markdown cells between a {solution-start} and
    its {solution-end}, and the bodies of {solution} directive blocks."""
    bodies, inside = [], False
    for cell in cells:
        if cell.cell_type != "markdown":
            continue
        if re.match(r":{3,}\{solution-(start|end)\}", cell.source):
            inside = "{solution-start}" in cell.source
        elif inside:
            bodies.append(cell.source)
        else:
            bodies += [" ".join(line for line in block.group(0).splitlines()[1:-1] if not line.startswith(":"))
                       for block in make_handout.SOLUTION_BLOCK.finditer(cell.source)]
    return bodies


def normal(text):
    return re.sub(r"\s+", " ", text).strip()


class VisibleText(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    return make_handout.make_handout(tmp_path_factory.mktemp("handout") / "out")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapter_has_four_exercises_of_the_three_kinds(chapter):
    found = exercises(chapter)
    assert len(found) >= 4, f"{chapter.name}: {len(found)} exercises"
    assert {kind for _, kind, _ in found} == KINDS, f"{chapter.name}: kinds {found}"
    assert len(code_solutions(chapter)) >= 1
    assert solution_lines(chapter), f"{chapter.name}: no solution text found"
    cells = nbformat.read(chapter, as_version=4).cells
    explained = len(prose_solutions(cells))
    assert explained >= sum(kind != "Implement" for _, kind, _ in found), \
        f"{chapter.name}: a Predict or Experiment exercise without a written explanation"


def test_instructor_page_lists_every_exercise():
    page = (ROOT / "book" / "instructors.md").read_text()
    for chapter in CHAPTERS:
        for label, _, _ in exercises(chapter):
            assert label in page, f"{label} missing from the instructors' page"


def test_no_solution_line_survives_in_the_student_notebooks_or_website(handout):
    notebooks = " ".join(normal(p.read_text()) for p in (handout / "student" / "book").glob("*.ipynb"))
    notebook_text = normal(" ".join(
        normal(c.source) for p in (handout / "student" / "book").glob("*.ipynb")
        for c in nbformat.read(p, as_version=4).cells))
    website = []
    for page in (handout / "html").rglob("*.html"):
        parser = VisibleText()
        parser.feed(page.read_text())
        website.append(normal("".join(parser.parts)))
    website = " ".join(website)
    for chapter in CHAPTERS:
        for line in solution_lines(chapter):
            assert line not in notebook_text and line not in notebooks, f"{chapter.name}: {line!r} leaked"
            assert line not in website, f"{chapter.name}: {line!r} leaked into the student website"
    assert "solution" not in " ".join(p.read_text() for p in (handout / "html").rglob("book/*.html")).split(
        'class="solution')[1:2], "a solution admonition in the student website"


def test_public_book_keeps_its_solutions():
    for chapter in CHAPTERS:
        text = " ".join(c.source for c in nbformat.read(chapter, as_version=4).cells)
        assert text.count("{solution") >= len(exercises(chapter))
        assert ":class: dropdown" in text


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_student_notebook_stops_at_the_first_stub(handout, chapter):
    student = handout / "student" / "book" / chapter.name
    notebook = nbformat.read(student, as_version=4)
    stubs = [i for i, c in enumerate(notebook.cells) if "exercise-stub" in c.metadata.get("tags", [])]
    assert stubs, f"{chapter.name}: no stub in the student notebook"
    for i in stubs:
        assert "raise NotImplementedError" in notebook.cells[i].source
        assert notebook.cells[i].source.lstrip().startswith("def "), "a stub is a function to fill in"
        assert "check_" in notebook.cells[i + 1].source, "a stub must be followed by its check"
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(student.parent)}})
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert info.value.ename == "NotImplementedError"
    ran = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and c.execution_count]
    assert max(ran) == stubs[0] + 1, "execution must stop at the check right after the first stub"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_key_code_passes_its_check(chapter):
    setup = next(c.source for c in nbformat.read(chapter, as_version=4).cells
                 if c.cell_type == "code" and "google.colab" not in c.source)  # the imports cell
    for label, code, check in code_solutions(chapter):
        if not make_handout.stub_for(code):
            continue  # a predict-then-run solution: nbval runs it with the chapter
        assert "check_" in check, f"{label}: the cell after the solution must run its check"
        namespace = {}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(setup, namespace)
            exec(code, namespace)
            exec(check, namespace)
        assert "passed" in printed.getvalue(), f"{label}: check did not report success"


def test_grading_reports_stubs_then_a_filled_exercise_as_passed(handout, tmp_path):
    import grade

    chapter = CHAPTERS[2]  # a quick chapter
    student = nbformat.read(handout / "student" / "book" / chapter.name, as_version=4)
    results = grade.grade(handout / "student" / "book" / chapter.name)
    assert results and all(status == "not written" for _, status, _ in results), results
    label, code, _ = next(s for s in code_solutions(chapter) if make_handout.stub_for(s[1]))
    first_stub = next(c for c in student.cells if "exercise-stub" in c.metadata.get("tags", []))
    first_stub.source = code  # the student writes the key's answer
    filled = tmp_path / chapter.name
    nbformat.write(student, filled)
    results = grade.grade(filled)
    assert results[0][1] == "passed", results
    assert all(status == "not written" for _, status, _ in results[1:]), results
    assert grade.main([str(filled)]) == 1
