"""The handout's list of exercises: what tools/grade.py expects of every submission.

tools/make_handout.py writes it to `_handout/student/exercises.json`, from the
exercise directives of the chapters. Each exercise opens with

    :::{exercise} Title
    :label: ex-ch5-split-merge

    *Implement · ★☆☆ · checked by `check_split_heads` and `check_merge_heads`*

and an Implement exercise's solution is followed by its check cell, which must
call exactly the checks that line names. `check_NAME` always tests the
learner's function `NAME` (the stub's name).

Points: an exercise is worth its number of stars (★☆☆ = 1, ★★★ = 3), unless its
Markdown cell's metadata sets `"points"` (a number). Its points are shared
equally among its checks. Predict and Experiment exercises are listed with their
points, and no check: they are graded by hand against the key.
"""

import json
import re
from pathlib import Path

import nbformat

EXERCISE = re.compile(r"^:{3,}\{exercise\}[^\n]*\n:label: (\S+)\n\n\*(\w+) · (★+☆*) ·([^*\n]*)\*", re.M)
CHECK_NAME = re.compile(r"`(check_\w+)`")
CHECK_CALL = re.compile(r"^\s*(check_\w+)\(", re.M)
POINTS_RULE = ("an exercise is worth its number of stars unless its Markdown cell's metadata sets "
               "\"points\"; its points are shared equally among its checks")


def exercise_points(cell, difficulty):
    """The points of the exercise stated in `cell`: its `points` metadata, else its stars."""
    points = cell.metadata.get("points", difficulty.count("★"))
    if not isinstance(points, (int, float)) or points < 0:
        raise ValueError(f"the points of an exercise must be a number >= 0, not {points!r}")
    return points


def check_cell_after(cells, label):
    """The source of the code cell right after the solution of exercise `label`."""
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown"
                 and re.match(r":{3,}\{solution-start\} " + re.escape(label) + r"\s", c.source))
    end = next(j for j in range(start, len(cells)) if "{solution-end}" in cells[j].source)
    after = cells[end + 1] if end + 1 < len(cells) else None
    return after.source if after is not None and after.cell_type == "code" else ""


def exercise_entry(cells, cell, match):
    """The manifest's entry for the exercise that `match` found in the Markdown `cell`."""
    label, kind, difficulty, rest = match.groups()
    checks = CHECK_NAME.findall(rest)
    entry = {"label": label, "kind": kind, "difficulty": difficulty,
             "points": exercise_points(cell, difficulty),
             "checks": [{"check": name, "function": name.removeprefix("check_")} for name in checks]}
    if checks:
        entry["check_cell"] = check_cell_after(cells, label)
        called = CHECK_CALL.findall(entry["check_cell"])
        if called != checks:
            raise ValueError(f"{label}: the exercise names {checks}, its check cell calls {called}")
    return entry


def chapter_exercises(path):
    """The manifest's entries for the exercises of one chapter notebook, in order."""
    cells = nbformat.read(path, as_version=4).cells
    return [exercise_entry(cells, cell, match) for cell in cells if cell.cell_type == "markdown"
            for match in EXERCISE.finditer(cell.source)]


def build_manifest(chapters, root):
    """The list of exercises of these chapter notebooks; paths relative to `root`."""
    return {"points": POINTS_RULE,
            "chapters": [{"notebook": Path(path).relative_to(root).as_posix(),
                          "exercises": chapter_exercises(path)} for path in chapters]}


def write_manifest(manifest, path):
    Path(path).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def read_manifest(path):
    """The manifest at `path`, or SystemExit saying how to make one."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"no list of exercises at {path}: run `make handout`, or name one with --manifest")
    return json.loads(path.read_text())


def checked_exercises(chapter):
    """The exercises of a manifest chapter that have automatic checks."""
    return [e for e in chapter["exercises"] if e["checks"]]
