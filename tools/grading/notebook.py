"""Grade one submitted notebook against the handout's list of exercises.

Every check that the list expects for the notebook's chapter is decided here, in the
grader's process, never by what the notebook printed and never in the process that
runs the student's code:

1. the chapter is the one whose exercise labels the notebook holds (else the one
   its file name names);
2. the student's code runs in a worker (grading/sandbox.py): for each group of
   checks that switch off the same library functions, a fresh worker runs only the
   statements that define the exercises' functions and what they use
   (tools/grading/notebook_slice.py), in a student edition of mha with those functions
   switched off, and nothing else of the library;
3. the grader draws each check's cases (grading/cases.py: the named ones, and random
   ones seeded from the assignment's secret, the student, the check and the code),
   sends each case's inputs to the worker, receives the outputs as plain data, and
   judges them with the same code as the notebook's check (mha.checks.registry):
   type, dtype and shape, the values, the inputs left unchanged, and the peak memory
   where a case bounds it (measured from outside the worker);
4. a check passes when it passes there AND its check cell is the handout's
   (tools/grading/check_cells.py): a check cell printed over, renamed, edited or removed
   counts as failed, and the report says which, and what the check says.
5. each row's `copy` says whether the graded function, or a helper of the learner's that it
   calls, is the library's code or a listing of the chapter (tools/grading/copies.py, in
   this process, from the notebook's cells and the grader's own book/); it never changes
   the points.

If the slice raises an error, or a function is missing or meets a NameError (the
slice may have missed a name), the whole notebook is run in a fresh worker instead.
Limits (grading/sandbox.Limits): seconds per request, seconds per notebook, memory
per worker. At a limit the worker is killed and the notebook's remaining checks fail
with the limit's name.
"""

import hashlib
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tools.grading import cases
from tools.grading.copies import copy_column
from tools.grading.check_cells import tampered_checks
from tools.grading.notebook_slice import code_binding, statements
from tools.grading.sandbox import Limits, LimitReached, Worker
from tools.publishing.handout_manifest import checked_exercises

LABEL = re.compile(r"^:label: (\S+)", re.M)


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
    seed: int | None = None  # what drew the check's random cases (None: the check was not run)
    copy: str = ""  # the library's code or the chapter's listings that the function is (tools/grading/copies.py)


def chapter_of(notebook, path, manifest):
    """The manifest's chapter that a submission is a copy of, or None."""
    labels = {label for cell in notebook.cells if cell.cell_type == "markdown" for label in LABEL.findall(cell.source)}
    chapters = manifest["chapters"]
    best = max(chapters, key=lambda c: len(labels & {e["label"] for e in c["exercises"]}))
    if labels & {e["label"] for e in best["exercises"]}:
        return best
    return next((c for c in chapters if Path(c["notebook"]).stem in Path(path).name), None)


def code_of(notebook):
    """The notebook's code cells, in order."""
    return [c.source for c in notebook.cells if c.cell_type == "code"]


class Session:
    """The workers of one notebook, within its limits: the clock runs from the first worker."""

    def __init__(self, notebook, limits, covered, scratch):
        self.notebook, self.limits, self.covered, self.scratch = notebook, limits, covered, Path(scratch)
        self.started, self.stopped, self.count = None, None, 0  # stopped: the limit reached, if any

    def seconds_left(self):
        if self.started is None:
            self.started = time.monotonic()
        return self.limits.notebook_seconds - (time.monotonic() - self.started)

    def budget(self):
        """(seconds for the next request, what to say if it runs past them)."""
        left = self.seconds_left()
        if left < self.limits.cell_seconds:
            return max(left, 0.0), f"the notebook ran past {self.limits.notebook_seconds:g} s"
        return self.limits.cell_seconds, f"ran past {self.limits.cell_seconds:g} s"

    def worker(self, group, codes):
        """A fresh worker for a group of checks, having run `codes`: (worker, errors of the codes)."""
        self.count += 1
        first = cases.registered(group[0]["check"])
        worker = Worker(self.scratch / f"worker-{self.count}", first.absent(), first.packages,
                        self.limits, self.covered)
        return worker, self.ask(worker, lambda seconds: worker.run(codes, seconds))

    def ask(self, worker, request):
        """request(seconds) to the worker within the limits; LimitReached names the limit."""
        if self.stopped:
            raise LimitReached(self.stopped)
        seconds, said = self.budget()
        if seconds <= 0:
            raise LimitReached(said)
        try:
            return request(seconds)
        except LimitReached as limit:
            self.stopped = said if str(limit).startswith("ran past") else str(limit)
            raise LimitReached(self.stopped) from None


def error_near(function, codes, errors):
    """What the notebook's run says about a missing `function`: the error of a cell that defines it
    (def, assignment or import), else the first error ("" if none)."""
    name = re.escape(function)
    defines = re.compile(rf"^\s*(def\s+{name}\b|{name}\s*=[^=]|(from\s+\S+\s+)?import\s.*\b{name}\b)", re.M)
    said = [m for cell, m in errors if defines.search(codes[cell])] or [m for _, m in errors]
    return f"the notebook's code raised {said[0]}" if said else ""


