"""Grade student notebooks with the automatic checks.

    .venv/bin/python tools/grade.py submissions/*.ipynb
    .venv/bin/python tools/grade.py --manifest _handout/student/exercises.json --out grades/ submissions/*.ipynb

The checks expected of each notebook come from the handout's list of exercises
(`_handout/student/exercises.json`, written by `make handout`), never from what
the notebook prints. The grader runs every expected check itself on the
student's function; a check cell that was printed over, renamed, edited or
removed counts as failed and is named (tools/grading.py says how).

Prints, per student, every check with every failure in full (hint included),
and writes `grades.csv` and `grades.json` (one row per student and check:
student, exercise, check, passed, message, points, max_points, chapter) into
--out (default: the current folder). Points come from the list of exercises
(tools/handout_manifest.py). Notebooks are graded in parallel (--jobs), with a
progress bar on stderr. Exit code 0 when every check of every notebook passed.
"""

import argparse
import csv
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, fields
from pathlib import Path

from grading.notebook import Row, grade_notebook
from handout_manifest import read_manifest

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "_handout" / "student" / "exercises.json"
FIELDS = [f.name for f in fields(Row)]
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


def grade_all(paths, manifest, jobs, timeout):
    """The rows of every notebook, in the order given, graded `jobs` at a time."""
    names = student_names(paths)
    progress = Progress(len(paths))
    # The kernels inherit the workers' environment: one thread each, as many kernels as jobs.
    with ProcessPoolExecutor(max_workers=jobs, initializer=os.environ.update, initargs=(LEAN_KERNELS,)) as pool:
        futures = {pool.submit(grade_notebook, path, name, manifest, timeout): i
                   for i, (path, name) in enumerate(zip(paths, names))}
        results = [None] * len(paths)
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            progress.step(names[futures[future]])
    return [row for rows in results for row in rows]


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
    return "\n".join(lines)


def tidy(points):
    """3 rather than 3.0, and 0.333 rather than 0.3333333333333333."""
    return int(points) if float(points).is_integer() else round(points, 3)


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


def arguments(argv):
    parser = argparse.ArgumentParser(description="Grade student notebooks with the automatic checks.")
    parser.add_argument("notebooks", nargs="+", help="the submitted notebooks (.ipynb)")
    parser.add_argument("--manifest", default=MANIFEST, help="the handout's list of exercises "
                        "(default: _handout/student/exercises.json)")
    parser.add_argument("--out", default=".", help="where to write grades.csv and grades.json (default: here)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="notebooks graded at once")
    parser.add_argument("--timeout", type=int, default=60, help="seconds a cell may run (default: 60)")
    return parser.parse_args(argv)


def main(argv):
    args = arguments(argv)
    manifest = read_manifest(args.manifest)
    rows = grade_all(args.notebooks, manifest, max(1, args.jobs), args.timeout)
    print(summary(rows))
    csv_path, json_path = write_grades(rows, args.out)
    print(f"\ngrades: {csv_path}, {json_path}\n"
          "Predict and Experiment exercises have no automatic check: grade them by hand against the key.")
    return 0 if rows and all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
