"""Solutions as learners write them, for the tests of `mha.checks`.

`own_copy(name)` is a right solution that is the learner's own: the library's source
for `mha.numpy.<name>`, compiled again in a module of the learner's (as if copied into
a notebook cell), so that it is another function with the same answers. The recorders
and replays are wrong solutions that remember what an earlier check asked and answered.
`FROM_SCRATCH` holds right solutions of chapter 12 that share no code with the library;
`right_solutions()` gathers one for every check. `unguarded(fn)` runs a catalogued mistake
as a learner who wrote it by hand would.
"""

import inspect
import io
import json
import re
import sys
import textwrap
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import numpy as np

import mha.numpy as mn


def own_copy(name):
    """mha.numpy.<name>, its source compiled again outside mha: right answers, the learner's own code."""
    library = getattr(mn, name)
    namespace = dict(vars(sys.modules[library.__module__]), __name__="learner")
    exec(compile(textwrap.dedent(inspect.getsource(library)), "<learner>", "exec"), namespace)
    return namespace[name]


def recording(solve):
    """`solve` made to write down every (inputs, answer) it gives, in call order: (recorder, calls)."""
    calls = []

    def recorder(*args, **kwargs):
        try:
            answer = solve(*args, **kwargs)
        except ValueError as error:  # a case that must raise: the error is the answer, replayed as such
            calls.append(((args, kwargs), error))
            raise
        calls.append(((args, kwargs), answer))
        return answer
    recorder.__wrapped__ = solve  # the route a check reads (mha.checks.syntax unwraps) is the solution's, not this
    return recorder, calls


def given_back(answer):
    """A recorded answer, as the solution gave it: returned, or raised again."""
    if isinstance(answer, Exception):
        raise answer
    return answer


def replay_in_order(calls):
    """A solution that gives back the recorded answers one after another, whatever it is asked."""
    answers = iter([answer for _, answer in calls])

    def replay(*args, **kwargs):
        return given_back(next(answers))
    return replay


def replay_by_input(calls):
    """A solution that looks the inputs up among the recorded ones, and answers zeros when they are new."""
    def replay(*args, **kwargs):
        for (seen_args, seen_kwargs), answer in calls:
            if same_inputs((seen_args, seen_kwargs), (args, kwargs)):
                return given_back(answer)
        return np.zeros(1)
    return replay


