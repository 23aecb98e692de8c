"""Grade student notebooks with the automatic checks.

    .venv/bin/python -m tools.grading.grade submissions/*.ipynb
    .venv/bin/python -m tools.grading.grade --manifest _handout/student/exercises.json --out grades/ submissions/*.ipynb
    .venv/bin/python -m tools.grading.grade --assignment 15 submissions/*.ipynb

The checks expected of each notebook come from the handout's list of exercises
(`_handout/student/exercises.json`, written by `make handout`), never from what
the notebook prints. The grader runs every expected check itself, in its own
process, on the student's function, which runs in a separate, sandboxed worker
that only returns plain data (tools/grading/ says how); a check cell that was
printed over, renamed, edited or removed counts as failed and is named.

--assignment (tools/publishing/handout_manifest.py): what one grade is given for, a chapter (`15`,
`15_heads_across_devices`) or exercises of one chapter by their labels, comma-separated.
Given one, every notebook is graded for it alone: only its checks, and a notebook of
another chapter (or none) gets one failed row per check of the assignment, 0 of its
points, saying which chapter it is, never that chapter's rows. Without it, the
assignment that the manifest records (the exercises.json of a Gradescope zip) is
graded; a manifest that records none grades each notebook against its own chapter.

Limits: --timeout seconds per request to a worker (running the notebook's code,
or one call of a function), --notebook-timeout seconds per notebook, --memory GiB
per worker; at a limit the worker is killed and the notebook's remaining checks
fail, naming the limit. The random cases are seeded from --secret (or the
environment variable MHA_GRADING_SECRET), the student, the check and the code:
the same submission gets the same grade on every run, and the seed is in
grades.json. With --roster, a CSV of totals per student for an LMS is written too
(tools/grading/exports.py says the formats), in the column --lms-column (default: the
assignment's name, else "Multi-head attention"); under an assignment, no student's total
exceeds its maximum.

Prints, per student, every check with every failure in full (hint included),
and writes `grades.csv` and `grades.json` (one row per student and check:
student, exercise, check, passed, message, points, max_points, chapter, seed, copy) into
--out (default: the current folder). `copy` is "" unless the graded function (or a helper
of the learner's that it calls) is the library's code or a listing of the chapter, nearly or
exactly (tools/grading/copies.py says how it compares): a lead for the instructor, shown in the
report, that never changes the points. Points come from the list of exercises
(tools/publishing/handout_manifest.py). Notebooks are graded in parallel (--jobs), with a
progress bar on stderr. Exit code 0 when every check of every notebook passed.
"""

import argparse
import csv
import hashlib
import json
import multiprocessing
import os
import resource
import signal
import sys
import time
from multiprocessing.connection import wait as wait_for
from dataclasses import asdict, fields
from pathlib import Path

from tools.grading.copies import warm_up
from tools.grading.exports import tidy
from tools.grading.notebook import Row, grade_notebook
from tools.grading.sandbox import ISOLATION, Limits
from tools.publishing.handout_manifest import (assignment_checks, assignment_manifest, chapter_stem, find_assignment,
                                               read_manifest)

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "_handout" / "student" / "exercises.json"
FIELDS = [f.name for f in fields(Row)]
GRADER_MEMORY = 3 * 2**30  # the grader's own process for one notebook (the cases, the answers, the replies)
LEAN_KERNELS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def student_names(paths):
    """Each notebook's path from the folder that holds them all, without `.ipynb`."""
    resolved = [Path(p).resolve() for p in paths]
    common = Path(os.path.commonpath([p.parent for p in resolved]))
    return [str(p.relative_to(common).with_suffix("")) for p in resolved]


