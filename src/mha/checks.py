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


def structure_of(name):
    """How `mha.numpy.<name>` returns: None (one array) or a tuple of part names, maybe nested."""
    parts = PAIRS[name]
    if parts is True:
        return ("out", "weights")
    return parts or None


def describe_structure(structure):
    inner = ", ".join(p if isinstance(p, str) else describe_structure(p) for p in structure)
    return f"({inner})"


def compare_result(expected, got, structure):
    """Compare a whole result: an array, or a tuple such as (out, weights), part by part."""
    if structure is None:
        return compare_arrays("result", expected, got)
    wanted = describe_structure(structure)
    if not isinstance(got, (tuple, list)):
        return f"expected a tuple {wanted}, got {type(got).__name__}"
    if len(got) != len(structure):
        return (f"expected a tuple of {len(structure)} {wanted}, "
                f"got a {type(got).__name__} of length {len(got)}")
    for part, e, g in zip(structure, expected, got):
        problem = compare_arrays(part, e, g) if isinstance(part, str) else compare_result(e, g, part)
        if problem:
            return problem
    return None


def flatten(result, structure):
    """The arrays of a result in order, following `structure` (None: the result itself)."""
    if structure is None:
        return [result]
    if not isinstance(result, (tuple, list)) or len(result) != len(structure):
        raise ValueError("not shaped like the reference's result")
    return [a for part, r in zip(structure, result)
            for a in ([r] if isinstance(part, str) else flatten(r, part))]


def matching_hint(name, case, got, structure):
    """The hint of the first classic mistake whose answer equals `got`, if any."""
    for m in mistakes.for_function(name):
        try:
            with np.errstate(all="ignore"):
                wrong = m.fn(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
            if compare_mistake(wrong, got, structure):
                return m.hint
        except Exception:
            continue
    return None


def compare_mistake(wrong, got, structure):
    """True when `got` equals a mistake's answer (NaNs matching NaNs)."""
    try:
        pairs = zip(flatten(wrong, structure), flatten(got, structure))
        return all(np.allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float),
                               rtol=RTOL, atol=ATOL, equal_nan=True) for w, g in pairs)
    except (TypeError, ValueError):
        return False


def run_check(name, fn, cases, structure):
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
        problem = compare_result(expected, got, structure)
        if problem:
            hint = matching_hint(name, case, got, structure)
            raise CheckFailed(
                f"{name} gives a wrong answer on the case '{case.label}'\n"
                f"  input: {describe_case(reference, case)}\n  {problem}"
                + (f"\n  hint: {hint}" if hint else "")
            )
    print(f"check_{name}: all {len(cases)} cases passed.")


def make_check(name):
    def check(fn):
        run_check(name, fn, CASES[name](), structure_of(name))
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
check_decoder_block = make_check("decoder_block")
check_attention_at_offset = make_check("attention_at_offset")
check_chunked_attention = make_check("chunked_attention")
