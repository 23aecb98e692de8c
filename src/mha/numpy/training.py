"""Chapter 14 in NumPy: the arithmetic around a training run on text.

Three small pieces that `mha.text.training` and the tokenizer rely on, each written in plain Python and
NumPy so that a reader can follow it number by number:
- `merge_pair`: one merge step of byte-pair encoding (BPE) on a sequence of token ids;
- `warmup_cosine`: the learning rate of a step, a linear warm-up then half a cosine;
- `clip_grad_norm`: gradients rescaled by their global norm, as `torch.nn.utils.clip_grad_norm_` does.
"""

import math
import numbers

import numpy as np

from mha import validate

CLIP_EPS = 1e-6  # added to the global norm before dividing, as torch.nn.utils.clip_grad_norm_ adds it


def check_token_id(name, value):
    """A token id: a Python or NumPy integer >= 0 (bool refused). Returns it as an int."""
    return validate.check_int(name, value, minimum=0)


def token_ids(ids):
    """`ids` as a list of Python ints: a list, a tuple or a 1-D integer array of ids >= 0."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-D array of integers, got shape {ids.shape} {ids.dtype}")
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"ids must be a list of token ids, got {type(ids).__name__}")
    return [check_token_id(f"ids[{i}]", value) for i, value in enumerate(ids)]


def merge_pair(ids, pair, new_id):
    """One merge step of BPE: `ids` with each occurrence of the two ids `pair` side by side replaced by `new_id`.

    ids: a sequence of token ids, (T,); pair: (first, second), two ids; new_id: the id of the merged token.
    The sequence is read from left to right, and an id merged once is not merged again: with pair (a, a),
    (a, a, a) becomes (new_id, a). Returns a new list of ints, (T - number of merges,); `ids` is left as it was.
    """
    ids = token_ids(ids)
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise ValueError(f"pair must be two token ids (first, second), got {pair!r}")
    first, second = (check_token_id(f"pair[{i}]", value) for i, value in enumerate(pair))
    new_id = check_token_id("new_id", new_id)
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == first and ids[i + 1] == second:
            merged.append(new_id)
            i += 2  # both ids are used up: the second cannot start another pair
        else:
            merged.append(ids[i])
            i += 1
    return merged


def check_rate(name, value):
    """A learning rate: a finite real number >= 0 (bool refused). Returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def warmup_cosine(step, *, peak, warmup_steps, total_steps, final=0.0):
    """The learning rate of step `step` under a linear warm-up, then a half-cosine decay.

    Steps count from 1 (step 0 is before the first update). The rate rises linearly from 0 at step 0 to `peak` at
    step `warmup_steps`, then follows half a cosine from `peak` down to `final` at step `total_steps`, and stays at
    `final` after it: peak * step / warmup_steps, then final + (peak - final) (1 + cos(pi * progress)) / 2 with
    progress = (step - warmup_steps) / (total_steps - warmup_steps), at most 1. With warmup_steps = 0 the cosine
    starts at step 0, at the peak. Returns a Python float.
    """
    step = validate.check_int("step", step, minimum=0)
    warmup_steps = validate.check_int("warmup_steps", warmup_steps, minimum=0)
    total_steps = validate.check_int("total_steps", total_steps, minimum=0)
    peak, final = check_rate("peak", peak), check_rate("final", final)
    if warmup_steps > 0 and step <= warmup_steps:
        return peak * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))  # in [0, 1]
    return final + (peak - final) * 0.5 * (1 + math.cos(math.pi * progress))


def check_gradients(grads):
    """A list of float arrays (any shapes), one per parameter. Returns it as a list of arrays."""
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"grads must be a list of arrays, got {type(grads).__name__}")
    arrays = [np.asarray(g) for g in grads]
    for i, g in enumerate(arrays):
        if g.dtype.kind != "f":
            raise TypeError(f"grads[{i}] must hold floats, got dtype {g.dtype}")
    return arrays


def clip_grad_norm(grads, max_norm):
    """Gradients clipped by their global norm, without changing them in place.

    grads: a list of float arrays of any shapes (one per parameter); max_norm: a number > 0. The global norm is
    the length of all their entries together, as one vector. Each array is multiplied by
    max_norm / (total_norm + 1e-6) when that is below 1 (torch.nn.utils.clip_grad_norm_'s rule), and copied as it
    is otherwise. Returns (clipped, total_norm): a list of new arrays with the shapes and dtypes of `grads`, and the
    global norm before clipping, a NumPy float of the gradients' dtype (float64 0.0 for an empty list).
    """
    arrays = check_gradients(grads)
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not 0 < max_norm < math.inf:
        raise ValueError(f"max_norm must be a finite number > 0, got {max_norm!r}")
    squares = [float(np.sum(np.square(g, dtype=np.float64))) for g in arrays]  # each array's squared length
    total_norm = math.sqrt(sum(squares))
    dtype = np.result_type(*arrays) if arrays else np.dtype(np.float64)  # float32 gradients: a float32 norm
    scale = float(max_norm) / (total_norm + CLIP_EPS)
    if scale >= 1:
        return [g.copy() for g in arrays], dtype.type(total_norm)
    return [g * scale for g in arrays], dtype.type(total_norm)  # a Python float: float32 stays float32
