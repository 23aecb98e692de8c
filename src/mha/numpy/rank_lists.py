"""What one rank computes, with the ranks as a list (chapter 15's exercises).

A list holds one array per rank, and its index is the rank, as in `mha.numpy.sharding`.
These are the steps that chapter 15 asks learners to write themselves:
- `ulysses_all_to_all`: DeepSpeed-Ulysses' exchange, from T/P positions of every head on
  each rank to h/P heads at every position;
- `ring_attention_lists`: the ring loop, each rank keeping its queries while the key/value
  chunks travel round the ring, merged step by step with the online softmax;
- `rank_partial_output`: the partial output O_r W_O^(r) of one rank of tensor parallelism,
  what that rank hands to the all-reduce.

Letters: P ranks (world_size), h heads, T positions, d_head = d_k, d_v the values' width.
"""

import numbers

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array, multihead_attention
from mha.numpy.sharding import all_to_all, attention_partial, check_split, merge_partials, shard_by_heads


def rank_arrays(name, arrays, min_ndim=2):
    """A non-empty list (or tuple) of P float arrays of one shape, one per rank, as arrays."""
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError(f"{name} must be a non-empty list of arrays, one per rank, got {type(arrays).__name__}")
    arrays = [as_float_array(f"{name}[{r}]", a) for r, a in enumerate(arrays)]
    for r, a in enumerate(arrays):
        validate.check_ndim(f"{name}[{r}]", a, min_ndim)
        validate.check_same(f"{name}[0].shape", arrays[0].shape, f"{name}[{r}].shape", a.shape, "the ranks' shapes")
    return arrays


def ulysses_all_to_all(held):
    """Ulysses' all-to-all, simulated: from a split of the sequence to a split of the heads.

    held: a list of P arrays, held[r] of shape (..., h, T/P, d_head): rank r's positions
    r*T/P .. (r+1)*T/P - 1 of every head. Returns a list of P new arrays, rank s's of shape
    (..., h/P, T, d_head): heads s*h/P .. (s+1)*h/P - 1 at all T positions, in order.
    ValueError when P does not divide h.
    """
    held = rank_arrays("held", held, min_ndim=3)
    h, P = check_split(held[0].shape[-3], len(held))
    g = h // P  # heads per rank
    sent = [[a[..., s * g:(s + 1) * g, :, :] for s in range(P)] for a in held]  # sent[r][s]: (..., h/P, T/P, d)
    received = all_to_all(sent)  # received[s][r] = sent[r][s]
    return [np.concatenate(received[s], axis=-2) for s in range(P)]  # (..., h/P, T, d_head), positions in rank order


def check_ring_chunks(Q_chunks, K_chunks, V_chunks, causal):
    """The three lists as arrays: P of each, queries (..., n, d_k), keys (..., n_k, d_k), values (..., n_k, d_v)."""
    Q, K, V = (rank_arrays(n, c) for n, c in (("Q_chunks", Q_chunks), ("K_chunks", K_chunks), ("V_chunks", V_chunks)))
    if not len(Q) == len(K) == len(V):
        raise ValueError(f"one chunk per rank in each list: got {len(Q)} query, {len(K)} key and {len(V)} value "
                         f"chunks")
    validate.check_qkv(Q[0], K[0], V[0])
    if validate.check_causal(causal):
        validate.check_same("Q_chunks[0].shape[-2]", Q[0].shape[-2], "K_chunks[0].shape[-2]", K[0].shape[-2],
                            "the positions per rank of queries and keys (causal: the same positions)")
    return Q, K, V


def ring_attention_lists(Q_chunks, K_chunks, V_chunks, *, causal=False):
    """Ring attention over the P ranks of three lists: each rank's output chunk, a list of P arrays.

    Q_chunks[r], K_chunks[r], V_chunks[r]: (..., T/P, d_k), (..., T/P, d_k), (..., T/P, d_v), rank
    r's positions r*T/P .. (r+1)*T/P - 1. Rank r keeps its queries; at step s = 0 .. P-1 it holds
    the keys and values of rank (r - s) % P, and merges its queries' partial attention on them
    (`attention_partial`) into what it has (`merge_partials`). causal=True: a query sees the keys
    at its position and before (an earlier rank's chunk whole, its own under a lower triangle,
    a later rank's not at all). Returns [out_r (..., T/P, d_v)], the rows of attention over all T.
    """
    Q, K, V = check_ring_chunks(Q_chunks, K_chunks, V_chunks, causal)
    P, n = len(Q), Q[0].shape[-2]
    held = [(r, K[r], V[r]) for r in range(P)]  # (owner, keys, values) that rank r holds at step 0
    state = [None] * P  # rank r's (out, lse) so far
    for step in range(P):
        for r, (owner, keys, values) in enumerate(held):
            if causal and owner > r:
                continue  # every key comes after every query of rank r
            mask = np.tril(np.ones((n, n), dtype=bool)) if causal and owner == r else None  # (n, n)
            part = attention_partial(Q[r], keys, values, mask)
            state[r] = part if state[r] is None else merge_partials(*state[r], *part)
        held = held[-1:] + held[:-1]  # each rank passes what it holds to the next: r now holds r - 1's
    return [out for out, _ in state]


def rank_partial_output(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    """What rank `rank` of P = world_size hands to the all-reduce of tensor parallelism by heads.

    X: (..., T, d); W_q, W_k, W_v: (d, h * d_head); W_o: (h * d_head, d_out); h = n_heads, P
    dividing h. The rank attends with its h/P heads r*h/P .. (r+1)*h/P - 1 and projects with its
    rows of W_o: returns O_r W_o^(r), (..., T, d_out). The sum over the ranks is
    `multihead_attention` without b_o.
    """
    h, P = check_split(n_heads, world_size)
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < P:
        raise ValueError(f"rank must be an int from 0 to world_size - 1 = {P - 1}, got {rank!r}")
    mine = [shard_by_heads(W, h, P)[rank] for W in (W_q, W_k, W_v)]  # (d, h/P * d_head) each
    rows = shard_by_heads(W_o, h, P, axis=0)[rank]  # (h/P * d_head, d_out)
    partial, _ = multihead_attention(X, *mine, rows, h // P)
    return partial  # (..., T, d_out)
