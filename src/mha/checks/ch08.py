"""Chapter 8, attention at scale: the check of `chunked_attention` (keys in chunks,
an online softmax), its cases and its catalogued mistakes."""

import math

import numpy as np

from mha.checks.inputs import batch, causal, different_sizes, normal, rng, sizes, with_an_empty_row
from mha.checks.reference import NUMPY as mn
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for


@cases_for("chunked_attention", may_use="NumPy, nothing from mha")  # returns out only: no weights
def chunked_attention_cases():
    """Chunks that do and do not divide T, masked rows and chunks, and scores far from 0."""
    r = rng()
    X = r.standard_normal((2, 5, 4))
    masked = np.ones((2, 5, 5), dtype=bool)
    masked[0, 3] = False  # query 3 of sequence 0 may attend to nothing
    masked[1, :, :2] = False  # sequence 1: the whole first chunk is blocked
    far = np.array([[30.0, 30.0], [-30.0, -30.0], [-29.0, -31.0]])  # scores about 1273, -1273, -1273
    return [
        Case("one sequence, chunk does not divide T",
             (r.standard_normal((6, 3)), r.standard_normal((7, 3)), r.standard_normal((7, 2))), {"chunk": 3}),
        Case("a batch, chunk divides T", (X, X, r.standard_normal((2, 5, 3))), {"chunk": 5}),
        Case("a fully masked row and a fully masked first chunk",
             (X, X, r.standard_normal((2, 5, 3))), {"mask": masked, "chunk": 2}),
        Case("large logits, causal", tuple(30 * r.standard_normal((2, 4, 4, 3)) for _ in range(3)),
             {"mask": causal(4), "chunk": 3}),
        Case("very negative scores after a masked chunk",
             (np.array([[30.0, 30.0]]), far, r.standard_normal((3, 2))),
             {"mask": np.array([[False, True, True]]), "chunk": 1}),
        Case("chunk larger than T", tuple(r.standard_normal((3, 2)) for _ in range(3)), {"chunk": 8}),
    ]


@random_cases_for("chunked_attention")
def chunked_attention_random_cases(r):
    """T_q != T_k and d_k != d_v throughout: a 4-D batch with a random chunk, a query with
    nothing to attend to and a blocked first chunk, large logits, float32 with chunk 1, and one key."""
    (T_q, d_k, d_v), T_k = different_sizes(r, 3, 1, 5), sizes(r, 1, 5, 9)[0]
    (b1, b2), chunk = batch(r, 2), int(r.integers(2, T_k))
    blocked = with_an_empty_row(r, (b1, T_q, T_k))
    blocked[..., int(r.integers(T_q)), :chunk] = False  # a query whose first chunk is blocked

    def qkv(lead=(), dtype=np.float64, scale=1.0, n_k=T_k):
        return (normal(r, lead + (T_q, d_k), dtype, scale), normal(r, lead + (n_k, d_k), dtype, scale),
                normal(r, lead + (n_k, d_v), dtype))

    return [
        Case(f"random: a 4-D batch, chunks of {chunk} keys", qkv((b1, b2)), {"chunk": chunk}),
        Case("random: a query with nothing to attend to, a blocked first chunk", qkv((b1,)),
             {"mask": blocked, "chunk": chunk}),
        Case("random: large logits", qkv(scale=30), {"mask": with_an_empty_row(r, (T_q, T_k)), "chunk": chunk}),
        Case("random: float32, chunk = 1", qkv((b1,), np.float32), {"chunk": 1}),
        Case("random: one key, chunk larger than T_k", qkv(n_k=1), {"chunk": chunk}),
    ]


def _online_softmax(Q, K, V, mask, chunk, *, rescale=True, safe=True, keep_last=True, scale_acc=True,
                    keep_true_max=True):
    """Chunked attention with one step left out, as the flags say."""
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    T_k = K.shape[-2]
    shape = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2]) + (Q.shape[-2], T_k)
    mask = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(mask, shape)
    Q = Q / math.sqrt(Q.shape[-1])
    row_max = np.full(shape[:-1] + (1,), -np.inf)
    row_sum = np.zeros_like(row_max)
    acc = np.zeros(shape[:-1] + (V.shape[-1],))
    stop = T_k if keep_last else T_k - T_k % chunk
    for start in range(0, stop, chunk):
        block = slice(start, start + chunk)
        scores = np.where(mask[..., block], Q @ np.swapaxes(K[..., block, :], -1, -2), -np.inf)
        new_max = np.maximum(row_max, scores.max(axis=-1, keepdims=True))
        ref = np.where(np.isfinite(new_max), new_max, 0) if safe else new_max
        factor = np.exp(row_max - ref) if rescale else 1.0
        p = np.exp(scores - ref)
        row_sum = row_sum * factor + p.sum(axis=-1, keepdims=True)
        acc = acc * (factor if scale_acc else 1.0) + p @ V[..., block, :]
        row_max = new_max if keep_true_max else ref
    if not safe:
        return acc / row_sum
    return np.divide(acc, row_sum, out=np.zeros_like(acc), where=row_sum > 0)


@mistake("chunked_attention", "when a block brings a larger maximum, rescale what you have so far: multiply "
         "the running sum and the accumulated output by exp(old_max - new_max) before adding the block")
def chunked_without_rescaling(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, rescale=False)


@mistake("chunked_attention", "rescale the accumulated output too, not only the running sum: both were "
         "computed relative to the old maximum")
def chunked_rescales_only_the_sum(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, scale_acc=False)


@mistake("chunked_attention", "a row with no allowed key so far has a running maximum of -inf, and "
         "-inf - (-inf) is NaN: subtract 0 instead while the maximum is -inf, and divide only where the "
         "running sum is positive (a query with nothing to attend to gets zeros)")
def chunked_nan_on_masked_rows(Q, K, V, mask=None, chunk=256):
    with np.errstate(invalid="ignore", divide="ignore"):
        return _online_softmax(Q, K, V, mask, chunk, safe=False)


@mistake("chunked_attention", "the last block may be shorter than `chunk`: loop with "
         "range(0, T_k, chunk) so the keys after the last full block are not dropped")
def chunked_drops_the_last_block(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, keep_last=False)


@mistake("chunked_attention", "divide the scores by sqrt(d_k), the width of the queries and keys, "
         "not by sqrt(d_v), the width of the values")
def chunked_scaled_by_value_width(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q * np.sqrt(Q.shape[-1] / V.shape[-1]), K, V, mask, chunk)


@mistake("chunked_attention", "a softmax per block is not the softmax over all keys: keep a running "
         "maximum and sum across the blocks and divide once, at the end")
def chunked_softmax_per_block(Q, K, V, mask=None, chunk=256):
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    total = 0.0
    for start in range(0, K.shape[-2], chunk):
        block = slice(start, start + chunk)
        block_mask = None if mask is None else np.broadcast_to(
            mask, np.broadcast_shapes(np.shape(mask), Q.shape[:-1] + (K.shape[-2],)))[..., block]
        total = total + mn.scaled_dot_product_attention(Q, K[..., block, :], V[..., block, :], block_mask)[0]
    return total


@mistake("chunked_attention", "keep the true running maximum, -inf while a row has no allowed key yet; "
         "only the number you subtract may stand in as 0. A stored 0 makes exp(score - 0) underflow to 0 "
         "when the real scores come later and are very negative")
def chunked_max_reset_to_zero(Q, K, V, mask=None, chunk=256):
    return _online_softmax(Q, K, V, mask, chunk, keep_true_max=False)


check_chunked_attention = make_check("chunked_attention")
