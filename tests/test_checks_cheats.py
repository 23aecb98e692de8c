"""mha.checks cannot be fooled: fresh random cases on every call (with the seed to repeat them),
a reference that the learner cannot touch, and a solution that must be the learner's own."""

import inspect
import io
import re
import subprocess
import sys
import types
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from learners import own_copy, recording, replay_by_input, replay_in_order, right_solutions, same_inputs, unguarded

import mha.checks as checks
import mha.numpy as mn
import mha.numpy.attention
import mha.torch as mt
from mha.checks.own_work import RefusedCall, Refusing
from mha.checks.reference import library_function
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


# Seeds: fresh cases on every call, named and random, and the seed to draw them again -------------

# The checks whose named cases are sizes and numbers that their labels spell out ("T = 4", "P = 3"): the same on
# every run (their random cases change). Every other check draws the values of its named cases from the seed.
FIXED_NAMED = {"causal_mask", "padding_mask", "sinusoidal_positions", "alibi_bias", "kv_cache_bytes",
               "sliding_window_mask", "loss_to_bits_per_character", "all_reduce_bytes", "ntk_frequencies"}


def recorded(name):
    """A right solution (written from scratch) that writes down every (inputs, answer) it gives, in call order."""
    return recording(right_solutions()[name])


def inputs_of_a_run(name, seed=None):
    """The (args, kwargs) that check_<name> gives a right solution, in order, and how many are named."""
    solve, calls = recorded(name)
    quietly(check(name), solve, seed=seed)
    return [inputs for inputs, _ in calls], len(CHECKS[name].named_cases(0))


@pytest.mark.parametrize("name", NAMES)
def test_each_call_draws_new_cases_and_a_seed_draws_them_again(name):
    (first, named), (second, _) = inputs_of_a_run(name), inputs_of_a_run(name)
    assert not same_inputs(first[named:], second[named:]), "the random cases change from call to call"
    if name in FIXED_NAMED:
        assert same_inputs(first[:named], second[:named]), "sizes that the labels spell out stay"
    else:
        assert not same_inputs(first[:named], second[:named]), "the named cases' values change from call to call"
    assert same_inputs(inputs_of_a_run(name, seed=7), inputs_of_a_run(name, seed=7)), "a seed draws them again"


@pytest.mark.parametrize("name", sorted(set(NAMES) - FIXED_NAMED))
def test_named_cases_keep_their_labels_and_count_and_differ_between_two_seeds(name):
    """The stored outputs of the notebooks count the named cases; the traps are in the labels."""
    a, b, again = CHECKS[name].named_cases(1), CHECKS[name].named_cases(2), CHECKS[name].named_cases(1)
    assert [c.label for c in a] == [c.label for c in b] == [c.label for c in again]
    assert [c.peak_bytes for c in a] == [c.peak_bytes for c in b] and [c.raises for c in a] == [c.raises for c in b]
    assert not same_inputs([(c.args, c.kwargs) for c in a], [(c.args, c.kwargs) for c in b])
    assert same_inputs([(c.args, c.kwargs) for c in a], [(c.args, c.kwargs) for c in again])


@pytest.mark.parametrize("name", NAMES)
def test_a_solution_that_replays_answers_in_call_order_fails(name):
    solve, calls = recorded(name)
    quietly(check(name), solve)
    message = failure(name, replay_in_order(calls))
    assert ("random: " in message) == (name in FIXED_NAMED), "the named cases of another run are other cases"


@pytest.mark.parametrize("name", NAMES)
def test_a_solution_that_looks_up_recorded_inputs_fails(name):
    solve, calls = recorded(name)
    for seed in (1, 2, 3):
        quietly(check(name), solve, seed=seed)
    message = failure(name, replay_by_input(calls), seed=4)
    assert ("random: " in message) == (name in FIXED_NAMED), message


