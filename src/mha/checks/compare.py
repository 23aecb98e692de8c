"""How a check compares a learner's answer with the reference's, and says in words
what it tried and how the two differ.

A result is one array (or a number) or a tuple of arrays, perhaps nested; its
*structure* names the parts: None for one array, ("out", "weights") for a pair,
("out", ("self_weights", "cross_weights")) for a nested tuple, or ListOf("shard")
for a list of arrays (a list, as long as the reference's). Floats agree within a
tolerance; whole numbers (a count of bytes) must be exact.
"""

import inspect

import numpy as np

# For float64 results: tight enough to refuse float32 arithmetic (about 1e-7 relative, rounded to float64 at the
# end), loose enough for float64 computed in another order (sums, matmuls, an online softmax: 1e-13 and less).
RTOL, ATOL = 1e-9, 1e-9
RTOL_SINGLE, ATOL_SINGLE = 1e-4, 1e-4  # for float32 results: about 7 digits, of sums of larger terms


def tolerance(*arrays):
    """(rtol, atol) for comparing `arrays`: looser when one of them holds float32 (or narrower) numbers."""
    narrow = any(a.dtype.kind == "f" and a.dtype.itemsize < 8 for a in map(np.asarray, arrays))
    return (RTOL_SINGLE, ATOL_SINGLE) if narrow else (RTOL, ATOL)


def describe_value(name, value):
    """One input in words, e.g. "X: shape (2, 5, 3) float64" or "exclude_self=True"."""
    if isinstance(value, np.ndarray):
        return f"{name}: shape {value.shape} {value.dtype}"
    if isinstance(value, dict):
        return f"{name}: {{{', '.join(value)}}}" if name != "params" else "the block's parameters"
    if isinstance(value, list) and len(value) <= 12 and all(isinstance(v, (int, np.integer)) for v in value):
        return f"{name}={[int(v) for v in value]!r}"  # a few token ids, shown: the learner can follow them by hand
    if isinstance(value, list):
        return f"{name}: list of {len(value)}"
    return f"{name}={value!r}"


def describe_case(reference, case):
    """The case's inputs by parameter name, e.g. "X: shape (2, 5, 3) float64, exclude_self=True"."""
    bound = inspect.signature(reference).bind(*case.args, **case.kwargs)
    return ", ".join(describe_value(k, v) for k, v in bound.arguments.items())


def describe_array(a):
    """An array's shape and dtype, e.g. "shape (4, 5) float64"."""
    a = np.asarray(a)
    return f"shape {a.shape} {a.dtype}"


class ListOf:
    """The structure of a result that is a Python list of arrays, as many as the reference's (each one compared as
    one array, named `part` and its index): a text that says "return a list" means a list, not a stacked array."""

    def __init__(self, part):
        self.part = part

    def __repr__(self):
        return f"ListOf({self.part!r})"


def describe_structure(structure):
    """A structure as the learner would write the tuple, e.g. "(out, (self_weights, cross_weights))"."""
    if isinstance(structure, ListOf):
        return f"[{structure.part}, ...]"
    inner = ", ".join(p if isinstance(p, str) else describe_structure(p) for p in structure)
    return f"({inner})"


def dtype_problem(what, expected, got, float32_promised):
    """None if `got`'s float dtype is acceptable, else what is wrong with it. A float64 answer must be float64
    (a float64 input answered in float64). A float32 answer must be float32 where the text promises it
    (`float32_promised`); elsewhere float64 is accepted too (the same numbers, computed more exactly)."""
    if got.dtype == expected.dtype:
        return None
    if expected.dtype == np.float32 and got.dtype == np.float64 and not float32_promised:
        return None
    return f"{what}: expected dtype {expected.dtype}, got {got.dtype} (same shape {got.shape})"


def compare_arrays(what, expected, got, float32_promised=True):
    """None if `got` equals `expected`, else a message saying how they differ."""
    expected = np.asarray(expected)  # a number, such as a count of bytes, becomes a 0-d array
    if not isinstance(got, np.ndarray) and not np.isscalar(got):
        try:
            got = np.asarray(got)
        except Exception:  # e.g. a torch tensor that needs grad
            return f"{what}: expected a NumPy array, got {type(got).__name__}"
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"{what}: expected {describe_array(expected)}, got {describe_array(got)}"
    if expected.dtype == bool:
        return compare_booleans(what, expected, got)
    if not np.issubdtype(got.dtype, np.number):
        return f"{what}: expected numbers, got dtype {got.dtype}"
    if expected.dtype.kind in "iu":
        if got.dtype.kind not in "iu":
            return f"{what}: expected whole numbers (an integer dtype), got dtype {got.dtype}"
        return compare_integers(what, expected, got)
    problem = dtype_problem(what, expected, got, float32_promised)
    return problem or compare_numbers(what, expected, got)


def compare_booleans(what, expected, got):
    """None if the boolean arrays are equal, else the number of differences and the first one."""
    if got.dtype != bool:
        return f"{what}: expected a boolean array, got dtype {got.dtype}"
    wrong = np.argwhere(got != expected)
    if len(wrong):
        i = tuple(int(n) for n in wrong[0])
        return (f"{what}: {len(wrong)} of {got.size} entries differ; first at index {i}: "
                f"expected {expected[i]}, got {got[i]}")
    return None


