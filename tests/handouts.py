"""The book's solutions as the tests read them, and the instructors' handout built once per test run.

`code_solutions`, `solution_lines`: what a chapter's solutions hold (the key's code; what must not leak).
`shared_handout(tmp_path_factory, html=...)`: the handout as `make handout` writes it when handout.yml
names no student repository, built once however many test files and pytest-xdist workers ask for it
(tests/test_handout.py, test_grading.py, test_gradescope.py, test_grading_attacks.py,
test_grading_agreement.py, test_grading_copies.py). Tests read it and never write into it: a test that changes a file works
on a copy of it (`student_notebook` returns a notebook in memory).
"""

import fcntl
import os
import re
import tempfile
from pathlib import Path

import nbformat

from leaks import normal
from tools.publishing import make_handout

# grade.py's limits in the grading tests (tests/test_grading_attacks.py, test_grading_agreement.py), shorter than
# its defaults: a hang or a memory hog is stopped soon, and every right answer, the book's keys included, passes
SHORT_LIMITS = ("--timeout", "20", "--notebook-timeout", "60", "--memory", "1")


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


def key_codes(chapter):
    """The key's code of each stub of a chapter, in the order of the stubs (predict-then-run solutions left out)."""
    return [code for _, code, _ in code_solutions(chapter) if make_handout.stub_for(code)]


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


# Notebooks of the handout, in memory ---------------------------------------------------------------------

def student_notebook(handout, chapter):
    """The handout's student notebook of `chapter` (a path or a file name), read into memory."""
    return nbformat.read(Path(handout) / "student" / "book" / Path(chapter).name, as_version=4)


def with_key_code(notebook, chapter):
    """`notebook` (a student notebook of `chapter`) with the key's code in every stub: the book's own answers."""
    stubs = [c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])]
    for stub, code in zip(stubs, key_codes(chapter), strict=True):
        stub.source = code
    return notebook


# The handout, built once per test run ------------------------------------------------------------------

def shared_handout(tmp_path_factory, html=False):
    """The handout folder (student/, key/, and html/ when `html`) that every test file of this run shares.

    Under pytest-xdist the workers of one run share a folder named by the run's id, as
    conftest.built_site does for the book; in a run without workers, a folder of the session's
    temporary directory. Read it only."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    folder = Path(tempfile.gettempdir()) / f"mha-handout-{run}" if run else \
        tmp_path_factory.getbasetemp() / "shared-handout"
    return build_handout_once(folder, html)


def build_handout_once(folder, html=False):
    """`make_handout(folder / "handout", repository=None)` unless a process of this run already did; the handout.

    In two stages, so that the grading tests never wait on the website: the notebooks and the list
    of exercises (what `build_html=False` writes), then, for the first caller that asks, the
    website, built from the student copy as make_handout itself builds it."""
    handout = folder / "handout"
    once(folder, "notebooks", lambda: make_handout.make_handout(handout, build_html=False, repository=None))
    if html:
        once(folder, "html", lambda: make_handout.build(handout / "student", handout / "html"))
    return handout


def once(folder, stage, build):
    """Run `build()` unless a process of this run already ran it; a failure is recorded and raised in every caller.

    The processes take turns through a lock; `STAGE.done` is written only after a build that
    completed, so a caller that finds it reads a finished handout without taking the lock."""
    folder.mkdir(parents=True, exist_ok=True)
    done, failed = folder / f"{stage}.done", folder / f"{stage}.failed"
    if not done.exists():
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists() and not failed.exists():
                try:
                    build()
                except (Exception, SystemExit) as error:  # make_handout.build exits when the book does not build
                    failed.write_text(f"{type(error).__name__}: {error}")
                else:
                    done.touch()
    if failed.exists():
        raise RuntimeError(f"the shared handout was not built ({stage}): {failed.read_text()}")