def test_the_grader_draws_the_named_cases_from_its_seed_as_the_notebook_does():
    """tools/grading/cases.py judges the named cases of the grading seed: the same as check_NAME(fn, seed=...)."""
    source = (Path(__file__).resolve().parents[1] / "tools" / "grading" / "cases.py").read_text()
    assert "check.named_cases(seed)" in source and "make_cases()" not in source


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
    its arrays are 1-D (float32 all the same); RoPE's scaled frequencies take numbers; the greedy generation loop
    takes token ids (integers), and so does a BPE merge (a list); the learning rate of a step takes numbers; a GGUF
    block is bytes (uint8), in 4-D batches all the same."""
    sizes_only = ("causal_mask", "padding_mask", "kv_cache_bytes", "sinusoidal_positions", "generate_greedy",
                  "sliding_window_mask", "loss_to_bits_per_character", "all_reduce_bytes", "merge_pair",
                  "warmup_cosine", "ntk_frequencies")
    for seed in range(5):
        arrays = [a for case in CHECKS[name].make_random_cases(np.random.default_rng(seed))
                  for a in arrays_in((case.args, case.kwargs))]
        if name not in sizes_only:
            assert any(a.dtype == (np.uint8 if name == "dequantize_q4_1" else np.float32) for a in arrays), name
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
    assert f"hint: {mistake.hint}" in failure(mistake.name, unguarded(mistake.fn))


def test_reassigning_what_the_reference_calls_inside_changes_nothing(monkeypatch):
    def wrong_sdpa(Q, K, V, mask=None):
        return np.zeros(1), np.zeros(1)
    solve = right_solutions()["multihead_attention"]  # written from scratch: nothing of the library in it
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
    """Chapter 4 lets the loop call mnp.head_attention: a check refuses the function it checks, no other. (The
    loop adds up each head's output times its slice of W_o, the route the text asks for.)"""
    def loop(X, heads, W_o, *, context=None, mask=None):
        source = X if context is None else context
        shape = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
        full = None if mask is None else np.broadcast_to(mask, shape)
        out, start, weights = 0, 0, []
        for i, head in enumerate(heads):
            o, w = mn.head_attention(X, *head, context=context, mask=None if full is None else full[..., i, :, :])
            out, start = out + o @ W_o[start:start + o.shape[-1]], start + o.shape[-1]
            weights.append(w)
        return out, np.stack(weights, -3)
    quietly(checks.check_multihead_attention_loop, loop)


# Every route that the exercise forbids is refused in the notebook too, as the grader refuses it -----------


def calls_with_nothing(fn):
    """A solution that calls `fn` with None for each parameter it needs, whatever it is given: the call starts,
    and is refused, before any of fn's code could look at them."""
    needed = inspect.signature(fn).parameters.values()
    args = [None for p in needed if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    kwargs = {p.name: None for p in needed if p.kind == p.KEYWORD_ONLY and p.default is p.empty}

    def route(*given, **named):
        return fn(*args, **kwargs)
    route.__name__ = f"by_{fn.__name__}"
    return route


FORBIDDEN = [(name, forbidden) for name in NAMES for forbidden in CHECKS[name].forbids]
TWINS = [(name, forbidden) for name in NAMES for forbidden in CHECKS[name].absent()
         if isinstance(getattr(mt, forbidden, None), types.FunctionType)]


@pytest.mark.parametrize("name,forbidden", FORBIDDEN, ids=[f"{n}-{f}" for n, f in FORBIDDEN])
def test_every_forbidden_route_is_refused_in_the_notebook_with_its_name(name, forbidden):
    """Of mha.numpy, or of another module of mha by its dotted name (mha.text.bits_per_character)."""
    message = failure(name, calls_with_nothing(library_function(forbidden)), seed=0)
    assert message.startswith(f"{name} calls mha's own {forbidden}, which does this exercise's work: write it "
                              f"yourself, using only {CHECKS[name].may_use}\n  on the case '"), message


@pytest.mark.parametrize("name,forbidden", TWINS, ids=[f"{n}-{f}" for n, f in TWINS])
def test_every_torch_twin_of_a_forbidden_route_is_refused_too(name, forbidden):
    message = failure(name, calls_with_nothing(getattr(mt, forbidden)), seed=0)
    assert message.startswith(f"{name} calls mha's own {forbidden}"), message


def test_a_forbidden_function_handed_in_itself_is_refused_with_its_name():
    message = failure("causal_mask", mn.causal_mask_after)
    assert message.startswith("this is mha's own causal_mask_after, not yours, which does this exercise's work: "
                              "write it yourself"), message


def test_a_permitted_function_may_use_a_forbidden_one_inside():
    """top_p_filter forbids filter_logits; the library's generate calls filter_logits inside, and stays allowed."""
    logits = np.random.default_rng(0).standard_normal((2, 5))
    with Refusing("top_p_filter", mn.top_p_filter, None, {"filter_logits": mn.filter_logits}) as guard:
        mn.generate(lambda tokens: np.broadcast_to(logits[:, None], tokens.shape + (5,)), np.zeros((2, 1), int), 2,
                    top_p=0.9, rng=np.random.default_rng(0))
        with pytest.raises(RefusedCall):
            mn.filter_logits(logits, top_p=0.9)
    assert guard.caught == __name__ and guard.refused == "filter_logits"
