"""The route each exercise asks for, enforced (issue #38, item 2 and the second test of item 5).

For every exercise with rules (mha.checks.rules): the library's own code, pasted as the answer (its source exec'd
into a namespace, where inspect finds no source), fails with the rule's message, once its answers are right; the
from-scratch solutions of the trap tests and the book's key follow every rule; a helper of the learner's that
breaks a rule is caught. And the grader, which reads the student's cells itself, fails the library's code pasted
into notebooks of chapters 1 and 5 with the same message as the notebook's check."""

import inspect
import io
import json
import linecache
import textwrap
import types
from contextlib import redirect_stdout

import nbformat
import pytest

from conftest import ROOT
from handouts import code_solutions, shared_handout, student_notebook
from learners import own_copy, right_solutions

import mha.checks as checks
import mha.numpy as mnp
from mha.checks.registry import CHECKS
from mha.checks.syntax import broken_rule_of
from tools.grading import grade

RULED = sorted(name for name, check in CHECKS.items() if check.rules and hasattr(mnp, name)
               and CHECKS[name].make_cases.__module__ in {f"mha.checks.ch{n:02d}" for n in range(1, 13)})
BOOK = sorted((ROOT / "book").glob("[01][0-9]_*.ipynb"))[:12]
# The exercises of chapters 13 to 15 with rules (their chapters' helpers wrote them, and their own tests).
LATER_RULED = sorted(name for name, check in CHECKS.items() if check.rules and name not in RULED)


def failure(name, fn, seed=0):
    with redirect_stdout(io.StringIO()), pytest.raises(checks.CheckFailed) as info:
        getattr(checks, f"check_{name}")(fn, seed=seed)
    return str(info.value)


def test_every_exercise_of_chapters_1_to_12_that_asks_for_a_route_has_rules():
    assert RULED == sorted(["softmax", "self_attention", "symmetric_attention", "scaled_dot_product_attention",
                            "head_attention", "multihead_attention_loop", "split_heads", "merge_heads", "causal_mask",
                            "padding_mask", "layer_norm", "attention_at_offset", "chunked_attention", "decoder_block",
                            "sinusoidal_positions", "alibi_bias", "repeat_kv", "apply_rotary", "attend_with_cache"])


@pytest.mark.parametrize("name", sorted(set(RULED) - {"alibi_bias"}))  # alibi_bias: the text asks the library's route
def test_the_librarys_own_code_pasted_as_the_answer_breaks_the_route(name):
    pasted = own_copy(name)
    message = broken_rule_of(name, CHECKS[name].rules, pasted)
    assert message and any(rule.text in message for rule in CHECKS[name].rules), name
    assert message.startswith(f"{name} does not follow the route the exercise asks for: ")


@pytest.mark.parametrize("name", ["softmax", "split_heads", "causal_mask", "attention_at_offset", "repeat_kv"])
def test_the_check_fails_the_librarys_code_with_the_rules_message(name):
    message = failure(name, own_copy(name))
    assert message.startswith(f"{name} does not follow the route the exercise asks for: {CHECKS[name].rules[0].text}")
    assert f"reproduce with check_{name}(" in message


@pytest.mark.parametrize("name", RULED + LATER_RULED)
def test_the_from_scratch_solutions_and_the_key_follow_every_rule(name, tmp_path):
    assert broken_rule_of(name, CHECKS[name].rules, right_solutions()[name]) is None
    key = next(code for path in sorted((ROOT / "book").glob("[01][0-9]_*.ipynb")) for _, code, check in
               code_solutions(path) if f"check_{name}(" in check)
    assert broken_rule_of(name, CHECKS[name].rules, with_source(key, name, tmp_path)) is None


def with_source(code, name, folder):
    """The function `name` of `code`, compiled from a file that inspect can read (as IPython keeps a cell's)."""
    code = "import math\nimport numpy as np\nimport mha.numpy as mnp\n" + code
    path = folder / f"cell_{name}.py"
    path.write_text(code)
    namespace = {"__name__": "__main__"}
    exec(compile(code, str(path), "exec"), namespace)
    return namespace[name]


def test_a_helper_that_breaks_the_rule_is_caught():
    source = textwrap.dedent("""
        def lower_triangle(T):
            return np.tril(np.ones((T, T), dtype=bool))

        def causal_mask(T):
            return lower_triangle(T)
    """)
    namespace = {"np": __import__("numpy")}
    exec(source, namespace)
    message = failure("causal_mask", namespace["causal_mask"])
    assert "`lower_triangle`, a function of yours that causal_mask uses, uses `tril` on line 2" in message


# The grader reads the same rules from the student's cells ---------------------------------------------------------

LIBRARY_PASTED = {"01_weighted_average": ["softmax", "self_attention"],
                  "05_fused_heads_and_masks": ["split_heads", "merge_heads", "causal_mask", "padding_mask"]}


def pasted_cell(name):
    """A cell with the library's source of `name`, and an import of the library's helpers it reads."""
    library = getattr(mnp, name)
    module = inspect.getmodule(library)
    helpers = sorted(n for n in names_read(library.__code__) if n in vars(module) and n != name
                     and not isinstance(vars(module)[n], types.ModuleType))
    modules = sorted(n for n in names_read(library.__code__) if isinstance(vars(module).get(n), types.ModuleType))
    imports = "".join(f"from {module.__name__} import {n}\n" for n in helpers)
    imports += "".join(f"import {vars(module)[n].__name__} as {n}\n" for n in modules)
    return f"{imports}\n\n{textwrap.dedent(inspect.getsource(library))}"


def names_read(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= names_read(const)
    return names


def notebook_message(code, name, seed):
    """The notebook's check on `code` run as IPython runs a cell (its source kept in linecache)."""
    filename = f"<ipython-input-{name}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(code, filename, "exec"), namespace)
    return failure(name, namespace[name], seed)


def test_the_grader_fails_the_librarys_code_pasted_with_the_notebooks_message(tmp_path_factory, tmp_path):
    handout = shared_handout(tmp_path_factory)
    folder = tmp_path / "class"
    folder.mkdir()
    for stem, names in LIBRARY_PASTED.items():
        notebook = student_notebook(handout, f"{stem}.ipynb")
        for stub in [c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])]:
            mine = [n for n in names if f"def {n}(" in stub.source]
            if mine:
                stub.source = "\n\n".join(pasted_cell(n) for n in mine)
        nbformat.write(notebook, folder / f"library_{stem[:2]}.ipynb")
    with redirect_stdout(io.StringIO()):
        grade.main([str(p) for p in sorted(folder.glob("*.ipynb"))] + [
            "--manifest", str(handout / "student" / "exercises.json"), "--out", str(tmp_path / "grades"),
            "--jobs", "2", "--secret", "routes"])
    rows = {r["check"].removeprefix("check_"): r for r in json.loads((tmp_path / "grades" / "grades.json").read_text())}
    for names in LIBRARY_PASTED.values():
        for name in names:
            row = rows[name]
            assert not row["passed"], name
            assert row["message"].startswith(f"{name} does not follow the route the exercise asks for: "), row
            said = notebook_message(pasted_cell(name), name, row["seed"])
            assert said.splitlines()[:-1] == row["message"].splitlines()[:-1], name