def groups_of(checks):
    """The checks in groups that can share a worker: the same library switched off, the same packages."""
    groups = {}
    for check in checks:
        known = cases.registered(check["check"])
        groups.setdefault((known.absent(), known.packages), []).append(check)
    return list(groups.values())


def grade_group(session, group, seeds):
    """{check: (status, message)} for a group of checks, each on the student's function in a worker."""
    needed = code_binding(session.notebook.cells, {c["function"] for c in group})
    worker, errors = session.worker(group, [code for _, code in needed])
    try:
        outcomes = {c["check"]: cases.judge(session, worker, c, seeds[c["check"]]) for c in group}
        if errors or any(status == "missing" or "NameError" in message for status, message in outcomes.values()):
            worker.close()
            worker, errors = session.worker(group, code_of(session.notebook))  # the whole notebook
            outcomes = {c["check"]: cases.judge(session, worker, c, seeds[c["check"]]) for c in group}
        codes = code_of(session.notebook)
        return {c["check"]: (status, error_near(c["function"], codes, errors)) if status == "missing"
                else (status, message) for c, (status, message) in zip(group, outcomes.values())}
    finally:
        worker.close()


def run_checks(notebook, checks, seeds, limits, covered):
    """{check: (status, message)}: every check run by the grader on the student's own function."""
    outcomes = {}
    with tempfile.TemporaryDirectory(prefix="mha-grade-") as scratch:
        session = Session(notebook, limits, covered, scratch)
        for group in groups_of(checks):
            if session.stopped:
                outcomes.update({c["check"]: ("failed", session.stopped) for c in group})
                continue
            try:
                outcomes.update(grade_group(session, group, seeds))
            except LimitReached as limit:
                outcomes.update({c["check"]: ("failed", str(limit)) for c in group if c["check"] not in outcomes})
    return outcomes


def seed_of(secret, student, check, notebook):
    """The seed of a check's random cases: the assignment's secret, the student, the check and the
    student's code together (the same submission draws the same cases on every run; a changed one,
    or another student, draws others)."""
    code = "\n".join(code_of(notebook))
    digest = hashlib.sha256("\0".join([secret, student, check, code]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def described(status, message, function, cells):
    """What the report says of the grader's own run of a check."""
    if status == "missing":
        broken = next((n for n, c in enumerate(cells, 1) if c.cell_type == "code"
                       and re.search(rf"\bdef {function}\b", c.source) and statements(c.source) is None), None)
        if broken:
            return f"`{function}` is not defined: cell {broken}, which defines it, has a syntax error"
        return f"`{function}` is not defined in the notebook" + (f": {message}" if message else " (removed or renamed?)")
    if status == "not written":
        return f"`{function}` is not written yet (the stub still raises NotImplementedError)"
    return message


def verdict(status, said, tampering):
    """(passed, the report's message) from the grader's run and what happened to the check cell."""
    if tampering:
        run = "passes" if status == "passed" else "fails"
        return False, f"check cell {tampering}. Counted as failed.\nRun by the grader, the check {run}: {said}"
    return status == "passed", said


def rows_for(student, chapter, notebook, secret, limits, covered):
    """The rows of one student for every expected check of the chapter."""
    exercises = checked_exercises(chapter)
    checks = [c for e in exercises for c in e["checks"]]
    seeds = {c["check"]: seed_of(secret, student, c["check"], notebook) for c in checks}
    outcomes = run_checks(notebook, checks, seeds, limits, covered) if checks else {}
    copied = copy_column(code_of(notebook), [c["function"] for c in checks], chapter["notebook"])
    rows = []
    for exercise in exercises:
        tampering = tampered_checks(notebook.cells, exercise)
        share = exercise["points"] / len(exercise["checks"])
        for check in exercise["checks"]:
            status, message = outcomes[check["check"]]
            said = described(status, message, check["function"], notebook.cells)
            passed, message = verdict(status, said, tampering.get(check["check"]))
            rows.append(Row(student, exercise["label"], check["check"], passed, message,
                            share if passed else 0, share, Path(chapter["notebook"]).stem, seeds[check["check"]],
                            copied[check["function"]]))
    return rows


def grade_notebook(path, student, manifest, secret, limits=Limits(), covered=()):
    """The rows of grades.csv for one submitted notebook. `secret` seeds the random cases; `covered`:
    the folders that the worker must not see (the project, the submissions, the grades)."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as error:  # not a notebook at all
        return [Row(student, "", "", False, f"cannot read {path}: {error}", 0, 0, "")]
    chapter = chapter_of(notebook, path, manifest)
    if chapter is None:
        return [Row(student, "", "", False, f"{path} is no chapter of the handout's list of exercises", 0, 0, "")]
    return rows_for(student, chapter, notebook, secret, limits, covered)
