"""A grade that the student's code cannot reach: tools/grading/grade.py against a hostile class.

Each submission below is the handout's notebook with one stub replaced by an attack:
a wrong function dressed up to look right (the report forged, the check module or the
comparison patched, the process ended with a forged line), a call of the library's own
answer by another road (the function itself, a twin, a renamed or exec'd copy, the
library's source read from disk, torch), a hang that swallows interrupts, a memory
hog, an input written in place. One grade.py run grades them all, with short limits;
every attacked check must be graded failed (and the reason named where it is ours to
name), a right solution written from scratch passed, and a second run must give the
same grades with the same seeds. The book's own answers pass under the same short limits:
tests/test_grading_agreement.py grades every chapter's key with them.
"""

import csv
import json
import shutil

import nbformat
import pytest

from attacks import escape_to_the_library
from conftest import ROOT
from handouts import SHORT_LIMITS, shared_handout, student_notebook

from tools.grading import grade

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
    "frame_walker": WRONG_REPEAT + '''
import sys
_wrong = repeat_kv
class Peeking:
    """An answer that looks for the checker's expected answer in the frames when it is converted."""
    def __init__(self, fallback):
        self.fallback = fallback
    def __array__(self, dtype=None, copy=None):
        frame = sys._getframe(1)
        while frame is not None:
            if "expected" in frame.f_locals:
                return frame.f_locals["expected"]
            frame = frame.f_back
        return self.fallback
def repeat_kv(x, n_rep):
    return Peeking(_wrong(x, n_rep))
''',
    "library_in_a_thread": '''
import threading
import mha.numpy as mnp
def repeat_kv(x, n_rep):
    box = []
    worker = threading.Thread(target=lambda: box.append(mnp.repeat_kv(x, n_rep)))
    worker.start()
    worker.join()
    return box[0]
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
    # out of the sandbox: unmount what covers the project, then import the real library from it
    "escape_to_the_library": WRONG_REPEAT + escape_to_the_library(ROOT),
    # the reply: one far longer than the case allows, one nested deeper than any answer
    "oversized_reply": RIGHT_REPEAT + '''
_right = repeat_kv
def repeat_kv(x, n_rep):
    return np.zeros(2**24) if x.size > 1 else _right(x, n_rep)
''',
    "deep_reply": RIGHT_REPEAT + '''
def repeat_kv(x, n_rep):
    deep = [1.0]
    for _ in range(60):
        deep = [deep]
    return deep
