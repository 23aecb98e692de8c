"""Write the chapters' exercises as nbgrader assignments (the "source" version).

    make handout            # or: .venv/bin/python -m tools.publishing.nbgrader_source [OUTPUT_DIR]

Writes OUTPUT_DIR/nbgrader/ (default `_handout/nbgrader/`), an nbgrader course
directory: `nbgrader_config.py` and `source/chapterNN/NN_name.ipynb`, one
assignment per chapter. In each notebook, as nbgrader cell metadata (schema 3):

  - each Implement exercise's solution is a solution cell: the signature and
    docstring stay, the body sits between `### BEGIN SOLUTION` and
    `### END SOLUTION` (nbgrader puts `raise NotImplementedError()` there);
  - its check cell becomes one locked autograded test cell per check, which
    share the exercise's points (the handout's rule, tools/publishing/handout_manifest.py:
    its stars, ★★☆ = 2, unless the exercise's metadata sets "points");
  - an exercise without checks (Predict, Experiment) gets a manually graded
    Markdown answer cell, worth its points, holding the worked solution's text
    (released as "YOUR ANSWER HERE"), and its solution's code becomes a
    solution cell (released as a stub that raises);
  - the explanations that follow a checked solution are left out: nbgrader
    has no ungraded Markdown solution cell, and they answer no question;
  - the exercise statements are locked; the chapter's own cells stay editable;
  - a listing of an exercise's answer (or of its routes) becomes a note, as in
    the handout's student notebooks (tools/publishing/hidden_listings.py).

What it deletes: OUTPUT_DIR/nbgrader/source/, and only when OUTPUT_DIR/nbgrader/ is new,
empty, or made by an earlier run (it holds the marker `.mha-nbgrader`); any other folder,
and any path inside the course repository but `_handout/nbgrader/`, is refused, nothing
deleted (tools/publishing/output_folder.py). What else nbgrader keeps there (its gradebook, release/,
submitted/) stays.
"""

import argparse
import ast
import copy
import re
import shutil
import sys
from pathlib import Path


from tools.publishing.handout_manifest import EXERCISE, chapter_exercises
from tools.publishing.hidden_listings import students_markdown
from tools.publishing.make_handout import ROOT, SOLUTION_BLOCK, is_marker, stub_for
from tools.publishing.output_folder import FolderRefused, claim

MARKER = ".mha-nbgrader"
EARLIER_COURSE = ("nbgrader_config.py", "source")  # what _handout/nbgrader/ held before markers

SOLUTION_START = re.compile(r"^:{3,}\{solution-start\} (\S+)", re.M)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CONFIG = '''"""nbgrader's settings for the course's assignments (written by tools/publishing/nbgrader_source.py)."""

c = get_config()  # noqa: F821, nbgrader provides it
c.CourseDirectory.course_id = "multi-head-attention"
# Some chapter cells run for longer than nbgrader's default 30 seconds.
c.Execute.timeout = 600
'''


def assignment_name(chapter):
    """`chapter01` for `01_weighted_average.ipynb`."""
    return f"chapter{chapter.name[:2]}"


def nbgrader_metadata(grade_id, *, grade=False, solution=False, locked=False, points=0):
    """nbgrader's cell metadata, schema version 3; points only on graded cells."""
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return meta


def marked(cell, grade_id, **flags):
    """A copy of the cell, without outputs, carrying nbgrader metadata."""
    cell = copy.deepcopy(cell)
    cell.metadata["nbgrader"] = nbgrader_metadata(grade_id, **flags)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def pieces(cells):
    """The chapter as (label, cells) pairs: a solution block's label and its cells,
    or (None, [cell]) for a cell outside every solution."""
    label, block = None, []
    for cell in cells:
        if is_marker(cell, "solution-start"):
            label, block = SOLUTION_START.search(cell.source).group(1), []
        elif is_marker(cell, "solution-end"):
            yield label, block
            label = None
        elif label:
            block.append(cell)
        else:
            yield None, [cell]
    if label:
        raise ValueError(f"{label}: a {{solution-start}} without its {{solution-end}}")


def with_solution_regions(code):
    """The code with the body of each function between nbgrader's solution
    delimiters; signatures and docstrings stay, as in the handout's stubs."""
    lines = code.splitlines()
    out, shown = [], 0
    for node in ast.parse(code).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue  # kept as written, like the lines between the functions
        if not isinstance(node, ast.FunctionDef):
            raise ValueError(f"an Implement solution may hold only functions and imports:\n{code}")
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        out += lines[shown:first - 1]
        function = lines[first - 1:node.end_lineno]
        header = stub_for("\n".join(function)).splitlines()[:-1]  # the handout's stub without its raise
        indent = " " * 4
        out += header + [indent + BEGIN] + function[len(header):] + [indent + END]
        shown = node.end_lineno
    return "\n".join(out + lines[shown:])


