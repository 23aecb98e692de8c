"""The notebook's check and the grader give the same verdict (issue #36, part 5).

For every exercise with a check (chapters 1 to 15), the same solutions are judged twice: in this process by
`check_NAME(fn, seed=S)`, as a learner's kernel runs it, and by tools/grading/grade.py, which runs the function in a
sandboxed worker with the student edition of mha. S is the seed that the grader drew for that notebook and
check, so both judge the same cases. The solutions: the book's key; a solution written from scratch (the trap
tests'); and the library's routes to the answer, a solution that is just a call of a forbidden function (with the
right arguments where the issue named the route, else with the case's own arguments). Few notebooks are graded,
each holding one solution per exercise of its chapter: a worker costs about a second.
"""

import inspect
import io
import json
import sys
import textwrap
import types
from contextlib import redirect_stdout

import nbformat
import pytest

from conftest import ROOT
from handouts import SHORT_LIMITS, key_codes, shared_handout, student_notebook
from learners import right_solutions

from tools.grading import grade

import mha.checks as checks
from mha.checks.registry import CHECKS

BOOK = sorted((ROOT / "book").glob("[01][0-9]_*.ipynb"))
GRADER_GAPS = {}  # chapters the grader cannot grade (none: chapter 10's dtype=np.float32 crosses since wire.py sends dtypes)
HEADER = "import math\n\nimport numpy as np\n\nimport mha.numpy as mnp\n"

# Routes with the right arguments: the ones the issue names, and the trap tests' own.
NAMED_ROUTES = {
    "apply_temperature": "return mnp.filter_logits(logits, temperature=temperature)",
    "top_k_filter": "return mnp.filter_logits(logits, top_k=k)",
    "top_p_filter": "return mnp.filter_logits(logits, top_p=p)",
    "swiglu": "return mnp.gated_feed_forward(X, W_gate, W_up, W_down, activation='silu')",
    "sliding_window_mask": "return mnp.causal_mask_after(T, 0, window=window)",
    "all_reduce_bytes": ("return mnp.wire_bytes({'forward': {'all_reduce': n_elements}}, world_size, "
                         "bytes_per_element)['forward']['all_reduce']"),
    "rms_norm": ("d = X.shape[-1]\n    scale = 1 + weight if unit_offset else weight\n"
                 "    both = mnp.layer_norm(np.concatenate([X, -X], axis=-1), np.concatenate([scale, scale]), None, eps)"
                 "\n    return both[..., :d]"),
    "merge_partials": ("q = np.ones(lse_a.shape + (1, 1), dtype=lse_a.dtype)\n"
                       "    k = np.stack([lse_a, lse_b], axis=-1)[..., None]\n"
                       "    keep = np.isfinite(k[..., 0])[..., None, :]\n"
                       "    out, lse = mnp.attention_partial(q, np.where(np.isfinite(k), k, 0), "
                       "np.stack([out_a, out_b], axis=-2), keep)\n    return out[..., 0, :], lse[..., 0]"),
    "causal_mask": "return mnp.sliding_window_mask(T, T)",
    "loss_to_bits_per_character": ("from mha.text import bits_per_character\n"
                                   "    return bits_per_character(mean_loss * n_tokens, n_characters)"),
    "generate_greedy": ("def cropped(tokens):\n        return logits_fn(tokens if max_len is None else "
                        "tokens[..., -max_len:])\n    return mnp.generate(cropped, prompt, n_new, top_k=1)"),
    "absorbed_latent_decode": "return mnp.expanded_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale)",
    "sink_softmax": ("column = np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))\n"
                     "    return mnp.softmax(np.concatenate([scores, column], axis=-1))[..., :-1]"),
    "select_top_k_keys": ("allowed = np.ones(scores.shape, bool) if mask is None else np.broadcast_to(mask, scores.shape)"
                          "\n    _, chosen = mnp.route_tokens(np.where(allowed, scores, -1e300), min(k, scores.shape[-1]))"
                          "\n    picked = np.zeros(scores.shape, dtype=bool)\n"
                          "    np.put_along_axis(picked, chosen, True, axis=-1)\n    return picked & allowed"),
    "route_tokens": ("return mnp.route_tokens_in_groups(logits, top_k, n_groups=1, top_groups=1, scoring=scoring, "
                     "normalize=normalize, bias=bias)"),
    "linear_attention_step": ("return mnp.gated_delta_step(state, q, k, v + (k[..., None, :] @ state)[..., 0, :], "
                              "None, np.ones(k.shape[:-1], dtype=k.dtype))"),
    "gated_delta_update": "return mnp.gated_delta_step(state, k, k, v, g, beta)[1]",
    "gated_delta_chunk": "return mnp.gated_delta_rule_recurrent(q, k, v, g, beta, scale=1.0, initial_state=state)",
}


