"""The handout's nbgrader version (tools/publishing/nbgrader_source.py), run through nbgrader.

nbgrader is not in requirements.txt (it brings JupyterLab, Notebook 7, Jupyter
Server and some 45 other packages that the course does not need). As the
instructors' page advises, it goes into the course's environment: here a fresh
virtual environment that sees the course's packages (a .pth file adds the
course's site-packages), into which pip installs nbgrader from PyPI, once: each
run gets its own copy of the venv cached under .cache/venvs/, and runs nbgrader
as `python -m nbgrader`. The test checks that nbgrader brings no other version
of any course package, then, on
chapter 1: `nbgrader generate_assignment` (no line of any solution survives in
the release), a right and a wrong submission (softmax over the last axis
whatever `axis` says), `nbgrader autograde`, and the scores in nbgrader's
gradebook. Without network access and without a cached venv the round trip skips
with the reason, unless the environment variable CI is set: then it fails.
"""

import copy
import json
import os
import re
import subprocess
import sysconfig
from importlib import metadata
from pathlib import Path

import nbformat
import pytest

from conftest import CHAPTERS
from handouts import solution_lines
from leaks import normal
from venvs import cached_venv, fresh_copy, purelib

from tools.publishing import nbgrader_source
from tools.publishing.handout_manifest import chapter_exercises

NBGRADER = "nbgrader==0.9.6"
CHAPTER = CHAPTERS[0]  # 01_weighted_average: two Implement exercises, four written ones
ASSIGNMENT = nbgrader_source.assignment_name(CHAPTER)
SOFTMAX = "ex-ch1-softmax-logsumexp"
WRONG_SOFTMAX = '''def softmax(x, axis=-1):
    """Normalises the last axis, whatever `axis` says."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)'''
NO_NETWORK = re.compile(r"No matching distribution|Could not find a version|NewConnectionError|"
                        r"Temporary failure in name resolution|Network is unreachable")
SCORES = """import json, sys
from nbgrader.api import Gradebook
notebook, assignment = sys.argv[1:3]
with Gradebook("sqlite:///gradebook.db") as gradebook:
    print(json.dumps({student: {g.name: [g.score, g.max_score, g.needs_manual_grade]
                                for g in gradebook.find_submission_notebook(notebook, assignment, student).grades}
                      for student in sys.argv[3:]}))
"""


def nbgrader_cells(notebook, **flags):
    """{grade_id: cell} for the cells whose nbgrader metadata has these flags."""
    return {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells
            if "nbgrader" in c.metadata and all(c.metadata["nbgrader"][k] == v for k, v in flags.items())}


def graded_ids(exercise):
    """The grade_ids of the cells that carry an exercise's points: its checks, or its written answer."""
    if exercise["checks"]:
        return [f"{exercise['label']}-{check['check']}" for check in exercise["checks"]]
    return [f"{exercise['label']}-answer"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_every_exercise_is_graded_in_the_source_version(chapter):
    notebook = nbgrader_source.source_notebook(chapter)
    graded, locked = nbgrader_cells(notebook, grade=True), nbgrader_cells(notebook, locked=True)
    exercises = {exercise["label"]: exercise for exercise in chapter_exercises(chapter)}
    for label, exercise in exercises.items():
        cells = [graded[grade_id] for grade_id in graded_ids(exercise)]
        assert sum(c.metadata["nbgrader"]["points"] for c in cells) == exercise["points"], label
        assert all(c.metadata["nbgrader"]["locked"] == bool(exercise["checks"]) for c in cells), label
        assert f"{label}-statement" in locked, f"{label}: the statement is not read-only"
    assert set(graded) == {i for exercise in exercises.values() for i in graded_ids(exercise)}
    for grade_id, cell in nbgrader_cells(notebook, solution=True, grade=False).items():
        implement = exercises[re.sub(r"-solution(-\d+)?$", "", grade_id)]["kind"] == "Implement"
        assert (nbgrader_source.BEGIN in cell.source) == implement, grade_id
        if implement:
            assert cell.source.startswith("def "), f"{grade_id}: the signature must stay outside the solution"


def unavailable(reason):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the nbgrader test may not skip)")
    pytest.skip(reason)


NBGRADER_INSTALL = ["pip", "install", "--quiet", "--no-compile", NBGRADER]


def distribution_names(site, versions=False):
    """The distributions installed in a site-packages folder: lower-case names (`name==version` with versions)."""
    return {d.metadata["Name"].lower() + (f"=={d.version}" if versions else "")
            for d in metadata.distributions(path=[site])}


