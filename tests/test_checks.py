"""mha.checks: accepts a right solution of the learner's own, rejects every catalogued mistake
with its hint, and reports a crashing or malformed answer plainly (the right solutions written from
scratch, and `unguarded(fn)` for the mistakes: tests/learners.py)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from learners import FROM_SCRATCH, own_copy, right_solutions, unguarded

import mha.checks as checks
import mha.numpy as mn
from mha.checks import ch01, registry
from mha.checks.registry import CHECKS, all_mistakes

NAMES = list(CHECKS)
MISTAKES = all_mistakes()


REQUIRED = {"softmax", "self_attention", "symmetric_attention", "head_attention",
            "scaled_dot_product_attention", "split_heads", "merge_heads", "multihead_attention_loop",
            "multihead_attention", "causal_mask", "padding_mask", "layer_norm", "feed_forward",
            "encoder_block"}


def test_every_required_function_has_a_check():
    assert REQUIRED <= set(NAMES)
    for name in REQUIRED:
        assert callable(getattr(checks, f"check_{name}"))


def test_the_package_exports_exactly_the_registered_checks():
    assert set(checks.__all__) == {f"check_{name}" for name in NAMES} | {"CheckFailed"}
    for name in NAMES:
        check = getattr(checks, f"check_{name}")
        assert (check.__module__, check.__name__) == ("mha.checks", f"check_{name}")


def test_the_registry_refuses_a_mistake_without_cases_and_cases_registered_twice(monkeypatch):
    monkeypatch.setattr(registry, "CHECKS", {})
    with pytest.raises(LookupError, match=r"no cases are registered for softmax: .*@cases_for\('softmax'\)"):
        registry.mistake("softmax", "a hint")(lambda x, axis=-1: x)
    with pytest.raises(LookupError, match="no cases are registered for softmax"):
        registry.make_check("softmax")
    with pytest.raises(LookupError, match="no cases are registered for softmax"):
        registry.random_cases_for("softmax")(ch01.softmax_random_cases)
    registry.cases_for("softmax")(ch01.softmax_cases)
    with pytest.raises(LookupError, match=r"no random cases .*@random_cases_for\('softmax'\)"):
        registry.make_check("softmax")

    def elsewhere():  # cases of the same name from another module
        return []
    with pytest.raises(ValueError, match="the cases of softmax are already registered in mha.checks.ch01"):
        registry.cases_for("softmax")(elsewhere)


MODULES = ["mha.checks"] + [f"mha.checks.{p.stem}" for p in sorted(Path(checks.__file__).parent.glob("*.py"))
                            if p.stem != "__init__"]


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    """No import circle: every module works when it is the first one imported."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", NAMES)
def test_handing_in_the_reference_itself_is_refused(name):
    with pytest.raises(checks.CheckFailed, match=f"this is mha's own {name}, not yours: write it yourself"):
        getattr(checks, f"check_{name}")(getattr(mn, name))


@pytest.mark.parametrize("name", NAMES)
def test_check_passes_a_right_solution_quietly(name, capsys):
    """One line, counting the named cases only: the notebooks store it, the random cases come on top."""
    assert sorted(right_solutions()) == sorted(NAMES)
    result = getattr(checks, f"check_{name}")(right_solutions()[name])
    assert result is None
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [f"check_{name}: all {len(CHECKS[name].named_cases(0))} cases passed."]


def test_a_copy_of_the_librarys_code_passes_unless_it_calls_what_the_exercise_forbids(capsys):
    """The library's kv_cache_bytes calls nothing its exercise forbids, which asks for no route of its own: a copy
    passes. Its softmax divides by the sum where the exercise goes through logarithms: a copy breaks that route
    (tests/test_checks_routes_syntax.py). Its head_attention calls its scaled_dot_product_attention, which the
    exercise forbids: a copy is refused, and the message names it."""
    checks.check_kv_cache_bytes(own_copy("kv_cache_bytes"))
    assert capsys.readouterr().out.startswith("check_kv_cache_bytes: all ")
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_head_attention(own_copy("head_attention"))
    assert str(info.value).startswith("head_attention calls mha's own scaled_dot_product_attention, which does this "
                                      "exercise's work: write it yourself, using only NumPy (np.einsum) and "
                                      "mnp.masked_softmax\n  on the case ")


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_a_right_solution_written_from_scratch_passes_whatever_the_seed(name, capsys):
    """Chapter 12's solutions share no code with the library (and keep the inputs' float dtype)."""
    for seed in (None, 0, 1, 2):
        getattr(checks, f"check_{name}")(FROM_SCRATCH[name], seed=seed)
    assert capsys.readouterr().out.count(f"check_{name}: all ") == 4


