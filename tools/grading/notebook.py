"""Grade one submitted notebook against the handout's list of exercises.

Every check that the list expects for the notebook's chapter is decided by the
grader, never by what the notebook printed:

1. the chapter is the one whose exercise labels the notebook holds (else the one
   its file name names);
2. in a fresh kernel, the grader runs only the statements that define the
   exercises' functions and what they use (tools/notebook_slice.py), then each
   expected check itself, imported afresh from `mha.checks`, on the student's
   function (the stub's name), and keeps the check's whole message;
3. a check passes when it passes there AND its check cell is the handout's
   (tools/check_cells.py): a check cell printed over, renamed, edited or
   removed counts as failed, and the report says which, and what the check says.

If the slice raises an error, or a check meets a NameError (the slice may have
missed a name), the whole notebook is run instead. Each cell has a time limit;
a check that runs past it is interrupted and fails. The grader runs the
students' code in its kernel: code written to attack that process (rather than
the check cells) is beyond what it can rule out.
"""

import json
import re
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from check_cells import tampered_checks
from handout_manifest import checked_exercises
from notebook_slice import code_binding, statements

LABEL = re.compile(r"^:label: (\S+)", re.M)
RUN_CHECK = '''\
def _grade_with_a_fresh_check(check_name, function_name, marker):
    import contextlib, importlib, io, json, sys
    for module in [m for m in sys.modules if m == "mha" or m.startswith("mha.")]:
        del sys.modules[module]  # the check, its cases and mha.numpy as shipped, whatever the notebook did
    printed = io.StringIO()
    try:
        checks = importlib.import_module("mha.checks")
        outcome = ["missing", ""]
        if function_name in globals():
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                getattr(checks, check_name)(globals()[function_name])
            outcome = ["passed", (printed.getvalue().strip().splitlines() or ["passed"])[-1]]
    except NotImplementedError as error:
        outcome = ["not written", str(error)]
    except BaseException as error:
        failed = type(error).__name__ == "CheckFailed"
        outcome = ["failed", str(error) if failed else f"{type(error).__name__}: {error}"]
    print(marker + json.dumps(outcome))
'''


@dataclass
class Row:
    """One line of grades.csv: one expected check of one student's notebook."""
    student: str
    exercise: str
    check: str
    passed: bool
    message: str
    points: float
    max_points: float
    chapter: str


def chapter_of(notebook, path, manifest):
    """The manifest's chapter that a submission is a copy of, or None."""
    labels = {label for cell in notebook.cells if cell.cell_type == "markdown" for label in LABEL.findall(cell.source)}
    chapters = manifest["chapters"]
    best = max(chapters, key=lambda c: len(labels & {e["label"] for e in c["exercises"]}))
    if labels & {e["label"] for e in best["exercises"]}:
        return best
    return next((c for c in chapters if Path(c["notebook"]).stem in Path(path).name), None)


