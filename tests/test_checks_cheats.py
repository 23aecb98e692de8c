"""mha.checks cannot be fooled: fresh random cases on every call (with the seed to repeat them),
a reference that the learner cannot touch, and a solution that must be the learner's own."""

import io
import re
import subprocess
import sys
import types
from contextlib import redirect_stdout

import numpy as np
import pytest
from learners import own_copy, recorded, replay_by_input, replay_in_order, same_inputs

import mha.checks as checks
import mha.numpy as mn
import mha.numpy.attention
import mha.torch as mt
from mha.checks.own_work import RefusedCall, Refusing
from mha.checks.registry import CHECKS, all_mistakes

NAMES = list(CHECKS)


def check(name):
    return getattr(checks, f"check_{name}")


def quietly(run, *args, **kwargs):
    """run(*args, **kwargs) with its printed line swallowed."""
    with redirect_stdout(io.StringIO()):
        return run(*args, **kwargs)


def failure(name, fn, **kwargs):
    """The message of the CheckFailed that check_<name>(fn) raises."""
    with pytest.raises(checks.CheckFailed) as info:
        quietly(check(name), fn, **kwargs)
    return str(info.value)


# Seeds: fresh random cases on every call, and the seed to draw them again -------------


def inputs_of_a_run(name, seed=None):
    """The (args, kwargs) that check_<name> gives a right solution, in order, and how many are named."""
    solve, calls = recorded(name)
    quietly(check(name), solve, seed=seed)
    return [inputs for inputs, _ in calls], len(CHECKS[name].make_cases())


@pytest.mark.parametrize("name", NAMES)
def test_each_call_draws_new_random_cases_and_a_seed_draws_them_again(name):
    (first, named), (second, _) = inputs_of_a_run(name), inputs_of_a_run(name)
    assert same_inputs(first[:named], second[:named]), "the named cases stay"
    assert not same_inputs(first[named:], second[named:]), "the random cases change from call to call"
    assert same_inputs(inputs_of_a_run(name, seed=7), inputs_of_a_run(name, seed=7))


@pytest.mark.parametrize("name", NAMES)
def test_a_solution_that_replays_answers_in_call_order_fails(name):
    solve, calls = recorded(name)
    quietly(check(name), solve)
    message = failure(name, replay_in_order(calls))
    assert "random: " in message, "the named cases come back in the same order; the random ones do not"


@pytest.mark.parametrize("name", NAMES)
def test_a_solution_that_looks_up_recorded_inputs_fails(name):
    solve, calls = recorded(name)
    for seed in (1, 2, 3):
        quietly(check(name), solve, seed=seed)
    assert "random: " in failure(name, replay_by_input(calls), seed=4)


def test_a_failure_names_its_seed_and_the_seed_repeats_it():
    def rows_only(x, axis=-1):  # right for the named cases, wrong on a 4-D array and on other axes
        return own_copy("softmax")(x, axis) if np.ndim(x) < 4 else np.zeros_like(x)
    message = failure("softmax", rows_only)
    seed = int(re.search(r"seed (\d+) drew the random cases", message).group(1))
    assert message.endswith(f"reproduce with check_softmax(rows_only, seed={seed})")
    assert failure("softmax", rows_only, seed=seed) == message


@pytest.mark.parametrize("name", NAMES)
def test_the_random_cases_hold_float32_and_4_d_arrays(name):
    """Whatever the seed: float32 and arrays of 4 dimensions or more. Exceptions: the masks, the
    cache's size and the sinusoidal table take sizes only; ALiBi's bias takes the slopes (h,), so
    its arrays are 1-D (float32 all the same); the greedy generation loop takes token ids (integers)."""
    sizes_only = ("causal_mask", "padding_mask", "kv_cache_bytes", "sinusoidal_positions", "generate_greedy",
                  "sliding_window_mask", "loss_to_bits_per_character", "all_reduce_bytes")
    for seed in range(5):
        arrays = [a for case in CHECKS[name].make_random_cases(np.random.default_rng(seed))
                  for a in arrays_in((case.args, case.kwargs))]
        if name not in sizes_only:
            assert any(a.dtype == np.float32 for a in arrays), name
            if name != "alibi_bias":
                assert any(a.ndim >= 4 for a in arrays), name


