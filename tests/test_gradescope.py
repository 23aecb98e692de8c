"""Exports of the grader: Gradescope's autograder, and totals per student for Canvas and Moodle.

`make gradescope` writes a zip (tools/make_gradescope.py) that is unpacked here into a
temporary Gradescope layout (source/, submission/, results/), and its run_autograder is
run there with AUTOGRADER_ROOT and the course's environment first on PATH, as Gradescope
runs it after setup.sh: chapter 5's key scores every point, the untouched handout none,
a submission without a notebook and a grader that crashes still give a valid
results.json. Its format is checked against Gradescope's specification
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). The LMS export is
checked on made-up rows: Canvas's columns, one row per student, and a roster that does
not match the grades.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass

import nbformat
import pytest

from conftest import ROOT
from test_grading import CHAPTER, student_notebook, with_key_code

sys.path.insert(0, str(ROOT / "tools"))
import make_gradescope  # noqa: E402
import make_handout  # noqa: E402
from grading import exports  # noqa: E402

SECRET = "the instructor's own secret"
VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "simple_format", "html", "md", "ansi"}
TOP_KEYS = {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
            "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
TEST_KEYS = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format", "tags",
             "visibility", "extra_data"}


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def assert_valid_results(results):
    """results.json as Gradescope's specification ("Output format") defines it."""
    assert isinstance(results, dict) and set(results) <= TOP_KEYS, results
    assert is_number(results["score"]) and isinstance(results["output"], str) and results["output"]
    assert results["visibility"] in VISIBILITIES
    assert all(results[k] in FORMATS for k in ("output_format", "test_output_format", "test_name_format")
               if k in results)
    assert isinstance(results["tests"], list)
    for test in results["tests"]:
        assert isinstance(test, dict) and set(test) <= TEST_KEYS, test
        assert is_number(test["score"]) and is_number(test["max_score"]) and 0 <= test["score"] <= test["max_score"]
        assert isinstance(test["name"], str) and isinstance(test["output"], str) and test["name"] and test["output"]
        assert test["visibility"] == "visible" and test["status"] in {"passed", "failed"}
        assert isinstance(test.get("extra_data", {}), dict)


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """(the zip, the handout it was made from)."""
    folder = tmp_path_factory.mktemp("gradescope")
    handout = make_handout.make_handout(folder / "handout", build_html=False, repository=None)
    zip_path = make_gradescope.make_autograder(folder / "autograder.zip", handout / "student" / "exercises.json",
                                               secret=SECRET)
    return zip_path, handout


def gradescope_layout(zip_path, root, notebooks):
    """What Gradescope makes: the zip in source/, run_autograder beside it, the submission's files."""
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
        for info in archive.infolist():  # extractall drops the modes: Gradescope keeps them
            os.chmod(root / "source" / info.filename, (info.external_attr >> 16) & 0o777)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    for name, notebook in notebooks.items():
        nbformat.write(notebook, root / "submission" / name)
    return root