def kernel_run(codes, checks, folder, timeout):
    """Run `codes`, then each check in the same kernel: ({check: (status, message)}, errors of the codes)."""
    marker = f"grade-{secrets.token_hex(8)}:"
    runs = [f"{RUN_CHECK}\n_grade_with_a_fresh_check({c['check']!r}, {c['function']!r}, {marker!r})" for c in checks]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in codes + runs])
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(folder)}})
    try:
        client.execute(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except DeadKernelError:
        pass  # the checks that did not finish are sorted out below
    errors = [o for c in notebook.cells[:len(codes)] for o in c.get("outputs", []) if o.output_type == "error"]
    cells = dict(zip((c["check"] for c in checks), notebook.cells[len(codes):]))
    outcomes = {check: outcome_of(cell, marker) for check, cell in cells.items()}
    unfinished = [c for c in checks if outcomes[c["check"]] is None]
    if unfinished:
        outcomes.update(after_a_death(codes, unfinished, cells, folder, timeout))
    return outcomes, errors


def after_a_death(codes, unfinished, cells, folder, timeout):
    """Outcomes of the checks that did not finish because the kernel died. If a check had
    started, it killed the kernel: it fails, and the checks after it run in a new kernel."""
    if cells[unfinished[0]["check"]].get("execution_count") is None:
        return {c["check"]: ("failed", "the kernel died while running the notebook's code") for c in unfinished}
    killer, rest = unfinished[0], unfinished[1:]
    outcomes = kernel_run(codes, rest, folder, timeout)[0] if rest else {}
    return {killer["check"]: ("failed", "the kernel died during the check: the function ended the process"),
            **outcomes}


def outcome_of(cell, marker):
    """(status, message) that the grader's check cell printed last behind `marker`, or None."""
    lines = [line for output in cell.get("outputs", []) for line in output.get("text", "").splitlines()]
    said = [line[len(marker):] for line in lines if line.startswith(marker)]
    return tuple(json.loads(said[-1])) if said else None


def run_checks(notebook, checks, folder, timeout):
    """{check: (status, message)}: every check run by the grader on the student's own function.

    First on the slice of the notebook that defines the functions; again on the whole
    notebook when the slice raised an error or a check met a NameError (the slice may
    have missed something that the whole notebook would have run)."""
    needed = code_binding(notebook.cells, {c["function"] for c in checks})
    outcomes, errors = kernel_run([code for _, code in needed], checks, folder, timeout)
    if errors or any("NameError" in message for _, message in outcomes.values()):
        whole = [c.source for c in notebook.cells if c.cell_type == "code"]
        outcomes, _ = kernel_run(whole, checks, folder, timeout)
    return outcomes


def described(status, message, function, cells, timeout):
    """What the report says of the grader's own run of a check."""
    if status == "missing":
        broken = next((n for n, c in enumerate(cells, 1) if c.cell_type == "code"
                       and re.search(rf"\bdef {function}\b", c.source) and statements(c.source) is None), None)
        return (f"`{function}` is not defined: cell {broken}, which defines it, has a syntax error" if broken
                else f"`{function}` is not defined in the notebook (removed or renamed?)")
    if status == "not written":
        return f"`{function}` is not written yet (the stub still raises NotImplementedError)"
    return message.replace("KeyboardInterrupt: ", f"stopped at the time limit of {timeout} s per cell")


def verdict(status, said, tampering):
    """(passed, the report's message) from the grader's run and what happened to the check cell."""
    if tampering:
        run = "passes" if status == "passed" else "fails"
        return False, f"check cell {tampering}. Counted as failed.\nRun by the grader, the check {run}: {said}"
    return status == "passed", said


def rows_for(student, chapter, notebook, folder, timeout):
    """The rows of one student for every expected check of the chapter."""
    exercises = checked_exercises(chapter)
    checks = [c for e in exercises for c in e["checks"]]
    outcomes = run_checks(notebook, checks, folder, timeout) if checks else {}
    rows = []
    for exercise in exercises:
        tampering = tampered_checks(notebook.cells, exercise)
        share = exercise["points"] / len(exercise["checks"])
        for check in exercise["checks"]:
            status, message = outcomes[check["check"]]
            said = described(status, message, check["function"], notebook.cells, timeout)
            passed, message = verdict(status, said, tampering.get(check["check"]))
            rows.append(Row(student, exercise["label"], check["check"], passed, message,
                            share if passed else 0, share, Path(chapter["notebook"]).stem))
    return rows


def grade_notebook(path, student, manifest, timeout=60):
    """The rows of grades.csv for one submitted notebook."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as error:  # not a notebook at all
        return [Row(student, "", "", False, f"cannot read {path}: {error}", 0, 0, "")]
    chapter = chapter_of(notebook, path, manifest)
    if chapter is None:
        return [Row(student, "", "", False, f"{path} is no chapter of the handout's list of exercises", 0, 0, "")]
    return rows_for(student, chapter, notebook, Path(path).resolve().parent, timeout)
