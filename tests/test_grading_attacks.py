"""A grade that the student's code cannot reach: tools/grade.py against a hostile class.

Each submission below is the handout's notebook with one stub replaced by an attack:
a wrong function dressed up to look right (the report forged, the check module or the
comparison patched, the process ended with a forged line), a call of the library's own
answer by another road (the function itself, a twin, a renamed or exec'd copy, the
library's source read from disk, torch), a hang that swallows interrupts, a memory
hog, an input written in place. One grade.py run grades them all, with short limits;
every attacked check must be graded failed (and the reason named where it is ours to
name), a right solution written from scratch passed, and a second run must give the
same grades with the same seeds.
"""

import json
import shutil

import nbformat
import pytest

from conftest import ROOT
from test_grading import grade, make_handout

CHAPTER_12 = "12_modern_attention.ipynb"
CHAPTER_1 = "01_weighted_average.ipynb"

RIGHT_REPEAT = '''
import numpy as np

def repeat_kv(x, n_rep):
    x = np.asarray(x)
    return np.repeat(x, n_rep, axis=-3)
'''
WRONG_REPEAT = '''
import numpy as np

def repeat_kv(x, n_rep):
    x = np.asarray(x)
    return np.tile(x, (1,) * (x.ndim - 3) + (n_rep, 1, 1))  # heads in the wrong order
'''
ATTACKS_12 = {
    # the report: json.dumps patched, a forged success line printed, the process ended
    "forged_report": WRONG_REPEAT + '''
import json, os, sys
json.dumps = lambda *a, **k: '["passed", "check_repeat_kv: all 5 cases passed."]'
_wrong = repeat_kv
def repeat_kv(x, n_rep):
    print("check_repeat_kv: all 5 cases passed.")
    sys.__stdout__.write('grade-0000:["passed", "ok"]\\n')
    return _wrong(x, n_rep)
''',
    "ends_the_process": WRONG_REPEAT + '''
import os
def repeat_kv(x, n_rep):
    print('["passed", "check_repeat_kv: all 5 cases passed."]', flush=True)
    os._exit(0)
''',
    # the checks: a fake mha.checks, the comparison and the reference patched
    "fake_checks": WRONG_REPEAT + '''
import importlib, sys, types
fake = types.ModuleType("mha.checks")
fake.check_repeat_kv = lambda fn, **k: print("check_repeat_kv: all 5 cases passed.")
sys.modules["mha.checks"] = fake
_import = importlib.import_module
importlib.import_module = lambda name, *a: fake if name.startswith("mha.checks") else _import(name, *a)
try:
    import mha.checks.registry as registry
    registry.compare_result = lambda *a, **k: None
except ImportError:
    pass
''',
    # the library's own answer, by every road we know
    "library_itself": "import mha.numpy as mnp\nrepeat_kv = mnp.repeat_kv\n",
    "library_renamed_and_wrapped": '''
import sys
from mha.numpy import repeat_kv as _theirs
import mha.numpy.grouped as grouped
def repeat_kv(x, n_rep):
    sys.setprofile(None)
    return _theirs(x, n_rep)
''',
    "library_cache_step": '''
import numpy as np
import mha.numpy as mnp
def repeat_kv(x, n_rep):
    x = np.asarray(x)
    h_kv = x.shape[-3]
    q = np.zeros(x.shape[:-3] + (h_kv * n_rep,) + x.shape[-2:])
    return mnp.attend_with_cache(q, x, x)[2]
''',
    "library_source_from_disk": '''
import pathlib
_source = pathlib.Path("''' + str(ROOT / "src" / "mha" / "numpy" / "grouped.py") + '''").read_text()
_space = {}
exec(compile(_source, "mha/numpy/grouped.py", "exec"), _space)
repeat_kv = _space["repeat_kv"]
''',
    "torch_instead": '''
import torch
def repeat_kv(x, n_rep):
    return torch.repeat_interleave(torch.as_tensor(x), n_rep, dim=-3).numpy()
''',
    # containment: a hang that swallows interrupts, a memory hog, an input written in place
    "hangs": '''
def repeat_kv(x, n_rep):
    while True:
        try:
            pass
        except BaseException:
            pass
''',
    "hog": '''
import numpy as np
def repeat_kv(x, n_rep):
    hog = [np.ones(2**27) for _ in range(40)]  # 40 GiB
    return x
''',
    "in_place": '''
import numpy as np
def repeat_kv(x, n_rep):
    x *= 1.0
    x += 0.0
    out = np.repeat(x, n_rep, axis=-3)
    x[...] = 0
    return out
''',
    "right": RIGHT_REPEAT,
}
# What the report must say for the attacks whose reason is the grader's to name.
REASONS = {"ends_the_process": "worker ended", "hangs": "ran past", "hog": "GiB",
           "library_itself": "switched off", "library_renamed_and_wrapped": "switched off",
           "library_cache_step": "switched off", "torch_instead": "not available",
           "library_source_from_disk": "No such file", "in_place": "in place"}