def arrays_in(value):
    """The arrays in a nest of tuples, lists and dicts."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [a for v in value for a in arrays_in(v)] if isinstance(value, (list, tuple)) else []


# A reference the learner cannot touch ------------------------------------------------


@pytest.mark.parametrize("mistake", all_mistakes(), ids=[m.fn.__name__ for m in all_mistakes()])
def test_reassigning_the_library_function_changes_nothing(mistake, monkeypatch):
    monkeypatch.setattr(mn, mistake.name, mistake.fn)  # as `mha.numpy.softmax = my_softmax`
    assert f"hint: {mistake.hint}" in failure(mistake.name, mistake.fn)


def test_reassigning_what_the_reference_calls_inside_changes_nothing(monkeypatch):
    def wrong_sdpa(Q, K, V, mask=None):
        return np.zeros(1), np.zeros(1)
    solve = own_copy("multihead_attention")  # copied before the library is changed under it
    monkeypatch.setattr(mha.numpy.attention, "scaled_dot_product_attention", wrong_sdpa)
    monkeypatch.setattr(mha.numpy.attention, "softmax", lambda x, axis=-1: x)
    quietly(checks.check_multihead_attention, solve)
    assert mha.numpy.attention.scaled_dot_product_attention is wrong_sdpa, "the learner's change is put back"


def test_a_function_reassigned_before_mha_checks_is_imported_is_found_again_in_its_module():
    code = ("import mha.numpy as mnp; mnp.softmax = lambda x, axis=-1: x; "
            "from mha.checks.reference import NUMPY; print(NUMPY.softmax.__module__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.strip() == "mha.numpy.attention", run.stderr


# A solution must be the learner's own ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_solution_that_calls_the_library_function_is_refused_with_a_hint(name):
    def calls_the_library(*args, **kwargs):
        return getattr(mn, name)(*args, **kwargs)
    message = failure(name, calls_the_library)
    assert f"calls mha's own {name}" in message
    assert f"write it yourself, using only {CHECKS[name].may_use}" in message




def test_a_renamed_import_a_reloaded_copy_a_module_path_and_a_swallowed_refusal_are_refused_too():
    library_softmax = mha.numpy.attention.softmax  # as `from mha.numpy.attention import softmax as ...`
    reloaded = types.FunctionType(mn.softmax.__code__.replace(), vars(mha.numpy.attention))  # as importlib.reload

    def renamed(x, axis=-1):
        return library_softmax(x, axis)

    def from_a_reload(x, axis=-1):
        return reloaded(x, axis)

    def hides_it(x, axis=-1):
        try:
            return mha.numpy.attention.softmax(x, axis)
        except Exception:
            return own_copy("softmax")(x, axis)
    for cheat in (renamed, from_a_reload, hides_it):
        assert "write it yourself" in failure("softmax", cheat)


def test_the_torch_twin_is_refused():
    def with_torch(Q, K, V, mask=None, chunk=256):
        import torch
        return mt.chunked_attention(*(torch.from_numpy(np.asarray(a)) for a in (Q, K, V)), chunk=chunk).numpy()
    assert "calls mha's own chunked_attention" in failure("chunked_attention", with_torch)


def test_other_library_functions_stay_allowed_and_may_use_the_refused_one_inside():
    scores = np.random.default_rng(0).standard_normal((3, 4))
    with Refusing("softmax", mn.softmax) as guard:
        weights = mn.masked_softmax(scores)  # the library calls softmax inside: allowed
        with pytest.raises(RefusedCall):
            mn.softmax(scores)
    assert np.allclose(weights, mn.softmax(scores)) and guard.caught == __name__


def test_a_permitted_library_call_passes():
    """Chapter 4 lets the loop call mnp.head_attention: a check refuses the function it checks, no other."""
    def loop(X, heads, W_o, *, context=None, mask=None):
        source = X if context is None else context
        shape = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
        full = None if mask is None else np.broadcast_to(mask, shape)
        outs = [mn.head_attention(X, *head, context=context, mask=None if full is None else full[..., i, :, :])
                for i, head in enumerate(heads)]
        return np.concatenate([o for o, _ in outs], -1) @ W_o, np.stack([w for _, w in outs], -3)
    quietly(checks.check_multihead_attention_loop, loop)
