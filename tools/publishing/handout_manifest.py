"""The handout's list of exercises: what tools/grading/grade.py expects of every submission.

tools/publishing/make_handout.py writes it to `_handout/student/exercises.json`, from the
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

Assignments (`find_assignment`): one grade is given for one assignment, which is one
chapter notebook: the whole chapter (`15` or `15_heads_across_devices`), or some of its
exercises, named by their labels, comma-separated (`ex-ch5-split-merge,ex-ch5-multihead`;
labels of several chapters are refused, as an assignment is one notebook). Its maximum is
the points of its exercises that have automatic checks. tools/grading/make_gradescope.py records
the assignment in the exercises.json it ships (key "assignment"), and tools/grading/grade.py then
grades that assignment's checks alone.

    python -m tools.publishing.handout_manifest                    # every chapter, its checks' points
    python -m tools.publishing.handout_manifest --assignment 15    # what an assignment holds, its maximum
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
    import nbformat  # here: `--help` needs none of it
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


# Assignments: what one grade is given for. One assignment is one chapter notebook: the whole
# chapter, or a list of its exercises. Its maximum is the points of its exercises that have
# automatic checks (Predict and Experiment exercises are graded by hand, on top).

def chapter_stem(chapter):
    """`05_fused_heads_and_masks` for the manifest's chapter of book/05_fused_heads_and_masks.ipynb."""
    return Path(chapter["notebook"]).stem


def chapter_named(manifest, name):
    """The manifest's chapter that `name` names (its number, `5` or `05`, its notebook's stem, or its
    notebook's file name or path), or None."""
    name = name.strip()
    for chapter in manifest["chapters"]:
        stem = chapter_stem(chapter)
        number = stem.split("_")[0]
        if name.isdigit() and number.isdigit() and int(name) == int(number):
            return chapter
        if name in (stem, f"{stem}.ipynb", chapter["notebook"]):
            return chapter
    return None


def find_assignment(manifest, spec):
    """The assignment that `spec` names, as a dict that exercises.json can hold:

        {"spec": "15", "name": "15_heads_across_devices", "notebook": "book/15_heads_across_devices.ipynb",
         "exercises": ["ex-ch15-chunk-pairs", ...], "max_points": 4}

    `spec` is a chapter (its number, `15`, or its notebook's stem, `15_heads_across_devices`), or
    exercises of ONE chapter named by their labels, comma-separated (`ex-ch5-split-merge,ex-ch5-multihead`):
    one assignment is one notebook, so labels of several chapters are refused. ValueError says why a
    spec names nothing, or nothing that can be graded automatically."""
    spec = str(spec).strip()
    if not spec:
        raise ValueError("the assignment is empty: name a chapter (`5`, `05_fused_heads_and_masks`) or "
                         "exercises of one chapter by their labels, comma-separated")
    chapter = chapter_named(manifest, spec)
    if chapter is not None:
        labels = [e["label"] for e in chapter["exercises"]]
        name = chapter_stem(chapter)
    else:
        labels = [label.strip() for label in spec.split(",") if label.strip()]
        where = {e["label"]: c for c in manifest["chapters"] for e in c["exercises"]}
        unknown = [label for label in labels if label not in where]
        if unknown:
            chapters = ", ".join(chapter_stem(c) for c in manifest["chapters"])
            raise ValueError(f"the assignment {spec!r} names no chapter and no exercise of the list: unknown "
                             f"{', '.join(map(repr, unknown))}. A chapter is its number or its notebook's stem "
                             f"({chapters}); exercises are their labels, comma-separated")
        if len(set(labels)) != len(labels):
            raise ValueError(f"the assignment {spec!r} names an exercise twice")
        chapters = list(dict.fromkeys(chapter_stem(where[label]) for label in labels))
        if len(chapters) > 1:
            raise ValueError(f"the assignment {spec!r} takes exercises from {len(chapters)} chapters "
                             f"({', '.join(chapters)}): an assignment is one notebook, so its exercises must be "
                             f"of one chapter. Make one assignment per chapter")
        chapter = where[labels[0]]
        labels = [e["label"] for e in chapter["exercises"] if e["label"] in labels]  # the chapter's order
        name = f"{chapter_stem(chapter)}: {', '.join(labels)}"
    chosen = [e for e in chapter["exercises"] if e["label"] in labels]
    maximum = sum(e["points"] for e in chosen if e["checks"])
    if not any(e["checks"] for e in chosen):
        raise ValueError(f"the assignment {spec!r} has no exercise with an automatic check (its exercises are "
                         f"graded by hand): nothing for the grader to do")
    return {"spec": spec, "name": name, "notebook": chapter["notebook"], "exercises": labels,
            "max_points": maximum}


def assignment_of(manifest):
    """The assignment that a manifest records (exercises.json of an autograder), or None."""
    return manifest.get("assignment")


def with_assignment(manifest, assignment):
    """The manifest that records `assignment` (find_assignment's dict): the whole list of exercises, so
    that a notebook of another chapter is recognised as such, and which one is graded."""
    return {**manifest, "assignment": assignment}


def assignment_chapter(manifest, assignment):
    """The manifest's chapter of the assignment, holding only the assignment's exercises."""
    chapter = next(c for c in manifest["chapters"] if c["notebook"] == assignment["notebook"])
    return {**chapter, "exercises": [e for e in chapter["exercises"] if e["label"] in assignment["exercises"]]}


def assignment_manifest(manifest, assignment):
    """The manifest to grade an assignment with: its chapter alone, with its exercises alone."""
    return {**manifest, "chapters": [assignment_chapter(manifest, assignment)], "assignment": assignment}


def assignment_checks(manifest, assignment):
    """[(label, check, points)] of every automatic check of the assignment: its exercise's points shared
    equally among the exercise's checks (the rule above). Their points add up to its max_points."""
    return [(e["label"], c["check"], e["points"] / len(e["checks"]))
            for e in checked_exercises(assignment_chapter(manifest, assignment)) for c in e["checks"]]


def main(argv):
    parser = argparse.ArgumentParser(description="The handout's list of exercises: every chapter's automatically "
                                     "checked points, or what one assignment holds.")
    parser.add_argument("--manifest", type=Path, help="an exercises.json (default: the book's chapters, read now)")
    parser.add_argument("--assignment", help="a chapter (`15`, `15_heads_across_devices`) or exercises of one "
                        "chapter, their labels comma-separated")
    args = parser.parse_args(argv)
    manifest = read_manifest(args.manifest) if args.manifest else build_manifest(
        sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")), ROOT)
    if args.assignment is None:
        for chapter in manifest["chapters"]:
            checked = checked_exercises(chapter)
            count = sum(len(e["checks"]) for e in checked)
            print(f"{chapter_stem(chapter)}: {sum(e['points'] for e in checked):g} points in "
                  f"{count} check{'' if count == 1 else 's'}")
        return 0
    try:
        assignment = find_assignment(manifest, args.assignment)
    except ValueError as error:
        parser.error(str(error))
    print(f"{assignment['name']} ({assignment['notebook']}): {assignment['max_points']:g} points")
    for label, check, points in assignment_checks(manifest, assignment):
        print(f"  {label}: {check}, {points:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