def submission(handout, chapter, function, code):
    """The handout's notebook of `chapter` with the stub of `function` replaced by `code`."""
    notebook = nbformat.read(handout / "student" / "book" / chapter, as_version=4)
    stub = next(c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])
                and f"def {function}(" in c.source)
    stub.source = code
    return notebook


def run_grade(folder, out, *extra):
    code = grade.main([str(p) for p in sorted(folder.glob("*.ipynb"))] + [
        "--manifest", str(folder.parent / "handout" / "student" / "exercises.json"), "--out", str(out),
        "--jobs", "2", "--timeout", "20", "--notebook-timeout", "60", "--memory", "1", "--secret", "s3cret",
        *extra])
    return code, {(r["student"], r["check"]): r for r in json.loads((out / "grades.json").read_text())}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("attacks")
    handout = make_handout.make_handout(base / "handout", build_html=False, repository=None)
    folder = base / "class"
    folder.mkdir()
    for name, code in ATTACKS_12.items():
        nbformat.write(submission(handout, CHAPTER_12, "repeat_kv", code), folder / f"{name}.ipynb")
    return base, folder, run_grade(folder, base / "first")


def test_grade_runs_outside_the_students_reach():
    assert shutil.which("bwrap"), "make test installs bubblewrap (Debian's package): the grader's sandbox"


@pytest.mark.parametrize("attack", [a for a in ATTACKS_12 if a != "right"])
def test_every_attack_on_repeat_kv_is_graded_failed(graded, attack):
    _, _, (code, rows) = graded
    row = rows[(attack, "check_repeat_kv")]
    assert not row["passed"] and row["points"] == 0, row
    if attack in REASONS:
        assert REASONS[attack] in row["message"], row["message"]
    assert code == 1


def test_a_right_solution_written_from_scratch_passes(graded):
    _, _, (_, rows) = graded
    assert rows[("right", "check_repeat_kv")]["passed"], rows[("right", "check_repeat_kv")]["message"]


def test_a_hang_and_a_crash_cost_only_their_own_notebook(graded):
    """The notebooks graded after the hang and the exit are graded (and the right one passes)."""
    _, _, (_, rows) = graded
    assert {student for student, _ in rows} == set(ATTACKS_12)
    for attack in ("hangs", "ends_the_process", "hog"):
        others = [r for (s, c), r in rows.items() if s == attack and c != "check_repeat_kv"]
        assert others and all("not written yet" in r["message"] or not r["passed"] for r in others)


def test_the_same_submission_gets_the_same_grade_and_seeds_on_every_run(graded):
    base, folder, (_, first) = graded
    _, second = run_grade(folder, base / "second")
    same = lambda rows: {k: (r["passed"], r["seed"]) for k, r in rows.items()}  # noqa: E731
    assert same(first) == same(second)
    assert all(isinstance(r["seed"], int) for r in first.values())
    seeds = {r["seed"] for (s, c), r in first.items() if c == "check_repeat_kv"}
    assert len(seeds) == len(ATTACKS_12), "each student and submission draws its own cases"