def solution_cells(exercise, block):
    """nbgrader cells for one exercise's solution block."""
    import nbformat  # here, not above: `--help` is answered without it
    label = exercise["label"]
    code = [cell for cell in block if cell.cell_type == "code"]
    prose = [cell.source for cell in block if cell.cell_type == "markdown"]
    cells = []
    for number, cell in enumerate(code, start=1):
        cell = marked(cell, f"{label}-solution" + (f"-{number}" if number > 1 else ""), solution=True)
        if exercise["kind"] == "Implement" and stub_for(cell.source):
            cell.source = with_solution_regions(cell.source)
        cells.append(cell)
    if prose and not exercise["checks"]:
        answer = nbformat.v4.new_markdown_cell("\n\n".join(prose))
        cells.append(marked(answer, f"{label}-answer", grade=True, solution=True, points=exercise["points"]))
    return cells


def autograder_tests(exercise, cell):
    """The check cell after a solution, as one locked autograded test cell per check."""
    import nbformat  # here, not above: `--help` is answered without it
    if cell.cell_type != "code" or cell.source != exercise["check_cell"]:
        raise ValueError(f"{exercise['label']}: the cell after the solution must be its check cell")
    share = exercise["points"] / len(exercise["checks"])
    share = int(share) if share.is_integer() else share
    return [marked(nbformat.v4.new_code_cell(f"from mha.checks import {c['check']}\n{c['check']}({c['function']})"),
                   f"{exercise['label']}-{c['check']}", grade=True, locked=True, points=share)
            for c in exercise["checks"]]


def chapter_cell(cell, chapter=None):
    """A cell outside the solutions: exercise statements locked, the others as
    they are; {solution} directive blocks removed and the listings of an
    exercise's answer replaced by a note, as in the handout (`chapter`: its number)."""
    if cell.cell_type != "markdown":
        return cell
    statement = EXERCISE.search(cell.source)
    cell = copy.deepcopy(cell)
    cell.source = students_markdown(SOLUTION_BLOCK.sub("", cell.source), chapter).strip()
    if statement:
        return marked(cell, f"{statement.group(1)}-statement", locked=True)
    return cell if cell.source else None


def source_cells(cells, exercises, chapter=None):
    """The cells of a chapter's nbgrader source notebook; `exercises`: {label: manifest entry}; `chapter`: its number."""
    out, checked = [], None
    for label, block in pieces(cells):
        if checked:
            out += autograder_tests(checked, block[0])
            checked = None
        elif label is None:
            out += [cell for cell in [chapter_cell(block[0], chapter)] if cell is not None]
        else:
            out += solution_cells(exercises[label], block)
            checked = exercises[label] if exercises[label]["checks"] else None
    return out


def source_notebook(path):
    """A chapter as an nbgrader source notebook."""
    import nbformat  # here, not above: `--help` is answered without it
    notebook = nbformat.read(path, as_version=4)
    exercises = {exercise["label"]: exercise for exercise in chapter_exercises(path)}
    notebook.cells = source_cells(notebook.cells, exercises, int(Path(path).name[:2]))
    ids = [c.metadata["nbgrader"]["grade_id"] for c in notebook.cells if "nbgrader" in c.metadata]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{path.name}: two cells share an nbgrader grade_id")
    nbformat.validate(notebook)
    return notebook


def write_nbgrader_source(output):
    """Write OUTPUT/nbgrader/: nbgrader_config.py and source/chapterNN/NN_name.ipynb. FolderRefused
    (nothing deleted) when OUTPUT/nbgrader/ is not this tool's to write (see the module's docstring)."""
    import nbformat  # here, not above: `--help` is answered without it
    course = claim(Path(output) / "nbgrader", MARKER, "tools/publishing/nbgrader_source.py",
                   default=ROOT / "_handout" / "nbgrader", known=EARLIER_COURSE, empty=False)
    shutil.rmtree(course / "source", ignore_errors=True)
    (course / "nbgrader_config.py").write_text(CONFIG)
    for chapter in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        folder = course / "source" / assignment_name(chapter)
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(source_notebook(chapter), folder / chapter.name)
    return course


def main(argv):
    parser = argparse.ArgumentParser(description="Write the chapters' exercises as nbgrader assignments, "
                                     "into OUTPUT_DIR/nbgrader/.")
    parser.add_argument("output", nargs="?", type=Path, default=ROOT / "_handout", metavar="OUTPUT_DIR",
                        help=f"where nbgrader/ goes (default: _handout); nbgrader/ must be new, empty or hold "
                        f"{MARKER}")
    args = parser.parse_args(argv)
    try:
        target = write_nbgrader_source(args.output)
    except FolderRefused as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"nbgrader course:   {target} (see 'Using nbgrader' in book/instructors.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
