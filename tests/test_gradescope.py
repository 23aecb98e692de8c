"""Exports of the grader: Gradescope's autograder, and totals per student for Canvas and Moodle.

`make gradescope ASSIGNMENT=5` writes a zip (tools/grading/make_gradescope.py) for one assignment,
chapter 5, that is unpacked here into a temporary Gradescope layout (source/, submission/,
results/), and its run_autograder is run there with AUTOGRADER_ROOT and the course's
environment first on PATH, as Gradescope runs it after setup.sh: chapter 5's key scores
every point, the untouched handout none, a submission without a notebook and a grader that
crashes still give a valid results.json. One assignment, one notebook, at most full marks:
the key beside a copy of itself and the solved notebooks of chapters 13 and 14 scores the
assignment's 6 points and no more; several notebooks none of which is the assignment's, two
of its name, or another chapter's notebook alone score 0 and say why. tools/grading/grade.py's
--assignment grades the assignment's checks alone. The format of results.json is checked
against Gradescope's specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/).
The LMS export is checked on made-up rows: Canvas's columns, one row per student, and a
roster that does not match the grades.
"""

import csv
import json
import os
import shutil
import subprocess
import zipfile

import nbformat
import pytest

from conftest import ROOT
from handouts import shared_handout, student_notebook, with_key_code

from tools.grading import exports, grade, make_gradescope
from tools.grading.notebook import Row
from tools.publishing import handout_manifest

SECRET = "the instructor's own secret"
ASSIGNMENT = "5"  # chapter 5: five checks, 6 points
CHAPTER = ROOT / "book" / "05_fused_heads_and_masks.ipynb"
MAXIMUM = 6
OTHERS = ["13_todays_models.ipynb", "14_a_model_that_writes.ipynb"]  # their keys: honest, solved notebooks
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
    """(the zip, the handout it was made from: the one the test files of this run share, read only)."""
    folder = tmp_path_factory.mktemp("gradescope")
    handout = shared_handout(tmp_path_factory)
    zip_path = make_gradescope.make_autograder(folder / "autograder.zip", handout / "student" / "exercises.json",
                                               secret=SECRET, assignment=ASSIGNMENT)
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
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, root / "submission" / name)
    return root


def key_of(handout, name):
    return nbformat.read(handout / "key" / name, as_version=4)