''',
    "right": RIGHT_REPEAT,
}
# Other chapters: (chapter, function, code, passes?). Library roads to softmax, the LM loss and
# generation; chunked attention that builds the whole T x T array; the book's own answers.
FULL_MATRIX_CHUNKED = '''
import numpy as np
def chunked_attention(Q, K, V, mask=None, chunk=256):
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return (weights @ V).astype(np.result_type(Q, K, V))
'''
OTHER_CHAPTERS = {
    "softmax_by_log_softmax": (CHAPTER_1, "softmax", "import numpy as np\nimport mha.numpy as mnp\n"
                               "def softmax(x, axis=-1):\n    return np.exp(mnp.log_softmax(x, axis=axis))\n", False),
    "softmax_by_scipy": (CHAPTER_1, "softmax", "from scipy.special import softmax\n", False),
    "softmax_in_place": (CHAPTER_1, "softmax", "import numpy as np\ndef softmax(x, axis=-1):\n"
                         "    x -= x.max(axis=axis, keepdims=True)\n    np.exp(x, out=x)\n"
                         "    x /= x.sum(axis=axis, keepdims=True)\n    return x\n", False),
    "chunked_full_matrix": ("08_attention_at_scale.ipynb", "chunked_attention", FULL_MATRIX_CHUNKED, False),
    # a sleeping child started first: the memory must still be measured on the process that computes
    "chunked_full_matrix_past_a_decoy": ("08_attention_at_scale.ipynb", "chunked_attention",
                                         "import subprocess\n_decoy = subprocess.Popen(['sleep', '600'])\n"
                                         + FULL_MATRIX_CHUNKED, False),
    "generate_by_torch_face": ("11_training_a_transformer.ipynb", "generate_greedy",
                               "import mha.torch as mt\ngenerate_greedy = mt.generate_greedy\n", False),
}
# What the report must say for the attacks whose reason is the grader's to name.
REASONS = {"ends_the_process": "worker ended", "hangs": "ran past", "hog": "GiB",
           "library_itself": "switched off", "library_renamed_and_wrapped": "switched off",
           "library_cache_step": "switched off", "torch_instead": "not available",
           "library_source_from_disk": "No such file", "in_place": "in place",
           "frame_walker": "not an answer", "library_in_a_thread": "IndexError",
           "oversized_reply": "reply was refused", "deep_reply": "reply was refused",
           "escape_to_the_library": "switched off"}


def submission(handout, chapter, function, code):
    """The handout's notebook of `chapter` with the stub of `function` replaced by `code`."""
    notebook = student_notebook(handout, chapter)
    stub = next(c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])
                and f"def {function}(" in c.source)
    stub.source = code
    return notebook


def run_grade(folder, out, *extra):
    """grade.py on the class in `folder`, against the list of exercises beside it."""
    code = grade.main([str(p) for p in sorted(folder.glob("*.ipynb"))] + [
        "--manifest", str(folder.parent / "exercises.json"), "--out", str(out),
        "--jobs", "2", *SHORT_LIMITS, "--secret", "s3cret", *extra])
    return code, {(r["student"], r["check"]): r for r in json.loads((out / "grades.json").read_text())}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("attacks")
    handout = shared_handout(tmp_path_factory)  # the one the test files of this run share: read only
    shutil.copy(handout / "student" / "exercises.json", base / "exercises.json")
    folder = base / "class"
    folder.mkdir()
    for name, code in ATTACKS_12.items():
        nbformat.write(submission(handout, CHAPTER_12, "repeat_kv", code), folder / f"{name}.ipynb")
    for name, (chapter, function, code, _) in OTHER_CHAPTERS.items():
        nbformat.write(submission(handout, chapter, function, code), folder / f"{name}.ipynb")
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


@pytest.mark.parametrize("attack", OTHER_CHAPTERS)
def test_library_roads_torch_scipy_in_place_and_a_full_matrix_fail_in_other_chapters(graded, attack):
    _, _, (_, rows) = graded
    chapter, function, _, _ = OTHER_CHAPTERS[attack]
    row = rows[(attack, f"check_{function}")]
    assert not row["passed"] and row["points"] == 0, row


@pytest.mark.parametrize("attack", ["chunked_full_matrix", "chunked_full_matrix_past_a_decoy"])
def test_the_full_matrix_fails_on_memory_measured_from_outside(graded, attack):
    _, _, (_, rows) = graded
    assert "MiB" in rows[(attack, "check_chunked_attention")]["message"]


def test_a_hang_and_a_crash_cost_only_their_own_notebook(graded):
    """The notebooks graded after the hang and the exit are graded (and the right one passes)."""
    _, _, (_, rows) = graded
    assert {student for student, _ in rows} == set(ATTACKS_12) | set(OTHER_CHAPTERS)
    for attack in ("hangs", "ends_the_process", "hog", "oversized_reply", "deep_reply"):
        others = [r for (s, c), r in rows.items() if s == attack and c != "check_repeat_kv"]
        assert others and all("not written yet" in r["message"] or not r["passed"] for r in others)


def test_the_same_submission_gets_the_same_grade_and_seeds_on_every_run(graded):
    """(The second run also writes the totals for an LMS, from a roster.)"""
    base, folder, (_, first) = graded
    students = sorted({s for s, _ in first})
    roster = base / "roster.csv"
    roster.write_text("notebook,lms_id\n" + "".join(f"{s},id-{s}\n" for s in students))
    _, second = run_grade(folder, base / "second", "--roster", str(roster), "--lms-column", "Chapter 12")
    with open(base / "second" / "lms_totals.csv", newline="") as table:
        totals = {r["SIS Login ID"]: float(r["Chapter 12"]) for r in csv.DictReader(table)}
    for student in students:
        assert totals[f"id-{student}"] == sum(r["points"] for (s, _), r in first.items() if s == student)
    same = lambda rows: {k: (r["passed"], r["seed"]) for k, r in rows.items()}  # noqa: E731
    assert same(first) == same(second)
    assert all(isinstance(r["seed"], int) for r in first.values())
    seeds = {r["seed"] for (s, c), r in first.items() if c == "check_repeat_kv" and s in ATTACKS_12}
    assert len(seeds) == len(ATTACKS_12), "each student and submission draws its own cases"