def test_the_catalogue_is_large_and_covers_every_check():
    assert len(MISTAKES) >= 25
    assert {m.name for m in MISTAKES} == set(NAMES), "every check has at least one catalogued mistake"


@pytest.mark.parametrize("name", NAMES)
def test_every_catalogued_mistake_has_a_hint_of_its_own(name):
    hints = [m.hint for m in CHECKS[name].mistakes]
    assert all(len(h.split()) >= 5 for h in hints), "a hint says what to do, in a sentence"
    assert len(set(hints)) == len(hints), "two mistakes of one check with the same hint could not be told apart"


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.fn.__name__ for m in MISTAKES])
def test_check_rejects_the_mistake_and_names_it(mistake):
    with pytest.raises(checks.CheckFailed) as info:
        getattr(checks, f"check_{mistake.name}")(unguarded(mistake.fn))
    message = str(info.value)
    assert isinstance(info.value, AssertionError)
    assert f"hint: {mistake.hint}" in message
    assert "input:" in message and "case" in message


def wrong_dtype_causal(T):
    return np.tril(np.ones((T, T), dtype=int))


def float32_softmax_sloppy(x, axis=-1):
    x = np.asarray(x, dtype=np.float16)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def weights_transposed(Q, K, V, mask=None):
    out, w = own_copy("scaled_dot_product_attention")(Q, K, V, mask)
    return out, np.swapaxes(w, -1, -2)


def only_first_head(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    out, w = unguarded(own_copy("multihead_attention"))(X, W_q, W_k, W_v, W_o, n_heads, **kw)
    return out, w[..., :1, :, :]


def ignores_mask(X, W_q, W_k, W_v, W_o, n_heads, mask=None, **kw):
    return unguarded(own_copy("multihead_attention"))(X, W_q, W_k, W_v, W_o, n_heads, **kw)


@pytest.mark.parametrize("name,fn,expected", [
    ("causal_mask", wrong_dtype_causal, "expected a boolean array, got dtype int64"),
    ("softmax", float32_softmax_sloppy, "expected dtype float64, got float16"),
    ("scaled_dot_product_attention", weights_transposed, "weights: expected shape (4, 5)"),
    ("multihead_attention", only_first_head, "expected shape (3, 2, 5, 5)"),
    ("multihead_attention", ignores_mask, "case 'a batch with padding'"),
])
def test_more_wrong_answers_without_a_named_hint_are_rejected(name, fn, expected):
    with pytest.raises(checks.CheckFailed) as info:
        getattr(checks, f"check_{name}")(fn)
    assert expected in str(info.value)


def test_a_crash_is_reported_with_the_input_not_a_traceback():
    def crashes(X, exclude_self=False):
        return X @ X  # (T, d) @ (T, d) fails
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_self_attention(crashes)
    message = str(info.value)
    assert message.startswith("self_attention raised ValueError")
    assert "on the case 'one sequence' (X: shape (4, 3) float64)" in message
    assert "check_self_attention(crashes, seed=" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_stub_says_it_is_not_written_yet():
    def stub(x, axis=-1):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="softmax is not written yet"):
        checks.check_softmax(stub)


@pytest.mark.parametrize("answer,expected", [
    (lambda X, exclude_self=False: X, "expected a tuple (out, weights), got ndarray"),
    (lambda X, exclude_self=False: (X,), "expected a tuple of 2 (out, weights), got a tuple of length 1"),
    (lambda X, exclude_self=False: None, "expected a tuple (out, weights), got NoneType"),
    (lambda X, exclude_self=False: (own_copy("self_attention")(X)[0], "weights"), "weights: expected shape (4, 4)"),
])
def test_wrong_return_types_are_named(answer, expected):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_self_attention(answer)
    assert expected in str(info.value)


def test_check_needs_a_function():
    with pytest.raises(checks.CheckFailed, match="needs a function, got int"):
        checks.check_softmax(3)


def test_the_learner_cannot_change_the_reference_inputs():
    softmax = right_solutions()["softmax"]  # the route of the text: the library's own code breaks its rule

    def mutates(x, axis=-1):
        x *= 0  # in place, on the check's copy
        return softmax(x, axis)
    with pytest.raises(checks.CheckFailed):
        checks.check_softmax(mutates, seed=1)
    checks.check_softmax(softmax, seed=1)  # the cases themselves are untouched