def start(root):
    environment = {**{k: v for k, v in os.environ.items() if k != "MHA_GRADING_SECRET"}, "AUTOGRADER_ROOT": str(root),
                   "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.Popen([str(root / "run_autograder")], cwd=root, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def graded(autograder, tmp_path_factory):
    """results.json of each submission, every run_autograder at once: {name: (results, its output)}."""
    zip_path, handout = autograder
    key = with_key_code(student_notebook(handout, CHAPTER), CHAPTER)
    submissions = {"key": {CHAPTER.name: key},
                   "handout": {CHAPTER.name: student_notebook(handout, CHAPTER)},
                   "nothing": {},
                   # The reviewer's attack: the assignment's notebook, a copy, and other chapters solved.
                   "attack": {CHAPTER.name: key, f"{CHAPTER.stem} (1).ipynb": key,
                              **{name: key_of(handout, name) for name in OTHERS}},
                   "several": {"mine.ipynb": key, "other.ipynb": key_of(handout, OTHERS[0])},
                   "duplicate": {f"first/{CHAPTER.name}": key, f"second/{CHAPTER.name}": key},
                   "another chapter": {OTHERS[0]: key_of(handout, OTHERS[0])}}
    roots = {name: gradescope_layout(zip_path, tmp_path_factory.mktemp(name.replace(" ", "_")), notebooks)
             for name, notebooks in submissions.items()}
    (roots["nothing"] / "submission" / "answers.txt").write_text("no notebook here")
    roots["crash"] = gradescope_layout(zip_path, tmp_path_factory.mktemp("crash"), submissions["handout"])
    crashing = roots["crash"] / "source" / "tools" / "grading" / "grade.py"
    crashing.write_text("raise SystemExit('the grader crashed')\n")
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
    assert {"setup.sh", "run_autograder", "exercises.json", "tools/__init__.py", "tools/grading/grade.py",
            "tools/grading/exports.py", "tools/publishing/handout_manifest.py", "src/mha/checks/__init__.py",
            "pyproject.toml", "requirements.txt"} <= names
    assert not any(n.startswith("tools/data/") for n in names), "the maintainers' tools are not the grader's"
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
    assert results["score"] == 0 and results["output"].startswith(reason), output
    assert all(t["score"] == 0 and t["status"] == "failed" for t in results["tests"])


def test_the_autograder_records_its_one_assignment(autograder):
    with zipfile.ZipFile(autograder[0]) as archive:
        shipped = json.loads(archive.read("exercises.json"))
    assert shipped["assignment"] == {"spec": "5", "name": CHAPTER.stem, "notebook": f"book/{CHAPTER.name}",
                                     "exercises": [e["label"] for c in shipped["chapters"] for e in c["exercises"]
                                                   if c["notebook"] == f"book/{CHAPTER.name}"],
                                     "max_points": MAXIMUM}
    with pytest.raises(TypeError):
        make_gradescope.make_autograder(autograder[0].parent / "none.zip")  # no assignment: no zip
    assert not (autograder[0].parent / "none.zip").exists()


def test_the_attack_of_several_chapters_scores_the_assignment_and_no_more(graded):
    """Chapter 5's key, a copy of it, and the solved notebooks of chapters 13 and 14: the assignment's
    notebook alone is graded, for its own checks; the others are named, not graded."""
    results, output = graded["attack"]
    assert_valid_results(results)
    assert results["score"] == MAXIMUM == sum(t["max_score"] for t in results["tests"]), output
    assert len(results["tests"]) == 5 and all(t["name"].startswith("ex-ch5-") for t in results["tests"])
    first = results["output"].splitlines()[0]
    assert first.startswith(f"Graded {CHAPTER.name}, the assignment's notebook. Not graded: ")
    assert all(name in first for name in OTHERS + [f"{CHAPTER.stem} (1).ipynb"]), first


@pytest.mark.parametrize("submission,reason", [
    ("several", f"2 notebooks were submitted (mine.ipynb, other.ipynb) and none is named {CHAPTER.name}: "
                "nothing was graded"),
    ("duplicate", f"2 notebooks are named {CHAPTER.name} (first/{CHAPTER.name}, second/{CHAPTER.name}): "
                  "nothing was graded"),
    ("another chapter", f"{OTHERS[0]} is the notebook of chapter 13_todays_models, not of the assignment "
                        f"({CHAPTER.stem}): not graded"),
])
def test_several_notebooks_a_duplicate_or_another_chapter_score_nothing_and_say_why(graded, submission, reason):
    results, output = graded[submission]
    assert_valid_results(results)
    assert results["score"] == 0, output
    tests = results["tests"]
    assert len(tests) == 5 and sum(t["max_score"] for t in tests) == MAXIMUM, "the assignment's checks, failed"
    assert all(t["status"] == "failed" and reason in t["output"] for t in tests), [t["output"] for t in tests]
    assert reason in results["output"], results["output"]
    assert "todays_models" not in " ".join(t["name"] for t in tests), "no row of another chapter"


def test_grade_py_grades_the_assignment_alone(autograder, tmp_path):
    """--assignment: a list of exercises of chapter 5 (one check); chapter 13's key gets one failed row of
    the assignment, not chapter 13's rows; the roster's column is named after the assignment."""
    _, handout = autograder
    nbformat.write(with_key_code(student_notebook(handout, CHAPTER), CHAPTER), tmp_path / "ada.ipynb")
    nbformat.write(key_of(handout, OTHERS[0]), tmp_path / "bob.ipynb")
    (tmp_path / "roster.csv").write_text("notebook,lms_id\nada,a\nbob,b\n")
    manifest = str(handout / "student" / "exercises.json")
    code = grade.main([str(tmp_path / "ada.ipynb"), str(tmp_path / "bob.ipynb"), "--manifest", manifest,
                       "--out", str(tmp_path), "--jobs", "2", "--secret", SECRET, "--roster",
                       str(tmp_path / "roster.csv"), "--assignment", "ex-ch5-causal-mask"])
    rows = json.loads((tmp_path / "grades.json").read_text())
    assert code == 1 and [(r["student"], r["check"], r["passed"], r["points"], r["max_points"]) for r in rows] == [
        ("ada", "check_causal_mask", True, 1, 1), ("bob", "check_causal_mask", False, 0, 1)], rows
    assert "chapter 13_todays_models, not of the assignment" in rows[1]["message"]
    assert {r["chapter"] for r in rows} == {CHAPTER.stem}
    header, *totals = read_csv(tmp_path / exports.LMS_FILE)
    assert header[-1] == f"{CHAPTER.stem}: ex-ch5-causal-mask" and [t[-1] for t in totals] == ["1", "0"]
    assert grade.main([str(tmp_path / "ada.ipynb"), "--manifest", manifest, "--assignment", "ch5"]) == 2


def test_an_assignment_is_a_chapter_or_exercises_of_one_chapter(autograder):
    manifest = handout_manifest.read_manifest(autograder[1] / "student" / "exercises.json")
    for spec in ("5", "05", CHAPTER.stem, CHAPTER.name):
        assert handout_manifest.find_assignment(manifest, spec)["max_points"] == MAXIMUM
    chosen = handout_manifest.find_assignment(manifest, "ex-ch5-multihead, ex-ch5-split-merge")
    assert chosen["exercises"] == ["ex-ch5-split-merge", "ex-ch5-multihead"] and chosen["max_points"] == 4
    for spec, message in [("ex-ch5-multihead,ex-ch13-swiglu", "of one chapter"), ("99", "unknown '99'"),
                          ("ex-ch5-mask-shapes", "no exercise with an automatic check"), (" ", "empty")]:
        with pytest.raises(ValueError, match=message):
            handout_manifest.find_assignment(manifest, spec)


ASSIGNED = {"name": "01", "notebook": "book/01_weighted_average.ipynb", "exercises": ["ex-ch1-softmax", "ex-ch1-loop"],
            "max_points": 4}


@pytest.mark.parametrize("files,chosen,said", [
    (["01_weighted_average.ipynb"], "01_weighted_average.ipynb", "the assignment's notebook."),
    (["x/01_weighted_average.ipynb", "a.ipynb", ".ipynb_checkpoints/a.ipynb"], "x/01_weighted_average.ipynb",
     "Not graded: a.ipynb (only 01_weighted_average.ipynb counts)"),
    (["mine.ipynb", "notes.txt"], "mine.ipynb", "the only notebook submitted"),
    (["a/01_weighted_average.ipynb", "b/01_weighted_average.ipynb"], None, "2 notebooks are named"),
    (["a.ipynb", "b.ipynb"], None, "none is named 01_weighted_average.ipynb"),
    (["notes.txt"], None, "No notebook"),
])
def test_the_one_notebook_of_a_submission(tmp_path, files, chosen, said):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    if chosen is None:
        with pytest.raises(exports.Refused, match=said):
            exports.choose_notebook(tmp_path, ASSIGNED)
    else:
        path, note = exports.choose_notebook(tmp_path, ASSIGNED)
        assert path == tmp_path / chosen and said in note


ROWS = [
    {"student": "ada", "exercise": "ex-ch1-softmax", "check": "check_softmax", "passed": True,
     "message": "check_softmax: all 5 cases passed.", "points": 2, "max_points": 2, "chapter": "01", "seed": 7},
    {"student": "ada", "exercise": "ex-ch1-loop", "check": "check_self_attention", "passed": False,
     "message": "self_attention gives a wrong answer\n  hint: divide by sqrt(d)", "points": 0, "max_points": 2,
     "chapter": "01"},
    {"student": "bob/ch1", "exercise": "ex-ch1-softmax", "check": "check_softmax", "passed": True, "message": "",
     "points": 0.5, "max_points": 0.5, "chapter": "01"},
]


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


def test_the_score_never_exceeds_the_assignments_maximum():
    """Rows of exercises outside the assignment do not count, and the score is cut to its maximum."""
    twice = ROWS[:2] + [dict(ROWS[0], student="ada (1)"), dict(ROWS[0], exercise="ex-ch2-other")]
    results = exports.gradescope_results(twice, assignment=ASSIGNED | {"max_points": 3})
    assert_valid_results(results)
    assert results["score"] == 3 and len(results["tests"]) == 3, results
    assert "1 check(s) of exercises outside the assignment" in results["output"]
    assert "add up to 4 points; the assignment is worth 3" in results["output"]
    assert exports.gradescope_results(ROWS[:2], assignment=ASSIGNED)["score"] == 2


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


def test_lms_totals_under_an_assignment_stop_at_its_points(tmp_path):
    """Two notebooks of one student for one assignment: not more than its points."""
    roster = write_roster(tmp_path / "roster.csv", ["notebook,lms_id", "ada,a", "bob/ch1,a"])
    with pytest.warns(exports.SeveralSubmissions, match=r"more than the assignment's 2 points.*: a"):
        path = exports.write_lms_totals(ROWS, roster, tmp_path, "Chapter 1", maximum=2)
    assert [row[-1] for row in read_csv(path)] == ["Chapter 1", "2"]


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