def chapters(gaps=False):
    """{notebook path: [check names]} for the chapters with checks (those the grader cannot grade yet, or only
    those with gaps=True)."""
    found = {}
    for path in BOOK:
        if (path.stem in GRADER_GAPS) != gaps:
            continue
        sources = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        names = [n for n in CHECKS if any(f"check_{n}({n})" in s for s in sources)]
        if names:
            found[path] = names
    return found


def names_used(code):
    """The global names that a code object (and the functions inside it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= names_used(const)
    return names


def source_of(fn, name):
    """Source that defines `name` as `fn` does, in a cell of its own: fn's module-level helpers and constants
    too (the trap tests' solutions share helpers), the imports it needs, and `name = fn` if named otherwise."""
    module = sys.modules[fn.__module__]
    if "<locals>" in fn.__qualname__:  # made by a function of the module (decoder_block_with(...))
        maker = vars(module)[fn.__qualname__.split(".")[0]]
        return source_of(maker, maker.__name__) + f"\n\n{name} = {maker.__name__}(mnp.multihead_attention)\n"
    parts, seen = [], set()

    def add(f):
        seen.add(f.__name__)
        for used in sorted(names_used(f.__code__) - seen):
            value = vars(module).get(used)
            if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
                add(value)
            elif isinstance(value, (tuple, str, int, float)) and not used.startswith("__"):
                seen.add(used)
                parts.append(f"{used} = {value!r}")
        parts.append(textwrap.dedent(inspect.getsource(f)))
    add(fn)
    header = HEADER + ("from scipy.special import erf\n" if "erf" in seen or "erf" in names_used(fn.__code__) else "")
    return header + "\n\n" + "\n\n".join(parts) + (f"\n\n{name} = {fn.__name__}\n" if fn.__name__ != name else "")


def signature_of(name):
    """The parameters of mha.numpy.<name>, as source (a NumPy dtype default written np.float64)."""
    import mha.numpy as mnp
    shown = []
    for p in inspect.signature(getattr(mnp, name)).parameters.values():
        default = p.default
        text = f"np.{default.__name__}" if isinstance(default, type) else repr(default)
        shown.append(p.name if default is p.empty else f"{p.name}={text}")
    keyword_only = [p.name for p in inspect.signature(getattr(mnp, name)).parameters.values() if p.kind == p.KEYWORD_ONLY]
    if keyword_only:
        first = next(i for i, text in enumerate(shown) if text.split("=")[0] == keyword_only[0])
        shown.insert(first, "*")
    return "(" + ", ".join(shown) + ")"


def route_source(name, body):
    """A solution of `name` that is a call of a forbidden library function."""
    return f"{HEADER}\n\ndef {name}{signature_of(name)}:\n    {body}\n"


def routes(name):
    """Sources of solutions of `name` that call a forbidden function: the named route, and a call of the first
    forbidden function with the case's own arguments (refused whatever they are)."""
    import mha.numpy as mnp
    found = [route_source(name, NAMED_ROUTES[name])] if name in NAMED_ROUTES else []
    forbidden = next((f for f in CHECKS[name].forbids if "." not in f), None)  # of mnp (a dotted one: NAMED_ROUTES)
    if forbidden is not None:
        parameters = inspect.signature(getattr(mnp, name)).parameters.values()
        passed = ", ".join(p.name if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else f"{p.name}={p.name}"
                           for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        found.append(route_source(name, f"return mnp.{forbidden}({passed})"))
    return found


def submission(handout, path, solutions):
    """The handout's notebook of chapter `path` with each stub replaced: by `solutions[name]` for the functions it
    defines that have one, else by the key's cell."""
    notebook = student_notebook(handout, path)
    stubs = [c for c in notebook.cells if "exercise-stub" in c.metadata.get("tags", [])]
    for stub, key in zip(stubs, key_codes(path), strict=True):
        mine = [solutions[n] for n in CHECKS if f"def {n}(" in stub.source and n in solutions]
        stub.source = "\n\n".join(mine) if mine else key
    return notebook


def variants(gaps=False):
    """[(student, chapter path, {check: source})]: the key, from scratch, and the routes, one notebook each."""
    scratch = right_solutions()
    found = []
    for path, names in chapters(gaps).items():
        stem = path.stem[:2]
        found.append((f"key_{stem}", path, {}))
        found.append((f"scratch_{stem}", path, {n: source_of(scratch[n], n) for n in names}))
        by_name = {n: routes(n) for n in names}
        for k in range(max(len(r) for r in by_name.values())):
            chosen = {n: r[k] for n, r in by_name.items() if k < len(r)}
            found.append((f"route{k}_{stem}", path, chosen))
    return found


def notebook_verdict(notebook, name, seed):
    """(passed, message) of check_<name> in this process on the notebook's function, with the grader's seed: the
    notebook's code up to the function, run as a learner's kernel runs it (in a module named __main__)."""
    from tools.grading.notebook_slice import code_binding
    namespace = {"__name__": "__main__"}
    with redirect_stdout(io.StringIO()):
        exec("\n".join(code for _, code in code_binding(notebook.cells, {name})), namespace)
        try:
            getattr(checks, f"check_{name}")(namespace[name], seed=seed)
            return True, ""
        except checks.CheckFailed as error:
            return False, str(error)


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    """The handout that the test files of this run share (tests/handouts.py): read only."""
    return shared_handout(tmp_path_factory)


def grade_variants(handout, base, gaps=False):
    """Every variant graded in one grade.py run, under the short limits of the attack tests: {(student, check): row},
    and the notebooks."""
    folder = base / "class"
    folder.mkdir()
    notebooks = {}
    for student, path, solutions in variants(gaps):
        notebooks[student] = submission(handout, path, solutions)
        nbformat.write(notebooks[student], folder / f"{student}.ipynb")
    with redirect_stdout(io.StringIO()):
        grade.main([str(p) for p in sorted(folder.glob("*.ipynb"))] + [
            "--manifest", str(handout / "student" / "exercises.json"), "--out", str(base / "grades"),
            "--jobs", "2", *SHORT_LIMITS, "--secret", "agreement"])
    rows = json.loads((base / "grades" / "grades.json").read_text())
    return {(r["student"], r["check"].removeprefix("check_")): r for r in rows}, notebooks


@pytest.fixture(scope="module")
def graded(handout, tmp_path_factory):
    return grade_variants(handout, tmp_path_factory.mktemp("agreement"))


def disagreements(rows, notebooks):
    """What the notebook's check and the grader judge differently, in words."""
    found = []
    for (student, name), row in sorted(rows.items()):
        if not name:  # the grader could not grade the notebook at all
            found.append(f"{student}: {row['message'][:300]}")
            continue
        passed, message = notebook_verdict(notebooks[student], name, row["seed"])
        if passed != row["passed"]:
            found.append(f"{student} {name}: notebook {passed} ({message[:300]}), grader {row['passed']} "
                         f"({row['message'][:300]})")
    return found


def test_every_exercise_with_a_check_is_graded_in_every_variant(graded):
    rows, notebooks = graded
    names = {n for names in chapters().values() for n in names}
    assert names | {n for names in chapters(gaps=True).values() for n in names} == set(CHECKS), \
        "every check of chapters 1 to 15 is in the book"
    for kind in ("key", "scratch"):
        assert {n for (s, n) in rows if s.startswith(kind)} == names, kind
    routed = {(student, n) for student, _, solutions in variants() if student.startswith("route") for n in solutions}
    assert {n for _, n in routed} == {n for n in names if CHECKS[n].forbids} and routed <= set(rows)


def test_the_notebooks_check_and_the_grader_agree_on_every_solution(graded):
    found = disagreements(*graded)
    assert not found, "\n".join(found)


def test_the_key_and_the_solutions_from_scratch_pass_and_every_route_fails(graded):
    """Under the grading tests' short limits; the keys of every chapter, chapter 11's function-as-data included."""
    rows, _ = graded
    routed = {(student, n) for student, _, solutions in variants() if student.startswith("route") for n in solutions}
    for (student, name), row in rows.items():
        if (student, name) in routed:
            assert not row["passed"], (student, name)
        else:  # the key, from scratch, or the key beside another exercise's route
            assert row["passed"], (student, name, row["message"])