def start(root):
    environment = {**{k: v for k, v in os.environ.items() if k != "MHA_GRADING_SECRET"}, "AUTOGRADER_ROOT": str(root),
                   "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.Popen([str(root / "run_autograder")], cwd=root, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def graded(autograder, tmp_path_factory):
    """results.json of each submission, every run_autograder at once: {name: (results, its output)}."""
    zip_path, handout = autograder
    submissions = {"key": {CHAPTER.name: with_key_code(student_notebook(handout))},
                   "handout": {CHAPTER.name: student_notebook(handout)},
                   "nothing": {}}
    roots = {name: gradescope_layout(zip_path, tmp_path_factory.mktemp(name), notebooks)
             for name, notebooks in submissions.items()}
    (roots["nothing"] / "submission" / "answers.txt").write_text("no notebook here")
    roots["crash"] = gradescope_layout(zip_path, tmp_path_factory.mktemp("crash"), submissions["handout"])
    (roots["crash"] / "source" / "tools" / "grade.py").write_text("raise SystemExit('the grader crashed')\n")
    runs = {name: start(root) for name, root in roots.items()}
    outputs = {name: run.communicate(timeout=300)[0] for name, run in runs.items()}
    for name, run in runs.items():
        assert run.returncode == 0, f"{name}: run_autograder exited with {run.returncode}\n{outputs[name]}"
    return {name: (json.loads((root / "results" / "results.json").read_text()), outputs[name])
            for name, root in roots.items()}


def test_the_zip_holds_what_gradescope_needs_and_little_else(autograder):
    with zipfile.ZipFile(autograder[0]) as archive:
        names = set(archive.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in archive.infolist()}
        setup = archive.read("setup.sh").decode()
        secret = archive.read("grading_secret").decode()
    assert {"setup.sh", "run_autograder", "exercises.json", "tools/grade.py", "tools/grading/exports.py",
            "src/mha/checks/__init__.py", "pyproject.toml", "requirements.txt"} <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    assert secret == SECRET and modes["grading_secret"] == 0o600
    assert not any(n.startswith(("book/", "_build/", "tests/", "source/")) or "__pycache__" in n for n in names)
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in setup and "bubblewrap" in setup
    assert setup.index("torch==2.13.0") < setup.index("-r requirements.txt")
    assert autograder[0].stat().st_size < 5e6


def test_the_key_scores_full_marks(graded):
    results, output = graded["key"]
    assert_valid_results(results)
    tests = results["tests"]
    assert len(tests) == 5 and results["score"] == sum(t["max_score"] for t in tests) == 6, output
    assert all(t["score"] == t["max_score"] > 0 and t["status"] == "passed" for t in tests), tests
    assert "ex-ch5-split-merge: check_split_heads" in {t["name"] for t in tests}
    assert all(isinstance(t["extra_data"]["seed"], int) for t in tests), "each check's seed, for a regrade"
    assert "No --secret" not in output, "run_autograder hands the zip's secret to grade.py"


def test_the_untouched_handout_scores_nothing_and_says_why(graded):
    results, output = graded["handout"]
    assert_valid_results(results)
    tests = results["tests"]
    assert len(tests) == 5 and results["score"] == 0 and sum(t["max_score"] for t in tests) == 6, output
    assert all(t["score"] == 0 and t["status"] == "failed" for t in tests)
    assert all("not written yet" in t["output"] for t in tests), [t["output"] for t in tests]


@pytest.mark.parametrize("submission,reason", [("nothing", "No notebook"), ("crash", "The grader stopped")])
def test_without_a_grade_results_json_is_still_valid(graded, submission, reason):
    results, output = graded[submission]
    assert_valid_results(results)
    assert results["score"] == 0 and results["tests"] == [] and results["output"].startswith(reason), output


ROWS = [
    {"student": "ada", "exercise": "ex-ch1-softmax", "check": "check_softmax", "passed": True,
     "message": "check_softmax: all 5 cases passed.", "points": 2, "max_points": 2, "chapter": "01", "seed": 7},
    {"student": "ada", "exercise": "ex-ch1-loop", "check": "check_self_attention", "passed": False,
     "message": "self_attention gives a wrong answer\n  hint: divide by sqrt(d)", "points": 0, "max_points": 2,
     "chapter": "01"},
    {"student": "bob/ch1", "exercise": "ex-ch1-softmax", "check": "check_softmax", "passed": True, "message": "",
     "points": 0.5, "max_points": 0.5, "chapter": "01"},
]


@dataclass
class Row:  # as tools/grade.py holds its rows before writing grades.json
    student: str
    exercise: str
    check: str
    passed: bool
    message: str
    points: float
    max_points: float
    chapter: str


def test_gradescope_results_of_one_notebook():
    results = exports.gradescope_results(ROWS[:2])
    assert_valid_results(results)
    passed, failed = results["tests"]
    assert results["score"] == 2 and [t["max_score"] for t in results["tests"]] == [2, 2]
    assert passed == {"name": "ex-ch1-softmax: check_softmax", "score": 2, "max_score": 2, "status": "passed",
                      "output": "check_softmax: all 5 cases passed.", "visibility": "visible",
                      "extra_data": {"seed": 7}}
    assert failed["output"] == ROWS[1]["message"] and "hint: divide by sqrt(d)" in failed["output"]
    assert failed["status"] == "failed" and failed["score"] == 0 and "extra_data" not in failed
    assert "ada (01): 1 of 2 checks passed, 2 of 4 points." in results["output"]
    assert exports.gradescope_results([Row(**{k: v for k, v in ROWS[1].items()})]) == \
        exports.gradescope_results([ROWS[1]]), "grade.py's dataclass rows read as grades.json's dicts"


def test_gradescope_results_of_several_notebooks_and_of_none():
    results = exports.gradescope_results(ROWS)
    assert_valid_results(results)
    assert results["score"] == 2.5 and results["tests"][2]["output"] == "passed"
    assert [t["name"].split(" · ")[0] for t in results["tests"]] == ["ada", "ada", "bob/ch1"]
    empty = exports.gradescope_results([])
    assert_valid_results(empty)
    assert empty["score"] == 0 and empty["tests"] == [] and "No check was graded" in empty["output"]


def test_the_command_line_writes_results_json(tmp_path):
    (tmp_path / "grades.json").write_text(json.dumps(ROWS[:2]))
    assert exports.main(["gradescope", str(tmp_path / "grades.json"), str(tmp_path / "out" / "results.json")]) == 0
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == exports.gradescope_results(ROWS[:2])


def write_roster(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as table:
        return list(csv.reader(table))


def test_lms_totals_import_into_canvas_and_moodle(tmp_path):
    roster = write_roster(tmp_path / "roster.csv", [
        "notebook,lms_id,name,section", 'ada,ada.lovelace,"Lovelace, Ada",Tuesday', "bob/ch1,bob.jones,,",
        "bob/ch2,bob.jones,Bob Jones,Friday", "cy,cy@example.org,,"])
    with pytest.warns(exports.MissingSubmission, match=r"score 0: bob/ch2, cy"):
        path = exports.write_lms_totals(ROWS, roster, tmp_path / "out", assignment="Chapter 1")
    header, *rows = read_csv(path)
    # Canvas: the identity columns of its gradebook export, then the assignment; Moodle maps SIS Login ID.
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Chapter 1"]
    assert rows == [["Lovelace, Ada", "", "", "ada.lovelace", "Tuesday", "2"],
                    ["Bob Jones", "", "", "bob.jones", "Friday", "0.5"],
                    ["cy", "", "", "cy@example.org", "", "0"]]
    assert not path.read_bytes().startswith(b"\xef\xbb\xbf"), "no byte-order mark"


@pytest.mark.parametrize("lines,message", [
    (["notebook,lms_id", "ada,ada.lovelace"], r"not in the roster.*bob/ch1"),
    (["notebook,name", "ada,Ada"], r"no column 'lms_id'"),
    (["notebook,lms_id", "ada,a", "bob/ch1,", "ada,b"], r"line 3 has no lms_id; notebook 'ada' is on lines 2 and 4"),
])
def test_a_roster_that_does_not_match_the_grades_is_refused(tmp_path, lines, message):
    roster = write_roster(tmp_path / "roster.csv", lines)
    with pytest.raises(ValueError, match=message):
        exports.write_lms_totals(ROWS, roster, tmp_path)
    assert not (tmp_path / exports.LMS_FILE).exists()


def test_the_lms_command_line(tmp_path, capsys):
    (tmp_path / "grades.json").write_text(json.dumps(ROWS))
    roster = write_roster(tmp_path / "roster.csv", ["notebook,lms_id", "ada,1001", "bob/ch1,1002"])
    assert exports.main(["lms", str(tmp_path / "grades.json"), "--roster", str(roster), "--out", str(tmp_path)]) == 0
    assert read_csv(tmp_path / exports.LMS_FILE)[1:] == [["ada", "", "", "1001", "", "2"],
                                                         ["bob/ch1", "", "", "1002", "", "0.5"]]
    assert read_csv(tmp_path / exports.LMS_FILE)[0][-1] == "Multi-head attention"
    roster.write_text("notebook,lms_id\nada,1001\n")
    assert exports.main(["lms", str(tmp_path / "grades.json"), "--roster", str(roster), "--out", str(tmp_path)]) == 2
    assert "bob/ch1" in capsys.readouterr().err