def install_nbgrader(python, course_site):
    """nbgrader into a fresh venv that sees the course's packages (a .pth file adds their site-packages),
    so that pip adds only what the course lacks (tests/venvs.py caches it under .cache/venvs/)."""
    (Path(purelib(python)) / "course.pth").write_text(f"import site; site.addsitedir({course_site!r})\n")
    installed = subprocess.run([str(python), "-m", *NBGRADER_INSTALL], capture_output=True, text=True, timeout=600)
    if installed.returncode != 0 and NO_NETWORK.search(installed.stderr):
        unavailable(f"pip could not download {NBGRADER}: {installed.stderr.strip().splitlines()[-1]}")
    assert installed.returncode == 0, installed.stderr[-3000:]


@pytest.fixture(scope="module")
def nbgrader_env(tmp_path_factory):
    """PATH and JUPYTER_PATH of a virtual environment with nbgrader on top of the course's packages: this
    run's own copy of the venv cached under .cache/venvs/ by the hash of nbgrader's pin and of the course's
    packages (their folder, names and versions), which decide what pip adds."""
    root = tmp_path_factory.mktemp("nbgrader")
    course_site = sysconfig.get_paths()["purelib"]
    inputs = NBGRADER_INSTALL + [f"course site-packages: {course_site}"] + sorted(distribution_names(course_site, True))
    cached = cached_venv("nbgrader", inputs, lambda python: install_nbgrader(python, course_site))
    venv = fresh_copy(cached, root / "venv")
    python = venv / "bin" / "python"
    added = distribution_names(purelib(python)) - {"pip", "setuptools"}
    course = distribution_names(course_site)
    assert not added & course, f"nbgrader brings other versions of course packages: {added & course}"
    kernel = root / "jupyter" / "kernels" / "python3"  # the kernel that grades: this environment's Python
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    return {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "JUPYTER_PATH": str(root / "jupyter"), "JUPYTER_CONFIG_DIR": str(root / "config")}


def nbgrader(env, course, *args):
    """Run a command of nbgrader's environment in the course directory; its stdout."""
    done = subprocess.run(args, cwd=course, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def submit(course, student, release, answers):
    """The release notebook with its solution cells filled in from `answers` (by grade_id)."""
    notebook = copy.deepcopy(release)
    for grade_id, cell in nbgrader_cells(notebook, solution=True).items():
        cell.source = answers.get(grade_id, cell.source)
    folder = course / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / CHAPTER.name)


def key_answers(source):
    """What a student who writes the key submits: solution code without the delimiters, and the written answers."""
    delimiters = {nbgrader_source.BEGIN, nbgrader_source.END}
    return {grade_id: "\n".join(line for line in cell.source.splitlines() if line.strip() not in delimiters)
            for grade_id, cell in nbgrader_cells(source, solution=True).items()}


def test_nbgrader_scores_a_right_and_a_wrong_submission(nbgrader_env, tmp_path):
    course = nbgrader_source.write_nbgrader_source(tmp_path)
    nbgrader(nbgrader_env, course, "python", "-m", "nbgrader", "generate_assignment", ASSIGNMENT)
    release = nbformat.read(course / "release" / ASSIGNMENT / CHAPTER.name, as_version=4)
    released_text = normal(" ".join(c.source for c in release.cells))
    leaked = [line for line in solution_lines(CHAPTER) if line in released_text]
    assert not leaked, f"solution lines in nbgrader's release: {leaked[:3]}"

    key = key_answers(nbformat.read(course / "source" / ASSIGNMENT / CHAPTER.name, as_version=4))
    code_only = {k: v for k, v in key.items() if not k.endswith("-answer")}  # written answers left blank
    submit(course, "right", release, key)
    submit(course, "wrong", release, {**code_only, f"{SOFTMAX}-solution": WRONG_SOFTMAX})
    nbgrader(nbgrader_env, course, "python", "-m", "nbgrader", "autograde", ASSIGNMENT)
    scores = json.loads(nbgrader(nbgrader_env, course, "python", "-c", SCORES, CHAPTER.stem, ASSIGNMENT,
                                 "right", "wrong"))

    exercises = chapter_exercises(CHAPTER)
    assert set(scores["right"]) == {grade_id for e in exercises for grade_id in graded_ids(e)}
    lost = 0
    for exercise in exercises:
        for grade_id in graded_ids(exercise):
            points = exercise["points"] / len(graded_ids(exercise))
            right, wrong = scores["right"][grade_id], scores["wrong"][grade_id]
            if exercise["checks"]:
                assert right == [points, points, False], grade_id
                assert wrong == [0 if exercise["label"] == SOFTMAX else points, points, False], grade_id
                lost += points - wrong[0]
            else:  # a written answer: the key's waits for the instructor, a blank one scores 0
                assert right[1:] == [points, True] and wrong == [0, points, False], grade_id
    softmax_points = next(e["points"] for e in exercises if e["label"] == SOFTMAX)
    assert lost == softmax_points == 2, "the wrong softmax must lose exactly its exercise's points"
