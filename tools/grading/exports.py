"""The grades, as Gradescope and an LMS (Canvas, Moodle) read them.

    python -m tools.grading.exports gradescope GRADES_JSON RESULTS_JSON [--manifest EXERCISES_JSON] [--note TEXT]
    python -m tools.grading.exports choose SUBMISSION_DIR EXERCISES_JSON --refusal RESULTS_JSON
    python -m tools.grading.exports lms GRADES_JSON --roster ROSTER_CSV --out DIR [--lms-column NAME] [--maximum POINTS]

Both read the rows of `grades.json` that tools/grading/grade.py writes (one per student and
check: student, exercise, check, passed, message, points, max_points, chapter, and
any further field, which is kept where it helps and otherwise ignored).

Gradescope (`gradescope_results`): the results.json of ONE submission, as Gradescope's
autograder specification defines it (https://gradescope-autograders.readthedocs.io/en/latest/specs/,
"Output format"): a top-level "score" (the points earned), "output" (one line per
notebook), "visibility": "visible", and "tests", one per check, each with "name"
("exercise: check"), "score", "max_score", "status" ("passed" or "failed"), "output"
(the check's whole message, hint included, or its confirmation when it passed) and
"visibility": "visible". Every string is plain text ("output_format",
"test_output_format" and "test_name_format" are "text"), so that a message such as
`<lambda>` is shown as written rather than read as HTML. A row's `seed`, if it has
one, and its `copy`, if set, go into the test's "extra_data", which Gradescope keeps with the
results and does not show the student: a copy of the library's code is a lead for the
instructor to judge (tools/grading/copies.py), not a verdict to show before they have.

One submission is graded for ONE assignment (tools/publishing/handout_manifest.py: a chapter, or
exercises of one chapter), which the autograder's exercises.json records. Given it
(`assignment`, or `--manifest`), the conversion keeps only the rows of the assignment's
exercises, and the score never exceeds the assignment's maximum, whatever the rows hold.
`choose_notebook` picks the one notebook of a submission to grade: the one named as the
assignment's notebook (`15_heads_across_devices.ipynb`; any others are named in the report
and not graded), else the only notebook there is. Several notebooks none of which has that
name, two of that name, or none at all: nothing is graded, and results.json gives 0 points
with the reason (`refusal_results`), one failed test per check of the assignment.

LMS (`write_lms_totals`): one CSV of totals per student that both of these import:
- Canvas, Grades > Import (https://community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807):
  the columns of Canvas's own gradebook export, "Student", "ID", "SIS User ID",
  "SIS Login ID", "Section", then one column per assignment, whose header is the
  assignment's name (an existing assignment of that exact name, or a new one). The
  LMS identifier goes into "SIS Login ID"; "ID" (Canvas's internal number) and
  "SIS User ID" stay empty, as Canvas then matches the student by the login ID.
- Moodle, Gradebook > Import > CSV file (https://docs.moodle.org/en/Grade_import):
  any CSV with a header row; under "Identify user by", map from "SIS Login ID" to
  the user field it holds (username, email address or ID number), and map the
  assignment's column to a grade item (or a new one). The other columns are ignored.
The file is UTF-8 without a byte-order mark, comma-separated, with "." as the decimal
point, and no "Points Possible" row (Moodle would read it as a student it cannot find).

The roster is a CSV file with a header row and one row per notebook:

    notebook,lms_id,name,section
    ada,ada.lovelace,"Lovelace, Ada",Tuesday
    bob/05_fused_heads_and_masks,bob.jones,,

- `notebook` (required): the student as tools/grading/grade.py names them, the notebook's path
  within the folder that holds all the submissions, without `.ipynb`;
- `lms_id` (required): the identifier the LMS matches on (Canvas's SIS Login ID, or
  the Moodle field you map it to). Several notebooks may share one `lms_id` (one
  student, several chapters): their points are added up, but never beyond `maximum`
  (`--maximum`; tools/grading/grade.py gives the assignment's points when it grades one), with a
  `SeveralSubmissions` warning naming whom it cut;
- `name` and `section` (optional): Canvas's "Student" and "Section" columns.

A notebook in the grades that the roster lacks is an error (ValueError naming every
one): its points would otherwise be lost without a word. A roster entry with no graded
notebook scores 0, as a missing submission does, and a `MissingSubmission` warning
names every such entry.
"""

import argparse
import csv
import json
import os
import sys
import tempfile
import warnings
from dataclasses import asdict, is_dataclass
from pathlib import Path