class Progress:
    """A one-line progress bar on stderr: `grading [#####-----] 15/30  12 s`."""

    def __init__(self, total, width=30):
        self.total, self.width, self.done, self.start = total, width, 0, time.perf_counter()

    def step(self, name):
        self.done += 1
        filled = self.width * self.done // self.total
        seconds = time.perf_counter() - self.start
        line = (f"grading [{'#' * filled}{'-' * (self.width - filled)}] "
                f"{self.done}/{self.total}  {seconds:.0f} s  {name}")
        end = "\n" if self.done == self.total or not sys.stderr.isatty() else ""
        print(f"\r{line:<100.100}", end=end, file=sys.stderr, flush=True)


def fingerprint(paths):
    """A hash of the files under `paths` (the library, the grader, the manifest): what grading trusts."""
    digest = hashlib.sha256()
    for path in map(Path, paths):
        for file in sorted(path.rglob("*") if path.is_dir() else [path]):
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def covered_folders(paths, out, manifest_path):
    """The folders that a worker must not see: the project, the submissions', the grades', the manifest's."""
    folders = {ROOT, Path(out).resolve(), Path(manifest_path).resolve().parent}
    folders |= {Path(p).resolve().parent for p in paths}
    return sorted(f for f in folders if f != Path("/"))


def tampered_rows(rows, student):
    """The rows of a notebook after which the library, the grader or the manifest changed: all failed."""
    said = "the library, the grader or the manifest changed while this notebook was graded: not graded"
    return [Row(r.student, r.exercise, r.check, False, said, 0, r.max_points, r.chapter, r.seed, r.copy)
            for r in rows] or [
        Row(student, "", "", False, said, 0, 0, "")]


