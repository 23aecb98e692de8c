"""Automatic checks for the exercises: `check_NAME(fn)` tests a learner's `fn`.

`fn` is called exactly as `mha.numpy.NAME` is called, on seeded random inputs
and edge cases. On success the check prints one line and returns None. On
failure it raises `CheckFailed` saying which input, what was expected and what
came back, with a hint when the answer matches a classic mistake (see
`mha.mistakes`). A stub that still raises NotImplementedError makes the check
raise NotImplementedError too, so a handout run top to bottom stops there.

    from mha.checks import check_softmax
    check_softmax(my_softmax)
"""

import copy
import inspect
import numpy as np

import mha.numpy as mn
from mha import mistakes
from mha.check_cases import CASES, PAIRS, describe_value

RTOL, ATOL = 1e-5, 1e-8


class CheckFailed(AssertionError):
    """A learner's function gave a wrong answer (or none) on one of the check's inputs."""


def describe_case(reference, case):
    """The case's inputs by parameter name, e.g. "X: shape (2, 5, 3) float64, exclude_self=True"."""
    bound = inspect.signature(reference).bind(*case.args, **case.kwargs)
    return ", ".join(describe_value(k, v) for k, v in bound.arguments.items())


def describe_array(a):
    a = np.asarray(a)
    return f"shape {a.shape} {a.dtype}"


def compare_arrays(what, expected, got):
    """None if `got` equals `expected`, else a message saying how they differ."""
    if not isinstance(got, np.ndarray) and not np.isscalar(got):
        try:
            got = np.asarray(got)
        except Exception:  # e.g. a torch tensor that needs grad
            return f"{what}: expected a NumPy array, got {type(got).__name__}"
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"{what}: expected {describe_array(expected)}, got {describe_array(got)}"
    if expected.dtype == bool:
        if got.dtype != bool:
            return f"{what}: expected a boolean array, got dtype {got.dtype}"
        wrong = np.argwhere(got != expected)
        if len(wrong):
            i = tuple(int(n) for n in wrong[0])
            return (f"{what}: {len(wrong)} of {got.size} entries differ; first at index {i}: "
                    f"expected {expected[i]}, got {got[i]}")
        return None
    if not np.issubdtype(got.dtype, np.number):
        return f"{what}: expected numbers, got dtype {got.dtype}"
    bad = ~np.isfinite(got) & np.isfinite(expected)
    if bad.any():
        i = tuple(int(n) for n in np.argwhere(bad)[0])
        return f"{what}: got {got[i]} at index {i} where {expected[i]:.6g} was expected"
    diff = np.abs(got.astype(float) - expected)
    if np.all(diff <= ATOL + RTOL * np.abs(expected)):
        return None
    i = tuple(int(n) for n in np.unravel_index(np.argmax(diff), diff.shape))
    return (f"{what}: {describe_array(expected)} as expected, but the largest difference is "
            f"{diff[i]:.3g} at index {i}: expected {expected[i]:.6g}, got {got[i]:.6g}")


def compare_result(expected, got, pair):
    """Compare a whole result: an array, or an (out, weights) pair."""
    if not pair:
        return compare_arrays("result", expected, got)
    if not isinstance(got, (tuple, list)):
        return f"expected a tuple (out, weights), got {type(got).__name__}"
    if len(got) != 2:
        return f"expected a tuple of 2 (out, weights), got a {type(got).__name__} of length {len(got)}"
    for what, e, g in (("out", expected[0], got[0]), ("weights", expected[1], got[1])):
        problem = compare_arrays(what, e, g)
        if problem:
            return problem
    return None


def matching_hint(name, case, got, pair):
    """The hint of the first classic mistake whose answer equals `got`, if any."""
    for m in mistakes.for_function(name):
        try:
            with np.errstate(all="ignore"):
                wrong = m.fn(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
            if compare_mistake(wrong, got, pair):
                return m.hint
        except Exception:
            continue
    return None


def compare_mistake(wrong, got, pair):
    """True when `got` equals a mistake's answer (NaNs matching NaNs)."""
    parts = zip(wrong, got) if pair else [(wrong, got)]
    try:
        return all(np.allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float),
                               rtol=RTOL, atol=ATOL, equal_nan=True) for w, g in parts)
    except (TypeError, ValueError):
        return False


def run_check(name, fn, cases, pair):
    """Call `fn` on every case and compare it with `mha.numpy.<name>`."""
    if not callable(fn):
        raise CheckFailed(f"check_{name} needs a function, got {type(fn).__name__}")
    reference = getattr(mn, name)
    for case in cases:
        expected = reference(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        try:
            with np.errstate(all="ignore"):
                got = fn(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
        except NotImplementedError:
            raise NotImplementedError(
                f"{name} is not written yet: write it in the cell above, then run this check again"
            ) from None
        except Exception as error:
            raise CheckFailed(
                f"{name} raised {type(error).__name__}: {error}\n"
                f"  on the case '{case.label}' ({describe_case(reference, case)})"
            ) from None
        problem = compare_result(expected, got, pair)
        if problem:
            hint = matching_hint(name, case, got, pair)
            raise CheckFailed(
                f"{name} gives a wrong answer on the case '{case.label}'\n"
                f"  input: {describe_case(reference, case)}\n  {problem}"
                + (f"\n  hint: {hint}" if hint else "")
            )
    print(f"check_{name}: all {len(cases)} cases passed.")


def make_check(name):
    def check(fn):
        run_check(name, fn, CASES[name](), PAIRS[name])
    check.__name__ = check.__qualname__ = f"check_{name}"
    check.__doc__ = (f"Check a learner's `{name}` against `mha.numpy.{name}`; "
                     f"raises CheckFailed with a hint on a wrong answer.")
    return check


check_softmax = make_check("softmax")
check_self_attention = make_check("self_attention")
check_symmetric_attention = make_check("symmetric_attention")
check_head_attention = make_check("head_attention")
check_scaled_dot_product_attention = make_check("scaled_dot_product_attention")
check_split_heads = make_check("split_heads")
check_merge_heads = make_check("merge_heads")
check_multihead_attention_loop = make_check("multihead_attention_loop")
check_multihead_attention = make_check("multihead_attention")
check_causal_mask = make_check("causal_mask")
check_padding_mask = make_check("padding_mask")
check_layer_norm = make_check("layer_norm")
check_feed_forward = make_check("feed_forward")
check_encoder_block = make_check("encoder_block")
