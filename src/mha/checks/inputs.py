"""Inputs that the cases of several chapters share.

The named cases draw their numbers from `named_generator(seed)`, the random cases from the generator
`np.random.default_rng(seed)`, with the seed of the run (fresh on each call of a check, or given): a named
case keeps its label and its trap, but its values change from run to run, so that no answer recorded in one
run fits the next; the same seed draws the same cases again. Both use the helpers below:
sizes and batches, arrays of either float dtype, weights of any shape, and masks in
which some query may attend to nothing.
"""

import numpy as np


NAMED_STREAM = 2026  # the named cases' own stream, apart from the random cases' (drawn from the seed alone)


def named_generator(seed):
    """The generator of the named cases of a run with `seed`: the same seed, the same named cases."""
    return np.random.default_rng((NAMED_STREAM, seed))


def normal(r, shape, dtype=np.float64, scale=1.0):
    """Normal numbers with standard deviation `scale`, of the given shape and dtype."""
    return (scale * r.standard_normal(shape)).astype(dtype)


def weights(r, rows, cols, dtype=np.float64):
    """A (rows, cols) weight matrix, scaled by 1/sqrt(rows)."""
    return normal(r, (rows, cols), dtype, 1 / np.sqrt(rows))


def sizes(r, n, low=1, high=4):
    """n sizes drawn from low..high, as a tuple of ints: a shape, or widths."""
    return tuple(int(s) for s in r.integers(low, high + 1, size=n))


def batch(r, n):
    """n batch sizes of 2 or 3: with more than one sequence, a mix-up between sequences shows."""
    return sizes(r, n, 2, 3)


def different_sizes(r, n, low=1, high=6):
    """n sizes drawn from low..high, no two equal: widths that a mix-up cannot hide."""
    return tuple(int(s) for s in r.choice(np.arange(low, high + 1), size=n, replace=False))


def a_masked_row(T_q, T_k, row):
    """A causal (T_q, T_k) mask in which query `row` may attend to nothing."""
    mask = np.tril(np.ones((T_q, T_k), dtype=bool))
    mask[row] = False
    return mask


def with_an_empty_row(r, shape):
    """A random boolean mask of `shape` (..., T_q, T_k), mostly True, in which one query may attend to nothing."""
    mask = r.random(shape) < 0.7
    mask[tuple(int(r.integers(n)) for n in shape[:-1])] = False
    return mask


def padding(r, lead, T):
    """A padding mask of shape lead + (1, 1, T) for random lengths from 0 to T, one of them 0."""
    lengths = r.integers(0, T + 1, size=lead)
    lengths.flat[int(r.integers(lengths.size))] = 0
    return (np.arange(T) < lengths[..., None])[..., None, None, :]


def causal(T):
    """The (T, T) causal mask, built here so that the cases never depend on the learner's library."""
    return np.tril(np.ones((T, T), dtype=bool))


def cast(params, dtype):
    """A dict of parameters with every array cast to `dtype`; other values (None, numbers) as they are."""
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) else v for k, v in params.items()}


def attention_params(r, d, bias=True, width=None, d_out=None):
    """W_q, W_k, W_v, W_o (and b_q ... b_o with bias=True) of mha.numpy.multihead_attention:
    W_q, W_k, W_v map d to `width` (default d), and W_o maps `width` to `d_out` (default d)."""
    width, d_out = width or d, d_out or d
    params = {f"W_{n}": weights(r, d, width) for n in "qkv"}
    params["W_o"] = weights(r, width, d_out)
    if bias:
        params.update({f"b_{n}": 0.3 * r.standard_normal(width) for n in "qkv"})
        params["b_o"] = 0.3 * r.standard_normal(d_out)
    return params


# The traps of the named cases: numbers placed so that a wrong solution cannot pass by luck, whatever the seed


def scores_far_apart(r, d=4):
    """(T, d) = (4, d) tokens whose self-attention scores X X^T / sqrt(d) reach above 1100 in row 0 (exp
    overflows past 709) while row 2's largest score is about 1 (about 1100 below, so that one maximum for
    all rows underflows row 2 to 0 / 0). Rows 1 and 3 are ordinary tokens."""
    X = r.standard_normal((4, d))
    X[0] = 0.0
    X[0, 0] = 45.0 * d ** 0.25  # X[0] . X[0] / sqrt(d) = 2025
    X[2] = 0.0
    X[2, 1:] = 0.5  # orthogonal to X[0]: its row of scores stays near 0
    return X


def far_apart(r, lead, T_q, T_k, d, dtype=np.float64):
    """Q (lead + (T_q, d)) and K (lead + (T_k, d)) whose scores Q K^T / sqrt(d) are 1000 to 1004 in query 0
    and within a few units of 0 in the other queries: a softmax without the shift by each row's
    maximum overflows in row 0, and one shifted by the maximum of all rows underflows the others to 0 / 0."""
    Q, K = r.standard_normal(lead + (T_q, d)), r.standard_normal(lead + (T_k, d))
    Q[..., 0, :] = 0.0
    Q[..., 0, 0] = 40.0 * np.sqrt(d)  # query 0's scores are 40 K[..., j, 0] ...
    K[..., :, 0] = np.linspace(25.0, 25.1, T_k)  # ... from 1000 to 1004: weights spread over the keys
    Q[..., 1:, 0] = 0.0  # the other queries ignore that feature: their scores stay ordinary
    return Q.astype(dtype), K.astype(dtype)


def key_only_mask(B, T_k):
    """(B, 1, T_k) boolean: a mask of keys (the same for every query), with a sequence that has no key."""
    mask = np.ones((B, 1, T_k), dtype=bool)
    mask[0, 0, T_k // 2:] = False
    mask[-1] = False
    return mask