def same_inputs(a, b):
    """True when two nests of arrays, numbers and None are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_inputs(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_inputs(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


# Chapter 12 from scratch: right solutions that share no code with the library ---------


def repeat_kv(x, n_rep):
    return np.repeat(x, n_rep, axis=-3)  # (..., h_kv * n_rep, T, d): head j is head j // n_rep


def apply_rotary(x, cos, sin):
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)  # float32 stays float32, whatever the tables
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]  # (..., T, d/2) each
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def kv_cache_bytes(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    return 2 * n_layers * n_kv_heads * d_head * T * batch * bytes_per_value  # keys and values


def attend_with_cache(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None, rope_base=None):
    return cached_attention(q, k, v, past_keys, past_values, causal, mask, rope_base)


def cached_attention(q, k, v, past_keys, past_values, causal, mask, rope_base, *, offset=True, shifted=True):
    """One step of generation as a learner writes it, in the inputs' dtype (the rotary tables in float32 for
    float32 inputs, as the text asks): right with the defaults; offset=False turns the new tokens as if they
    were at positions 0 .., shifted=False builds the causal mask as if the cache were empty."""
    T_past = 0 if past_keys is None else past_keys.shape[-2]
    T_new, d = q.shape[-2:]
    if rope_base is not None:
        real = q.dtype.type  # np.float64 or np.float32: the tables' numbers
        first = T_past if offset else 0
        frequencies = 1.0 / (real(rope_base) ** (np.arange(0, d, 2, dtype=q.dtype) / real(d)))  # (d/2,)
        angles = np.arange(first, first + T_new, dtype=q.dtype)[:, None] * frequencies  # (T_new, d/2)
        angles = np.concatenate([angles, angles], axis=-1)  # (T_new, d)
        q, k = (apply_rotary(a, np.cos(angles), np.sin(angles)) for a in (q, k))
    keys = k if past_keys is None else np.concatenate([past_keys, k], axis=-2)  # (..., h_kv, T_total, d)
    values = v if past_values is None else np.concatenate([past_values, v], axis=-2)
    if causal:
        allowed = np.arange(keys.shape[-2]) <= np.arange(T_new)[:, None] + (T_past if shifted else 0)
        mask = allowed if mask is None else mask & allowed  # (T_new, T_total)
    n_rep = q.shape[-3] // keys.shape[-3]
    K, V = repeat_kv(keys, n_rep), repeat_kv(values, n_rep)  # (..., h, T_total, d)
    scores = q @ np.swapaxes(K, -1, -2) / d ** 0.5  # a Python float: float32 stays float32
    scores = scores if mask is None else np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ V, weights, keys, values


FROM_SCRATCH = {f.__name__: f for f in (repeat_kv, apply_rotary, attend_with_cache, kv_cache_bytes)}


# The trap tests' common parts (tests/test_checks_traps_ch01_06.py and _ch07_12.py) ----------------------

SEEDS = range(10)


def run(name, fn, seed):
    """check_<name>(fn, seed=seed); the line it printed (its confirmation)."""
    import mha.checks as checks
    printed = io.StringIO()
    with redirect_stdout(printed):
        getattr(checks, f"check_{name}")(fn, seed=seed)
    return printed.getvalue().strip()


def hint_of(message):
    """The hint of a failure message ("" when it has none)."""
    return message.split("\n  hint: ")[1].split("\n")[0] if "\n  hint: " in message else ""


def assert_trap_fails_on_its_case(name, fn, hint, case, failures=None):
    """A learner's wrong `fn` fails check_<name> on every seed, always on the named case `case`, the first
    failure with a hint holding `hint`. `failures(name, fn)`: the messages (failures_on_every_seed by default)."""
    messages = (failures or failures_on_every_seed)(name, fn)
    assert hint in hint_of(messages[0]), messages[0]
    for message in messages:
        assert f"on the case '{case}" in message, message


def failures_on_every_seed(name, fn, seeds=SEEDS):
    """The messages of check_<name>(fn) on `seeds`; fails the test if any seed lets fn pass."""
    import pytest

    import mha.checks as checks
    messages = []
    for seed in seeds:
        with pytest.raises(checks.CheckFailed) as info:
            run(name, fn, seed)
        messages.append(str(info.value))
    return messages


def labelled(name, words, seed=0):
    """The named case of check_<name> (drawn with `seed`) whose label holds `words`."""
    from mha.checks.registry import CHECKS
    return next(case for case in CHECKS[name].named_cases(seed) if words in case.label)


def all_cases(name, seeds=SEEDS):
    """The named cases of every seed, then the random ones of every seed."""
    import numpy as np

    from mha.checks.registry import CHECKS
    check = CHECKS[name]
    named = [case for seed in seeds for case in check.named_cases(seed)]
    return named + [case for seed in seeds for case in check.make_random_cases(np.random.default_rng(seed))]


def torch_twin(name):
    """mha.torch's twin of the exercise's function, called with the check's NumPy arrays as tensors: a route
    that every check of a NumPy exercise must refuse."""
    import numpy as np
    import torch

    import mha.torch as mt

    def with_torch(*args, **kwargs):
        as_tensors = [torch.from_numpy(np.asarray(a)) if isinstance(a, np.ndarray) else a for a in args]
        return getattr(mt, name)(*as_tensors, **kwargs)
    return with_torch


class ThisIsTheExercise(Exception):
    """What a function of the student edition raises when the exercise forbids it."""


@contextmanager
def student_edition(name, monkeypatch):
    """mha as the worker that grades exercise `name` has it: every name of the check's `absent()` raises,
    in every module of both faces (so a library function that called one of them would break too), and
    torch cannot be imported."""
    from mha.checks.registry import CHECKS

    def switched_off(*args, **kwargs):
        raise ThisIsTheExercise(f"this is the exercise {name}")
    for module_name, module in list(sys.modules.items()):
        if module is not None and module_name.split(".")[:2] in (["mha", "numpy"], ["mha", "torch"]):
            for absent in CHECKS[name].absent():
                if absent in vars(module):
                    monkeypatch.setattr(module, absent, switched_off)
    monkeypatch.setitem(sys.modules, "torch", None)
    yield


BOOK = Path(__file__).resolve().parent.parent / "book"


def exercise_texts(chapter):
    """The text of each checked exercise of book/<chapter>_*.ipynb, by the check's name ({} when the
    chapter is not written yet)."""
    found = sorted(BOOK.glob(f"{chapter:02d}_*.ipynb"))
    if not found:
        return {}
    notebook = json.loads(found[0].read_text())
    texts = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"]
    return {re.search(r"checked by `check_(\w+)`", t).group(1): t for t in texts
            if ":::{exercise}" in t and "checked by `check_" in t}


# Shared by the tests of the checks and of the grader (tests/test_checks*.py, test_model_checks.py,
# test_grading_agreement.py) ------------------------------------------------------------------------------

def right_solutions():
    """{name: a right solution written from scratch, calling nothing that the exercise forbids}, for every check:
    the ones of the trap tests of each chapter (tests/solutions_ch*.py)."""
    import solutions_ch01_06
    import solutions_ch07_12
    import solutions_ch13
    import solutions_ch14
    import solutions_ch15
    import solutions_ch16
    import solutions_ch17
    import solutions_ch18

    from mha.checks.registry import CHECKS
    found = {**solutions_ch01_06.FROM_SCRATCH, **solutions_ch07_12.FROM_SCRATCH, **solutions_ch13.FROM_SCRATCH}
    found.update({f.__name__: f for f in solutions_ch14.FROM_SCRATCH if f.__name__ in CHECKS})
    found.update({f.__name__: f for f in solutions_ch15.FROM_SCRATCH if f.__name__ in CHECKS})
    found.update({f.__name__: f for f in solutions_ch16.FROM_SCRATCH if f.__name__ in CHECKS})
    found.update({f.__name__: f for f in solutions_ch17.FROM_SCRATCH if f.__name__ in CHECKS})
    found.update({f.__name__: f for f in solutions_ch18.FROM_SCRATCH if f.__name__ in CHECKS})
    return found


def unguarded(fn):
    """`fn`, run where the check's guard does not look (its profile function set aside while fn runs). The
    catalogued mistakes are written with the library's functions, which the guard refuses to a learner: this
    gives their wrong answers as a learner who wrote them by hand would."""
    def call(*args, **kwargs):
        previous = sys.getprofile()
        sys.setprofile(None)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(previous)
    call.__name__ = fn.__name__
    return call
