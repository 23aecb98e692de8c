"""The student edition of `mha`: the only library a worker can import.

It holds `mha.numpy` and the modules it imports (`mha.validate`, `mha.rope_scaling`) as shipped, except that every function that
the exercise under grading replaces, or that computes the same result (the check's
`absent()`), is switched off: its body is gone and a call raises "this is the
exercise". `mha.checks` is there too, so that a notebook's `from mha.checks import
check_softmax` still runs, but its checks only say that the grader decides: no case,
no expected answer, no reference is in it. Nothing else of the library (mha.torch,
experiments, the real checks) is copied.
"""

import ast
import shutil
from pathlib import Path

import mha.checks

SOURCE = Path(mha.checks.__file__).resolve().parent.parent  # src/mha
COPIED = ["__init__.py", "validate.py", "rope_scaling.py", "numpy"]  # what mha.numpy imports
SWITCHED_OFF = ('raise RuntimeError("mha.numpy.{name} is switched off while this exercise is graded: '
                'it is the exercise, or does its work. Write it yourself.")')
CHECKS_STUB = '''"""The exercises' checks, as a graded worker sees them: the grader runs the real ones."""


class CheckFailed(AssertionError):
    """A wrong answer (raised only by the real checks, outside grading)."""


def _graded_by_the_grader(name):
    def check(fn, *, seed=None):
        print(f"check_{name}: graded by the grader")
    check.__name__ = f"check_{name}"
    return check


'''


# Where an exercise goes without scipy, mha.numpy's one use of it (erf, in gelu) is computed by Python's
# math.erf instead (the same function, to a unit in the last place), keeping the input's float dtype.
ERF_WITHOUT_SCIPY = """
def erf(x):
    import math
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype if x.dtype.kind == 'f' else np.float64)
"""


def without_scipy(tree, module):
    """`tree` with `from scipy.special import erf` replaced by ERF_WITHOUT_SCIPY; any other use of scipy
    is an error here (so that a new one is noticed, not silently broken)."""
    body = []
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        source = node.module if isinstance(node, ast.ImportFrom) else (names[0] if names else "")
        if (source or "").split(".")[0] == "scipy":
            if not (source == "scipy.special" and names == ["erf"]):
                raise ValueError(f"{module} uses scipy beyond scipy.special.erf: teach student_edition.py the rest")
            body.extend(ast.parse(ERF_WITHOUT_SCIPY).body)
            continue
        body.append(node)
    tree.body = body
    return tree


def switched_off(tree, absent):
    """The module `tree` with each top-level function or class named in `absent` replaced by a stub."""
    body = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in absent:
            node = ast.parse(f"def {node.name}(*args, **kwargs):\n    {SWITCHED_OFF.format(name=node.name)}").body[0]
        body.append(node)
    tree.body = body
    return tree


def copy_library(target, absent, packages=()):
    """mha/__init__.py, mha/validate.py, mha/rope_scaling.py and mha/numpy/ into `target`/mha, the `absent` names switched off
    (and scipy's erf replaced, unless `packages` holds scipy)."""
    destination = target / "mha"
    for name in COPIED:
        source = SOURCE / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            destination.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    for module in (destination / "numpy").rglob("*.py"):
        tree = switched_off(ast.parse(module.read_text()), set(absent))
        if "scipy" not in packages:
            tree = without_scipy(tree, module.name)
        module.write_text(ast.unparse(tree) + "\n")


def write_checks_stub(target):
    """mha/checks/__init__.py: every public check_NAME, each only saying that the grader decides."""
    names = [n[len("check_"):] for n in mha.checks.__all__ if n.startswith("check_")]
    lines = [f"check_{n} = _graded_by_the_grader({n!r})" for n in names]
    stub = target / "mha" / "checks" / "__init__.py"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(CHECKS_STUB + "\n".join(lines) + "\n")


def build(target, absent, packages=()):
    """The student edition in `target` (a folder to put on the worker's path), with `absent` switched off."""
    target = Path(target)
    copy_library(target, absent, packages)
    write_checks_stub(target)
    return target
