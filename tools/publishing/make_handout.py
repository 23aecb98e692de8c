"""Make the instructors' handout from the book's own sources.

    make handout            # or: .venv/bin/python -m tools.publishing.make_handout [OUTPUT_DIR] [--no-html]

Writes, under OUTPUT_DIR (default `_handout/`):
  student/   the students' copy of the course: the book with every solution
             removed (code exercises become a stub: signature, docstring,
             `raise NotImplementedError`, followed by their check; exercise
             outputs are cleared; a listing of the library's answer to an
             exercise, or of its routes, becomes a note saying where the
             learner writes it: tools/publishing/hidden_listings.py), the
             library, and `exercises.json`, the list of exercises that
             tools/grading/grade.py grades against
             (tools/publishing/handout_manifest.py);
  key/       the answer key: the chapter notebooks with their worked solutions;
  html/      the student book built as a website: no solution, no repository
             button, launch buttons only to the student repository named in
             handout.yml (tools/publishing/student_copy.py).

How a chapter marks its exercises (see the instructors' page of the book):
  - an `{exercise}` directive (colon fence) states the task;
  - a solution sits between a `{solution-start}` and a `{solution-end}` Markdown
    cell: its code cells, then the Markdown cells that explain it, all in one
    dropdown; each function defined there becomes a stub;
  - a solution without code may instead be a `{solution}` directive block.

What it deletes: OUTPUT_DIR is deleted and written again only when it is new, empty, or
made by an earlier run, which left the marker file `.mha-handout` in it (tools/publishing/output_folder.py).
Any other folder, and any path inside the course repository but `_handout/`, is refused
(exit 1, the folder named, nothing deleted): `make_handout.py book` deletes nothing.
"""

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


from tools.publishing.handout_manifest import build_manifest, write_manifest
from tools.publishing.hidden_listings import students_markdown
from tools.publishing.output_folder import FolderRefused, claim
from tools.publishing.student_copy import set_install_cell, student_repository, write_student_copy

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "_handout"
MARKER = ".mha-handout"
EARLIER_HANDOUT = ("student", "key", "html", "nbgrader")  # what _handout/ held before markers
SOLUTION_BLOCK = re.compile(r"^(:{3,})\{solution\}.*?^\1[ \t]*$\n?", re.M | re.S)
FROM_SETTINGS = "from handout.yml"


def is_marker(cell, name):
    return cell.cell_type == "markdown" and re.search(r"^:{3,}\{" + name + r"\}", cell.source, re.M)


def stub_for(code):
    """Stubs for the functions defined in a solution: signature, docstring, raise."""
    tree = ast.parse(code)
    lines = code.splitlines()
    stubs = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        first_body = node.body[0]
        has_doc = isinstance(first_body, ast.Expr) and isinstance(getattr(first_body, "value", None), ast.Constant) \
            and isinstance(first_body.value.value, str)
        end = first_body.end_lineno if has_doc else node.body[0].lineno - 1
        header = lines[node.lineno - 1 - len(node.decorator_list): end]
        indent = " " * (node.col_offset + 4)
        message = f"write {node.name}, then run the check below"
        stubs.append("\n".join(header + [f"{indent}raise NotImplementedError({message!r})"]))
    return "\n\n\n".join(stubs)


def student_cells(cells, chapter=None):
    """The cells of a student notebook: solutions out, stubs in, exercise outputs cleared, and the listings
    that show an exercise's answer replaced by a note (tools/publishing/hidden_listings.py). `chapter`: the
    notebook's chapter number, or None."""
    import nbformat  # here, not above: `--help` is answered without it
    out, in_solution, solution_code, seen_exercise = [], False, [], False
    for cell in cells:
        if is_marker(cell, "solution-start"):
            in_solution, solution_code = True, []
            continue
        if is_marker(cell, "solution-end"):
            in_solution = False
            stub = stub_for("\n\n".join(solution_code))
            if stub:
                out.append(nbformat.v4.new_code_cell(stub, metadata={"tags": ["exercise-stub"]}))
            continue
        if in_solution:
            if cell.cell_type == "code":
                solution_code.append(cell.source)
            continue
        cell = cell.copy()
        if cell.cell_type == "markdown":
            seen_exercise = seen_exercise or is_marker(cell, "exercise")
            cell.source = students_markdown(SOLUTION_BLOCK.sub("", cell.source), chapter).strip()
            if not cell.source:
                continue
        elif seen_exercise:
            cell.outputs, cell.execution_count = [], None
        out.append(cell)
    if in_solution:
        raise ValueError("a {solution-start} without its {solution-end}")
    return out


def student_notebook(path):
    import nbformat  # here, not above: `--help` is answered without it
    notebook = nbformat.read(path, as_version=4)
    number = re.match(r"(\d+)_", Path(path).name)
    notebook.cells = student_cells(notebook.cells, int(number.group(1)) if number else None)
    nbformat.validate(notebook)
    return notebook


def make_handout(output, build_html=True, repository=FROM_SETTINGS):
    """Write the handout into `output`. `repository`: the student repository, (url, branch) or None;
    by default the one handout.yml names. FolderRefused (nothing deleted) when `output` is not the
    handout's to write (see the module's docstring)."""
    import nbformat  # here, not above: `--help` is answered without it
    repository = student_repository() if repository == FROM_SETTINGS else repository
    output = claim(output, MARKER, "tools/publishing/make_handout.py", default=DEFAULT, known=EARLIER_HANDOUT)
    student, key = output / "student", output / "key"
    student.mkdir(parents=True)
    key.mkdir()
    write_student_copy(student, repository)
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        notebook = set_install_cell(student_notebook(path), student, repository)
        nbformat.write(notebook, student / "book" / path.name)
        shutil.copy(path, key / path.name)
    write_manifest(build_manifest(chapters, ROOT), student / "exercises.json")
    if build_html:
        build(student, output / "html")
    return output


def build(source, html):
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    mathjax = ROOT / ".cache" / "mathjax" / "node_modules" / "mathjax" / "es5"  # what `make browser` installs
    env = {"MHA_MATHJAX_DIR": str(mathjax), **os.environ}  # the offline site serves MathJax from there
    result = subprocess.run([str(jupyter_book), "build", str(source), "-W", "-n", "--keep-going"],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"the student book did not build:\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}")
    shutil.move(str(source / "_build" / "html"), html)
    shutil.rmtree(source / "_build")


def arguments(argv):
    parser = argparse.ArgumentParser(description="Make the instructors' handout: student notebooks without "
                                     "solutions, the answer key, the student website.")
    parser.add_argument("output", nargs="?", type=Path, default=DEFAULT,
                        help=f"a new or empty folder, or one an earlier run made (it holds {MARKER}); inside "
                        "the repository only _handout (the default)")
    parser.add_argument("--no-html", action="store_true", help="skip the student website (faster)")
    return parser.parse_args(argv)


def main(argv):
    args = arguments(argv)
    try:
        target = make_handout(args.output, build_html=not args.no_html)
    except FolderRefused as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    lines = [f"student notebooks: {target / 'student' / 'book'}",
             f"exercises:         {target / 'student' / 'exercises.json'}",
             f"answer key:        {target / 'key'}"]
    print("\n".join(lines + ([] if args.no_html else [f"student website:   {target / 'html' / 'index.html'}"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