VISIBLE = "visible"
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
ROSTER_REQUIRED = ("notebook", "lms_id")
ROSTER_OPTIONAL = ("name", "section")
LMS_FILE = "lms_totals.csv"


class MissingSubmission(UserWarning):
    """A roster entry with no graded notebook: it scores 0."""


class SeveralSubmissions(UserWarning):
    """Several notebooks of one student for one assignment: their total is cut to its maximum."""


class Refused(ValueError):
    """A submission that holds no notebook to grade, or several that could be it."""


def as_dicts(rows):
    """grade.py's rows (its dataclass, or the dicts of grades.json) as dicts."""
    return [asdict(r) if is_dataclass(r) else dict(r) for r in rows]


def tidy(points):
    """3 rather than 3.0, and 0.333 rather than 0.3333333333333333."""
    points = float(points)
    return int(points) if points.is_integer() else round(points, 3)


def test_name(row, several_students):
    name = f"{row.get('exercise') or '-'}: {row.get('check') or '-'}"
    return f"{row['student']} · {name}" if several_students else name


def test_output(row):
    message = (row.get("message") or "").strip()
    if row.get("passed"):
        return message or "passed"
    return message or "failed"


def summary_line(student, mine):
    points, most = sum(r["points"] for r in mine), sum(r["max_points"] for r in mine)
    chapter = mine[0].get("chapter") or "no chapter found"
    return (f"{student} ({chapter}): {sum(bool(r['passed']) for r in mine)} of {len(mine)} checks passed, "
            f"{tidy(points)} of {tidy(most)} points.")


def student_lines(student, mine):
    """The summary line of one notebook, then, when every check failed for one reason (another chapter's
    notebook, a grader that stopped), that reason."""
    reasons = {(r.get("message") or "").strip() for r in mine}
    said = [reasons.pop()] if len(mine) > 1 and len(reasons) == 1 and not any(r.get("passed") for r in mine) else []
    return [summary_line(student, mine)] + [s for s in said if s]


def assignment_rows(rows, assignment):
    """(the rows of the assignment's exercises, and of none: a notebook's failure; the others)."""
    labels = set(assignment["exercises"])
    kept = [r for r in rows if not r.get("exercise") or r["exercise"] in labels]
    return kept, [r for r in rows if r.get("exercise") and r["exercise"] not in labels]


def gradescope_results(rows, note="", assignment=None):
    """Gradescope's results.json (a dict) for one submission: its rows of grades.json. `assignment`
    (tools/publishing/handout_manifest.py's dict, with "exercises" and "max_points"): only the rows of its exercises
    count, and the score is at most its maximum."""
    rows = as_dicts(rows)
    notes = [note] if note else []
    if assignment is not None:
        rows, dropped = assignment_rows(rows, assignment)
        if dropped:
            notes.append(f"{len(dropped)} check(s) of exercises outside the assignment ({assignment['name']}) "
                         "were not counted.")
    students = list(dict.fromkeys(r["student"] for r in rows))
    lines = [line for s in students for line in student_lines(s, [r for r in rows if r["student"] == s])]
    if not rows:
        lines = ["No check was graded: the submission holds no notebook with an exercise that has an "
                 "automatic check. Submit the chapter's notebook (.ipynb) with your solutions."]
    lines += ["Predict and Experiment exercises have no automatic check: they are graded by hand."] if rows else []
    tests = []
    for row in rows:
        test = {"name": test_name(row, len(students) > 1), "score": tidy(row["points"]),
                "max_score": tidy(row["max_points"]), "status": "passed" if row.get("passed") else "failed",
                "output": test_output(row), "visibility": VISIBLE}
        extra = {key: row[key] for key in ("seed", "copy") if row.get(key) not in (None, "")}
        if extra:
            test["extra_data"] = extra
        tests.append(test)
    score = sum(r["points"] for r in rows)
    if assignment is not None and score > assignment["max_points"]:
        notes.append(f"The rows add up to {tidy(score)} points; the assignment is worth "
                     f"{tidy(assignment['max_points'])}, which is the score.")
        score = assignment["max_points"]
    return {"score": tidy(score),
            "output": "\n".join(notes + lines),
            "output_format": "text", "test_output_format": "text", "test_name_format": "text",
            "visibility": VISIBLE, "tests": tests}


def submitted_notebooks(folder):
    """The notebooks of a submission (regular files, checkpoints aside), sorted."""
    folder = Path(folder)
    found = [p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.relative_to(folder).parts
             and p.is_file() and not p.is_symlink()] if folder.is_dir() else []
    return sorted(found)


