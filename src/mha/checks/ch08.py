"""Chapter 8, attention at scale: the check of `chunked_attention` (keys in chunks,
an online softmax), its cases and its catalogued mistakes."""

import math

import numpy as np

from mha.checks.inputs import batch, causal, different_sizes, far_apart, normal, sizes, with_an_empty_row
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import CHUNKED_ATTENTION_RULES
from mha.checks.routes import CHUNKED_ATTENTION_FORBIDS
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for

# The memory case: T_q = 4096 queries, T_k = 8208 keys in chunks of 32 (the last one 16 keys), and no mask. Its
# (T_q, T_k) scores in float64 take 256.5 MiB, and even an array of T_q x T_k booleans (a mask made whole where none
# is given) takes 32.1 MiB: more than the 24 MiB that a call may take beyond its inputs. A block of scores takes
# 1 MiB, and a few of them at once fit, with room for what the grader's worker counts as well (the inputs it
# receives: about 9 MiB here, measured from outside).
LONG_T_Q, LONG_T_K, LONG_CHUNK = 4096, 8208, 32
LONG_PEAK_BYTES = 24 * 2**20


def long_sequence(r):
    """(Q, K, V) of the memory case: Q (4096, 8), K (8208, 8), V (8208, 4). Query 0's scores are about +1000 (exp
    overflows) and query 1's about -1000 (2000 below query 0's): one maximum for all queries loses query 1."""
    Q, K = r.standard_normal((LONG_T_Q, 8)), r.standard_normal((LONG_T_K, 8))
    K[:, 0] = np.linspace(25.0, 25.1, LONG_T_K)  # query q's scores are 40 * K[j, 0] when Q[q] = 40 sqrt(8) e_0
    Q[:2] = 0.0
    Q[0, 0], Q[1, 0] = 40.0 * math.sqrt(8), -40.0 * math.sqrt(8)  # scores 1000 .. 1004 and -1000 .. -1004
    return Q, K, r.standard_normal((LONG_T_K, 4))


@cases_for("chunked_attention", may_use="NumPy, nothing from mha",  # returns out only: no weights
           forbids=CHUNKED_ATTENTION_FORBIDS, rules=CHUNKED_ATTENTION_RULES)