def compare_integers(what, expected, got):
    """None if `got` holds exactly the expected whole numbers, else the first difference: a count is
    right or wrong, with no tolerance."""
    wrong = np.argwhere(got != expected)
    if not len(wrong):
        return None
    if expected.ndim == 0:
        return f"{what}: expected {expected}, got {got}"
    i = tuple(int(n) for n in wrong[0])
    return (f"{what}: {len(wrong)} of {got.size} entries differ; first at index {i}: "
            f"expected {expected[i]}, got {got[i]}")


def compare_numbers(what, expected, got):
    """None if the numbers agree within the expected dtype's tolerance, and every infinity (or NaN) of the
    expected answer is there too, else where they differ most (or which number is not what it must be)."""
    finite = np.isfinite(expected)
    same_special = (got == expected) | (np.isnan(got) & np.isnan(expected))  # -inf for -inf, NaN for NaN
    bad = (~np.isfinite(got) & finite) | (~finite & ~same_special)
    if bad.any():
        i = tuple(int(n) for n in np.argwhere(bad)[0])
        return f"{what}: got {got[i]} at index {i} where {expected[i]:.6g} was expected"
    rtol, atol = tolerance(expected)
    diff = np.where(finite, np.abs(got.astype(float) - np.where(finite, expected, 0)), 0.0)
    if np.all(diff <= atol + rtol * np.abs(np.where(finite, expected, 0))):
        return None
    i = tuple(int(n) for n in np.unravel_index(np.argmax(diff), diff.shape))
    return (f"{what}: {describe_array(expected)} as expected, but the largest difference is "
            f"{diff[i]:.3g} at index {i}: expected {expected[i]:.6g}, got {got[i]:.6g}")


def compare_result(expected, got, structure, float32_promised=True):
    """Compare a whole result: an array, or a tuple such as (out, weights), part by part. `float32_promised`:
    whether the text promises float32 answers for float32 inputs (else float64 is accepted for them)."""
    if structure is None:
        return compare_arrays("result", expected, got, float32_promised)
    if isinstance(structure, ListOf):
        return compare_list(expected, got, structure.part, float32_promised)
    wanted = describe_structure(structure)
    if not isinstance(got, (tuple, list)):
        return f"expected a tuple {wanted}, got {type(got).__name__}"
    if len(got) != len(structure):
        return (f"expected a tuple of {len(structure)} {wanted}, "
                f"got a {type(got).__name__} of length {len(got)}")
    for part, e, g in zip(structure, expected, got):
        problem = (compare_arrays(part, e, g, float32_promised) if isinstance(part, str)
                   else compare_result(e, g, part, float32_promised))
        if problem:
            return problem
    return None


def compare_list(expected, got, part, float32_promised=True):
    """None if `got` is a list of as many arrays as `expected`, each equal to its own, else what differs."""
    if not isinstance(got, list):
        shown = describe_array(got) if isinstance(got, np.ndarray) else type(got).__name__
        return f"expected a list of {len(expected)} arrays (one {part} each), got {shown}"
    if len(got) != len(expected):
        return f"expected a list of {len(expected)} arrays (one {part} each), got a list of {len(got)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        problem = compare_arrays(f"{part} {i}", e, g, float32_promised)
        if problem:
            return problem
    return None


def flatten(result, structure):
    """The arrays of a result in order, following `structure` (None: the result itself)."""
    if structure is None:
        return [result]
    if isinstance(structure, ListOf):
        if not isinstance(result, list):
            raise ValueError("not a list like the reference's result")
        return list(result)
    if not isinstance(result, (tuple, list)) or len(result) != len(structure):
        raise ValueError("not shaped like the reference's result")
    return [a for part, r in zip(structure, result)
            for a in ([r] if isinstance(part, str) else flatten(r, part))]


def same_answer(wrong, got, structure):
    """True when `got` equals a mistake's answer `wrong` (NaNs matching NaNs)."""
    try:
        wrong, got = flatten(wrong, structure), flatten(got, structure)
        if len(wrong) != len(got):
            return False
        pairs = zip(wrong, got)
        return all(np.allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float),
                               *tolerance(w, g), equal_nan=True) for w, g in pairs)
    except (TypeError, ValueError):
        return False


def changed_input(before, after, name="input"):
    """None if `after` (an argument once the function returned) still equals `before` (the case's own
    copy), else what changed: a function must not write into the arrays it is given."""
    if isinstance(before, np.ndarray):
        if not isinstance(after, np.ndarray) or after.shape != before.shape or after.dtype != before.dtype:
            return f"{name} was replaced or reshaped in place"
        if not np.array_equal(before, after, equal_nan=before.dtype.kind in "fc"):
            return f"{name} was changed in place"
        return None
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and len(before) == len(after):
        return next(filter(None, (changed_input(b, a, f"{name}[{i}]")
                                  for i, (b, a) in enumerate(zip(before, after)))), None)
    if isinstance(before, dict) and isinstance(after, dict) and before.keys() == after.keys():
        return next(filter(None, (changed_input(before[k], after[k], f"{name}[{k!r}]") for k in before)), None)
    try:
        return None if before == after else f"{name} was changed in place"
    except Exception:  # noqa: BLE001 - a value that cannot be compared is taken as unchanged
        return None


def changed_arguments(reference, case, args, kwargs):
    """None if the arguments `args`, `kwargs` that a function was called with still equal the case's,
    else which one changed, by parameter name."""
    names = list(inspect.signature(reference).parameters)
    for i, (before, after) in enumerate(zip(case.args, args)):
        problem = changed_input(before, after, names[i] if i < len(names) else f"argument {i}")
        if problem:
            return problem
    for key, before in case.kwargs.items():
        problem = changed_input(before, kwargs.get(key), key)
        if problem:
            return problem
    return None