def choose_notebook(folder, assignment):
    """(the notebook of the submission in `folder` to grade for `assignment`, a note for the report), or
    Refused saying why there is none (see the module's docstring)."""
    folder = Path(folder)
    expected = Path(assignment["notebook"]).name
    notebooks = submitted_notebooks(folder)
    shown = lambda paths: ", ".join(p.relative_to(folder).as_posix() for p in paths)  # noqa: E731
    named = [p for p in notebooks if p.name == expected]
    if len(named) > 1:
        raise Refused(f"{len(named)} notebooks are named {expected} ({shown(named)}): nothing was graded. "
                      f"Submit one {expected}.")
    if named:
        others = [p for p in notebooks if p != named[0]]
        return named[0], (f"Graded {shown(named)}, the assignment's notebook."
                          + (f" Not graded: {shown(others)} (only {expected} counts)." if others else ""))
    if not notebooks:
        raise Refused(f"No notebook (.ipynb) was submitted: submit {expected} with your solutions.")
    if len(notebooks) > 1:
        raise Refused(f"{len(notebooks)} notebooks were submitted ({shown(notebooks)}) and none is named {expected}: "
                      f"nothing was graded. Submit {expected} alone.")
    return notebooks[0], f"Graded {shown(notebooks)}, the only notebook submitted (the assignment's is {expected})."


def refusal_results(message, manifest=None, assignment=None):
    """results.json giving 0 points and saying why: one failed test per check of the assignment, if any."""
    tests = []
    if assignment is not None:
        from tools.publishing.handout_manifest import assignment_checks
        tests = [{"name": f"{label}: {check}", "score": 0, "max_score": tidy(points), "status": "failed",
                  "output": message, "visibility": VISIBLE}
                 for label, check, points in assignment_checks(manifest, assignment)]
    return {"score": 0, "output": message, "output_format": "text", "test_output_format": "text",
            "test_name_format": "text", "visibility": VISIBLE, "tests": tests}


def read_assignment(manifest_path):
    """(the manifest, the assignment it records or None)."""
    manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    return manifest, manifest.get("assignment")