def chunked_attention_cases(r):
    """Chunks that do and do not divide T, a mask of keys, masked rows and chunks, scores far from 0 and far
    apart, and a long sequence in bounded memory."""
    X = r.standard_normal((2, 5, 4))
    masked = np.ones((2, 5, 5), dtype=bool)
    masked[0, 3] = False  # query 3 of sequence 0 may attend to nothing
    masked[1, :, :2] = False  # sequence 1: the whole first chunk is blocked
    far = np.array([[30.0, 30.0], [-30.0, -30.0], [-29.0, -31.0]])  # scores about 1273, -1273, -1273
    Q_far, K_far = far_apart(r, (2, 3), 4, 4, 3)  # query 0's scores about 1000, the others' near 0
    long_qkv = long_sequence(r)
    return [
        Case("one sequence, chunk does not divide T, a mask of keys (1, T_k) for 6 queries",
             (r.standard_normal((6, 3)), r.standard_normal((7, 3)), r.standard_normal((7, 2))),
             {"mask": np.array([[True, False, True, True, True, False, True]]), "chunk": 3}),
        Case("a batch, chunk divides T", (X, X, r.standard_normal((2, 5, 3))), {"chunk": 5}),
        Case("a fully masked row and a fully masked first chunk, a mask with a batch axis",
             (X, X, r.standard_normal((2, 5, 3))), {"mask": masked, "chunk": 2}),
        Case("scores above 709 in query 0 and near 0 in the others (1000 below), causal",
             (Q_far, K_far, r.standard_normal((2, 3, 4, 2))), {"mask": causal(4), "chunk": 3}),
        Case("very negative scores after a masked chunk",
             (np.array([[30.0, 30.0]]), far, r.standard_normal((3, 2))),
             {"mask": np.array([[False, True, True]]), "chunk": 1}),
        Case(f"a long sequence without a mask: T_q = {LONG_T_Q}, T_k = {LONG_T_K}, chunks of {LONG_CHUNK}, at most "
             f"{LONG_PEAK_BYTES // 2**20} MiB (the T_q x T_k scores alone would take "
             f"{8 * LONG_T_Q * LONG_T_K / 2**20:.1f} MiB, and T_q x T_k booleans "
             f"{LONG_T_Q * LONG_T_K / 2**20:.1f} MiB)", long_qkv, {"chunk": LONG_CHUNK}, peak_bytes=LONG_PEAK_BYTES),
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


def _in_blocks(Q, K, V, mask, chunk, keep_last):
    """The scores (..., T_q, n, chunk) and values (..., n, chunk, d_v) of the n blocks of keys, all at once (the
    mistakes need not save memory): a last, shorter block padded with masked keys, or dropped (keep_last=False)."""
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    T_k = K.shape[-2]
    shape = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2]) + (Q.shape[-2], T_k)
    scores = np.broadcast_to(Q / math.sqrt(Q.shape[-1]) @ np.swapaxes(K, -1, -2), shape)
    scores = np.where(True if mask is None else mask, scores, -np.inf)  # (..., T_q, T_k)
    n = -(-T_k // chunk) if keep_last else T_k // chunk
    extra = n * chunk - T_k  # > 0: keys to pad; < 0: keys to drop
    if extra >= 0:
        scores = np.concatenate([scores, np.full(shape[:-1] + (extra,), -np.inf)], axis=-1)
        V = np.concatenate([V, np.zeros(V.shape[:-2] + (extra, V.shape[-1]))], axis=-2)
    else:
        scores, V = scores[..., :n * chunk], V[..., :n * chunk, :]
    return scores.reshape(shape[:-1] + (n, chunk)), V.reshape(V.shape[:-2] + (n, chunk, V.shape[-1]))


def _online_softmax(Q, K, V, mask, chunk, *, rescale=True, safe=True, keep_last=True, scale_acc=True,
                    keep_true_max=True, shift="row"):
    """Chunked attention with one step left out, as the flags say. `shift`: "row" subtracts each query's
    running maximum (right), "none" nothing (exp overflows above 709), "global" one running maximum for
    all queries (a query far below it underflows to 0). The running state walks over the blocks; the
    exponentials and products of all blocks are computed at once, which is quicker on long sequences."""
    scores, V = _in_blocks(Q, K, V, mask, chunk, keep_last)  # (..., T_q, n, c), (..., n, c, d_v)
    n = scores.shape[-2]
    if shift == "row":
        block_max = scores.max(axis=-1)  # (..., T_q, n)
    else:  # one maximum per block for every query ("global"), or none
        every_query = tuple(range(scores.ndim - 2)) + (scores.ndim - 1,)
        block_max = np.broadcast_to(scores.max(axis=every_query) if shift == "global" else 0.0, scores.shape[:-1])
    row_max, refs, factors = np.full(scores.shape[:-2], -np.inf), [], []
    for b in range(n):
        new_max = np.maximum(row_max, block_max[..., b]) if shift != "none" else np.zeros_like(row_max)
        ref = np.where(np.isfinite(new_max), new_max, 0) if safe else new_max
        factors.append(np.exp(row_max - ref) if rescale else np.ones_like(row_max))
        refs.append(ref)
        row_max = new_max if keep_true_max else ref
    p = np.exp(scores - np.stack(refs, axis=-1)[..., None])  # (..., T_q, n, c)
    block_sums = p.sum(axis=-1)  # (..., T_q, n)
    block_outs = np.moveaxis(np.moveaxis(p, -2, -3) @ V, -3, -2)  # (..., n, T_q, c) @ (..., n, c, d_v), back
    row_sum, acc = np.zeros(scores.shape[:-2]), np.zeros(block_outs.shape[:-2] + block_outs.shape[-1:])
    for b, factor in enumerate(factors):
        row_sum = row_sum * factor + block_sums[..., b]
        acc = acc * (factor[..., None] if scale_acc else 1.0) + block_outs[..., b, :]
    row_sum = row_sum[..., None]
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


@mistake("chunked_attention", "exp overflows on scores above 709: keep a running maximum per query, subtract it "
         "before exponentiating, and rescale what you have when it grows")
def chunked_without_max(Q, K, V, mask=None, chunk=256):
    with np.errstate(over="ignore", invalid="ignore"):
        return _online_softmax(Q, K, V, mask, chunk, shift="none")


@mistake("chunked_attention", "keep one running maximum per query, shape (..., T_q), not one for all the "
         "queries: a query whose scores are 1000 below another's underflows to exp(-1000) = 0 and loses them all")
def chunked_one_max_for_all_queries(Q, K, V, mask=None, chunk=256):
    with np.errstate(under="ignore"):
        return _online_softmax(Q, K, V, mask, chunk, shift="global")


check_chunked_attention = make_check("chunked_attention")