def grade_in_own_process(connection, path, name, manifest, secret, limits, covered):
    """The body of one notebook's grading process: its rows sent back, under the grader's memory limit."""
    # the soft limit only: the workers it starts set their own, which may be larger (--memory)
    resource.setrlimit(resource.RLIMIT_DATA, (GRADER_MEMORY, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    os.environ.update(LEAN_KERNELS)  # the workers inherit it: one thread each, as many notebooks as jobs
    try:
        rows = grade_notebook(path, name, manifest, secret, limits, covered)
    except Exception as error:  # noqa: BLE001 - one notebook's failure never stops the others
        rows = [Row(name, "", "", False, f"the grader failed on this notebook: {type(error).__name__}: {error}",
                    0, 0, "")]
    connection.send(rows)
    connection.close()


def rows_of(process, connection, name):
    """The rows that a notebook's process sent, or one failed row saying how the process ended."""
    try:
        rows = connection.recv()
    except (EOFError, OSError):
        rows = None
    connection.close()
    process.join()
    if rows is None:
        code = process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"ended ({code})"
        rows = [Row(name, "", "", False, f"the grader's process for this notebook {how} before it gave its grades "
                    f"(more than {GRADER_MEMORY / 2**30:g} GiB, or a crash): not graded", 0, 0, "")]
    return rows


def grade_all(paths, manifest, jobs, limits, secret, covered, trusted):
    """The rows of every notebook, in the order given, graded `jobs` at a time, each in a process of its own
    under a memory limit: a notebook that breaks its process fails alone. After each notebook the
    fingerprint of `trusted` is taken again: a notebook after which it changed is not graded."""
    names = student_names(paths)
    progress = Progress(len(paths))
    before = fingerprint(trusted)
    context = multiprocessing.get_context("fork")
    results, waiting, running = [None] * len(paths), list(enumerate(paths)), {}
    while waiting or running:
        while waiting and len(running) < jobs:
            i, path = waiting.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=grade_in_own_process,
                                      args=(sender, path, names[i], manifest, secret, limits, covered))
            process.start()
            sender.close()
            running[receiver] = (i, process)
        for receiver in wait_for(list(running)):  # ready: the rows came, or the process ended (end of file)
            i, process = running.pop(receiver)
            results[i] = rows_of(process, receiver, names[i])
            if fingerprint(trusted) != before:
                results[i] = tampered_rows(results[i], names[i])
            progress.step(names[i])
    return [row for rows in results for row in rows]


def assignment_secret(given, manifest_path):
    """(secret, warning): --secret, else MHA_GRADING_SECRET, else one derived from the manifest (which
    students have: the report then says so)."""
    secret = given or os.environ.get("MHA_GRADING_SECRET")
    if secret:
        return secret, None
    derived = hashlib.sha256(Path(manifest_path).read_bytes()).hexdigest()
    return derived, ("No --secret (or MHA_GRADING_SECRET) was given: the random cases are seeded from the "
                     "manifest, which students have. Give a secret of your own to make them unguessable.")


def indent(text, spaces):
    return "\n".join(" " * spaces + line for line in text.splitlines())


def summary(rows):
    """The report for the terminal: per student, each check, each failure in full."""
    lines, students = [], dict.fromkeys(r.student for r in rows)
    for student in students:
        mine = [r for r in rows if r.student == student]
        points, most = sum(r.points for r in mine), sum(r.max_points for r in mine)
        lines.append(f"{student} ({mine[0].chapter or 'no chapter'}): {sum(r.passed for r in mine)} of "
                     f"{len(mine)} checks passed, {points:g} of {most:g} points")
        for row in mine:
            lines.append(f"  {'passed' if row.passed else 'FAILED'}  {row.check or '-'}  ({row.exercise or '-'})")
            if not row.passed:
                lines.append(indent(row.message, 10))
            if row.copy:
                lines.append(indent(f"copy: {row.copy} (for you to judge: the points stand)", 10))
    return "\n".join(lines)


def write_grades(rows, folder):
    """grades.csv and grades.json in `folder`; their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = [asdict(r) | {"points": tidy(r.points), "max_points": tidy(r.max_points)} for r in rows]
    with open(folder / "grades.csv", "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({**r, "passed": str(r["passed"]).lower()} for r in table)
    (folder / "grades.json").write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")
    return folder / "grades.csv", folder / "grades.json"


def chosen_assignment(manifest, spec):
    """The assignment to grade: `spec` (--assignment) if given, else the one the manifest records, else None
    (each notebook against its own chapter). ValueError: a spec that names nothing gradable."""
    if spec is not None:
        return find_assignment(manifest, spec)
    return manifest.get("assignment")


def wrong_notebook(path, manifest, assignment):
    """Why the notebook at `path` is not the assignment's (a sentence for the student), or None. A notebook
    that cannot be read is left to the grader, whose row says so."""
    from tools.grading.notebook import chapter_of
    import nbformat
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - the grader's own row says why
        return None
    expected, name = Path(assignment["notebook"]).name, assignment["name"]
    chapter = chapter_of(notebook, path, manifest)
    if chapter is None:
        return (f"{Path(path).name} is no chapter's notebook (none of the exercises is in it): not graded. "
                f"The assignment is {name}: submit {expected}.")
    if chapter["notebook"] != assignment["notebook"]:
        return (f"{Path(path).name} is the notebook of chapter {chapter_stem(chapter)}, not of the assignment "
                f"({name}): not graded. Submit {expected}.")
    return None


def assignment_rows(rows, paths, manifest, assignment):
    """The rows of every notebook for the assignment alone: each notebook's rows of the assignment's checks
    (one each), or, for a notebook of another chapter or one the grader could not grade, one failed row per
    check of the assignment, 0 of its points, saying why."""
    expected = assignment_checks(manifest, assignment)
    wanted = [(label, check) for label, check, _ in expected]
    stem = Path(assignment["notebook"]).stem
    out = []
    for path, name in dict.fromkeys(zip(paths, student_names(paths))):
        mine = {}
        for row in rows:
            if row.student == name and (row.exercise, row.check) in wanted:
                mine.setdefault((row.exercise, row.check), row)
        why = wrong_notebook(path, manifest, assignment)
        if why is None and len(mine) == len(wanted):
            out += [mine[key] for key in wanted]
            continue
        said = why or "; ".join(dict.fromkeys(r.message for r in rows if r.student == name and not r.passed
                                              and (r.exercise, r.check) not in mine)) \
            or "the grader found none of the assignment's checks in this notebook"
        out += [Row(name, label, check, False, said, 0, points, stem) for label, check, points in expected]
    return out


def lms_column(given, assignment):
    """The LMS column of the totals: --lms-column, else the assignment's name, else the course's."""
    return given or (assignment["name"] if assignment else "Multi-head attention")


def arguments(argv):
    parser = argparse.ArgumentParser(description="Grade student notebooks with the automatic checks.")
    parser.add_argument("notebooks", nargs="+", help="the submitted notebooks (.ipynb)")
    parser.add_argument("--manifest", default=MANIFEST, help="the handout's list of exercises "
                        "(default: _handout/student/exercises.json)")
    parser.add_argument("--out", default=".", help="where to write grades.csv and grades.json (default: here)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="notebooks graded at once")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a request to a worker may run: the notebook's code, or one call (default: 60)")
    parser.add_argument("--notebook-timeout", type=float, default=300,
                        help="seconds all of a notebook's checks may run together (default: 300)")
    parser.add_argument("--memory", type=float, default=4, help="GiB of memory per worker (default: 4)")
    parser.add_argument("--secret", help="the assignment's secret, which seeds the random cases "
                        "(default: the environment variable MHA_GRADING_SECRET)")
    parser.add_argument("--assignment", help="grade this assignment alone: a chapter (`15` or "
                        "`15_heads_across_devices`) or exercises of one chapter, their labels comma-separated "
                        "(default: the one the manifest records, if any; else each notebook's own chapter)")
    parser.add_argument("--roster", help="a CSV: student notebook name -> LMS id; writes the totals for an LMS")
    parser.add_argument("--lms-column", help="the LMS column of the totals (default: the assignment's name, "
                        "else \"Multi-head attention\")")
    args = parser.parse_args(argv)
    for name in ("timeout", "notebook_timeout", "memory"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def main(argv):
    args = arguments(argv)
    manifest = read_manifest(args.manifest)
    try:
        assignment = chosen_assignment(manifest, args.assignment)
    except ValueError as error:
        print(f"grade.py: error: {error}", file=sys.stderr)
        return 2
    secret, warning = assignment_secret(args.secret, args.manifest)
    limits = Limits(args.timeout, args.notebook_timeout, int(args.memory * 2**30))
    covered = covered_folders(args.notebooks, args.out, args.manifest)
    trusted = [ROOT / "src" / "mha", ROOT / "tools", Path(args.manifest)]
    graded = assignment_manifest(manifest, assignment) if assignment else manifest
    if len(graded["chapters"]) == 1:  # the notebooks' processes inherit what their copy column compares with
        warm_up(graded["chapters"][0])
    rows = grade_all(args.notebooks, graded, max(1, args.jobs), limits, secret, covered, trusted)
    if assignment:
        rows = assignment_rows(rows, args.notebooks, manifest, assignment)
        print(f"assignment: {assignment['name']}, {assignment['max_points']:g} points ({assignment['notebook']})")
    print(summary(rows))
    csv_path, json_path = write_grades(rows, args.out)
    print(f"\ngrades: {csv_path}, {json_path}")
    if args.roster:
        from tools.grading.exports import write_lms_totals
        try:
            path = write_lms_totals(rows, args.roster, args.out, lms_column(args.lms_column, assignment),
                                    assignment["max_points"] if assignment else None)
            print(f"totals for the LMS: {path}")
        except ValueError as error:  # the roster and the notebooks disagree: the grades are written already
            print(f"no totals for the LMS: {error}", file=sys.stderr)
            return 2
    print(f"isolation of the students' code: {ISOLATION}"
          + ("" if ISOLATION == "bubblewrap" else " (install bubblewrap: the workers could read the library)"))
    if warning:
        print(warning)
    print("Predict and Experiment exercises have no automatic check: grade them by hand against the key.")
    return 0 if rows and all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