def write_json(data, path):
    """Write `data` to `path` whole or not at all (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as out:
        json.dump(data, out, indent=1, ensure_ascii=False)
        out.write("\n")
    os.replace(out.name, path)
    return path


def read_roster(path):
    """The roster's rows as dicts (see the module's docstring for its columns)."""
    with open(path, newline="", encoding="utf-8-sig") as table:
        reader = csv.DictReader(table)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in ROSTER_REQUIRED if c not in header]
        if missing:
            raise ValueError(f"the roster {path} has no column {', '.join(map(repr, missing))}: its header must "
                             f"name {', '.join(ROSTER_REQUIRED)} (and may name {', '.join(ROSTER_OPTIONAL)}), "
                             f"but it is {', '.join(header) or 'empty'}")
        entries = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]
    entries = [e for e in entries if any(e.values())]  # blank lines
    problems = [f"line {i + 2} has no {c}" for i, e in enumerate(entries) for c in ROSTER_REQUIRED if not e.get(c)]
    seen = {}
    for i, entry in enumerate(entries):
        if entry["notebook"] and seen.setdefault(entry["notebook"], i) != i:
            problems.append(f"notebook {entry['notebook']!r} is on lines {seen[entry['notebook']] + 2} and {i + 2}")
    if problems:
        raise ValueError(f"the roster {path} is not usable: " + "; ".join(problems))
    return entries


def lms_totals(rows, roster):
    """The CSV's rows (dicts of Canvas's columns plus the points), one per LMS identifier, in roster order."""
    rows = as_dicts(rows)
    points = {}
    for row in rows:
        points[row["student"]] = points.get(row["student"], 0) + row["points"]
    listed = {e["notebook"] for e in roster}
    unknown = [s for s in points if s not in listed]
    if unknown:
        raise ValueError(f"{len(unknown)} graded notebook(s) are not in the roster, so their points cannot reach "
                         f"the LMS: {', '.join(unknown)}. Add a row `notebook,lms_id` for each.")
    absent = [e["notebook"] for e in roster if e["notebook"] not in points]
    if absent:
        warnings.warn(f"{len(absent)} roster entr{'y' if len(absent) == 1 else 'ies'} with no graded notebook "
                      f"score 0: {', '.join(absent)}", MissingSubmission, stacklevel=3)
    totals = {}
    for entry in roster:
        total = totals.setdefault(entry["lms_id"], {"entries": [], "points": 0})
        total["entries"].append(entry)
        total["points"] += points.get(entry["notebook"], 0)
    return totals


def write_lms_totals(rows, roster_path, folder, assignment="Multi-head attention", maximum=None):
    """Write `lms_totals.csv` (points per student, for Canvas and Moodle) into `folder`; its path.
    `assignment`: the name of the LMS column; `maximum`: the assignment's points, which no student's total
    exceeds (several notebooks of one student for one assignment are not added beyond it)."""
    if not assignment.strip() or assignment in CANVAS_IDENTITY:
        raise ValueError(f"the assignment's name {assignment!r} cannot be a column of its own: choose another")
    totals = lms_totals(rows, read_roster(roster_path))
    if maximum is not None:
        over = [lms_id for lms_id, total in totals.items() if total["points"] > maximum]
        if over:
            warnings.warn(f"{len(over)} student(s) have more than the assignment's {tidy(maximum)} points from "
                          f"several notebooks; their totals are cut to it: {', '.join(over)}", SeveralSubmissions,
                          stacklevel=2)
        for total in totals.values():
            total["points"] = min(total["points"], maximum)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LMS_FILE
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CANVAS_IDENTITY + [assignment.strip()])
        for lms_id, total in totals.items():
            entries = total["entries"]
            name = next((e["name"] for e in entries if e.get("name")), "") or ", ".join(e["notebook"] for e in entries)
            section = next((e["section"] for e in entries if e.get("section")), "")
            writer.writerow([name, "", "", lms_id, section, tidy(total["points"])])
    return path


def read_rows(path):
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(rows, list):
        raise ValueError(f"{path} is not grade.py's grades.json (a list of rows)")
    return rows


def arguments(argv):
    parser = argparse.ArgumentParser(description="The grades of tools/grading/grade.py, as Gradescope and an LMS "
                                     "read them.")
    commands = parser.add_subparsers(dest="command", required=True)
    gradescope = commands.add_parser("gradescope", help="grades.json of one submission -> Gradescope's results.json")
    gradescope.add_argument("grades_json")
    gradescope.add_argument("results_json")
    gradescope.add_argument("--manifest", help="the autograder's exercises.json: only its assignment's checks "
                            "count, and the score is at most the assignment's maximum")
    gradescope.add_argument("--note", default="", help="a line for the top of the report")
    choose = commands.add_parser("choose", help="the one notebook of a submission to grade for the assignment "
                                 "(prints its path, then a note); exit 3 having written a results.json of 0 points "
                                 "when there is none")
    choose.add_argument("submission", help="the submission's folder")
    choose.add_argument("manifest", help="the autograder's exercises.json, which records the assignment")
    choose.add_argument("--refusal", required=True, help="where to write results.json when nothing can be graded")
    lms = commands.add_parser("lms", help="grades.json of a class -> lms_totals.csv for Canvas and Moodle")
    lms.add_argument("grades_json")
    lms.add_argument("--roster", required=True, help="CSV with the columns notebook, lms_id (and name, section)")
    lms.add_argument("--out", required=True, help="the folder to write lms_totals.csv into")
    lms.add_argument("--lms-column", default="Multi-head attention", help="the assignment's name in the LMS")
    lms.add_argument("--maximum", type=float, help="the assignment's points: no student's total exceeds them")
    return parser.parse_args(argv)


def choose(args):
    manifest, assignment = read_assignment(args.manifest)
    try:
        if assignment is None:
            raise Refused("This autograder was built without an assignment, so it grades nothing: tell your "
                          "instructor (make gradescope ASSIGNMENT=...).")
        if "\n" in str(Path(args.submission).resolve()):
            raise Refused("The submission's folder has a line break in its name.")
        notebook, note = choose_notebook(args.submission, assignment)
        if "\n" in str(notebook):
            raise Refused(f"A notebook's name holds a line break: rename it {Path(assignment['notebook']).name}.")
    except Refused as refused:
        write_json(refusal_results(str(refused), manifest, assignment), args.refusal)
        print(refused, file=sys.stderr)
        return 3
    print(f"{notebook}\n{note}")
    return 0


def main(argv):
    args = arguments(argv)
    if args.command == "choose":
        return choose(args)
    rows = read_rows(args.grades_json)
    if args.command == "gradescope":
        assignment = read_assignment(args.manifest)[1] if args.manifest else None
        results = gradescope_results(rows, args.note, assignment)
        most = assignment["max_points"] if assignment else sum(t["max_score"] for t in results["tests"])
        print(f"{write_json(results, args.results_json)}: {results['score']} of {tidy(most)} points")
        return 0
    try:
        path = write_lms_totals(rows, args.roster, args.out, args.lms_column, args.maximum)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{path}: import it into Canvas (Grades > Import) or Moodle (Import > CSV file)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
