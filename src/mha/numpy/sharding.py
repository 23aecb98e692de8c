"""Heads across devices, with the ranks simulated as a list (chapter 15).

One process computes what every rank of a parallel run computes: a list holds one
entry per rank, and its index is the rank. Nothing is sent. A collective is a function
of lists (`all_reduce`, `all_to_all`), and the ring passes its list of key/value blocks
one place on. Each scheme equals one process's attention; `mha.distributed` runs the
same schemes in real processes.

Letters: P ranks (world_size), h query heads, h_kv key/value heads, d = d_model, B batch,
T sequence length.
- Tensor parallelism by heads (Megatron-LM): rank r holds heads r*h/P .. (r+1)*h/P - 1,
  that is the columns of W_Q, W_K, W_V that compute them and the rows of W_O that read
  them. The partial outputs O_r W_O[r] are summed over the ranks (an all-reduce).
- Ulysses (DeepSpeed-Ulysses): each rank holds T/P positions of every head. An all-to-all
  trades this split by positions for a split by heads (h/P heads, all T positions), each
  rank attends, and a second all-to-all trades back.
- Ring attention: 2P chunks of T/(2P) positions, two per rank ("contiguous": chunks 2r and
  2r+1; "zigzag": chunks r and 2P-1-r). At step s, rank r holds the keys and values of rank
  (r - s) % P, and merges what its queries take from them with the online softmax.
- Payload: the elements a rank hands to collectives per attention layer (`payload_per_layer`);
  what the algorithms then put on the wire (`wire_bytes`, `all_reduce_bytes`).
"""

import math
import numbers

import numpy as np

from mha import validate
from mha.numpy.attention import (
    as_float_array, as_mask, at_least_float32, matrix, multihead_attention, scaled_dot_product_attention, transpose,
)

LAYOUTS = ("contiguous", "zigzag")
SCHEMES = ("tensor", "ulysses", "ring")


def check_split(n_heads, world_size, what="n_heads"):
    """(h, P) as ints, when P divides h: a rank holds whole heads, never a piece of one."""
    h = validate.check_int(what, n_heads)
    P = validate.check_int("world_size", world_size)
    if h % P:
        raise ValueError(f"{what}={h} is not divisible by world_size={P}: each rank holds a whole number of "
                         f"heads ({h} = {h // P} * {P} + {h % P})")
    return h, P


def check_axis(axis, ndim):
    """`axis` as an index from 0 to ndim - 1."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an integer, got {type(axis).__name__} {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} does not exist in W of {ndim} dimension(s): expected -{ndim} <= axis < {ndim}")
    return int(axis) % ndim


def shard_by_heads(W, n_heads, world_size, *, axis=-1):
    """The shards of W held by ranks 0 .. P-1 when the h heads are split across P ranks: a list of P arrays.

    W: (d_in, h * d_head) with axis=-1 (W_Q, W_K, W_V): split by columns; rank r gets the
    columns of heads r*h/P .. (r+1)*h/P - 1, shape (d_in, h/P * d_head). W: (h * d_head, d_out)
    with axis=0 (W_O): split by rows, (h/P * d_head, d_out) each. A bias (h * d_head,) splits
    like the columns. Any array works whose `axis` holds h blocks of d_head, head after head.
    Each shard is a copy: a rank holds its own memory.
    """
    W = as_float_array("W", W)
    validate.check_ndim("W", W, 1)
    h, P = check_split(n_heads, world_size)
    axis = check_axis(axis, W.ndim)
    validate.check_divisible(W.shape[axis], h, f"W.shape[{axis}]")
    return [block.copy() for block in np.split(W, P, axis=axis)]  # P blocks of h/P heads, in rank order


def all_reduce(partials):
    """The all-reduce (sum), simulated: a list of P arrays of one shape in, P copies of their sum out."""
    if not isinstance(partials, (list, tuple)) or not partials:
        raise TypeError(f"partials must be a non-empty list of arrays, one per rank, got {partials!r:.60}")
    arrays = [as_float_array(f"partials[{r}]", a) for r, a in enumerate(partials)]
    for r, a in enumerate(arrays):
        validate.check_same("partials[0].shape", arrays[0].shape, f"partials[{r}].shape", a.shape, "the ranks' shapes")
    total = arrays[0].astype(np.result_type(*arrays))  # a copy
    for a in arrays[1:]:
        total += a  # in rank order, as a ring adds them
    return [total.copy() for _ in arrays]


def all_to_all(chunks):
    """The all-to-all, simulated: chunks[r][s] is what rank r sends to rank s; returns received, where
    received[s][r] = chunks[r][s] (the transpose of the list of lists)."""
    if not isinstance(chunks, (list, tuple)) or not chunks:
        raise TypeError(f"chunks must be a non-empty list of lists, one per rank, got {type(chunks).__name__}")
    P = len(chunks)
    lengths = [len(row) if isinstance(row, (list, tuple)) else None for row in chunks]
    if lengths != [P] * P:
        raise ValueError(f"chunks must be a list of P = {P} lists of {P} pieces each (chunks[r][s] goes from "
                         f"rank r to rank s), got lists of lengths {lengths}")
    return [[chunks[r][s] for r in range(P)] for s in range(P)]


def heads_mask(mask, shape, causal=False):
    """`mask` (or None) broadcast to `shape` (..., h, T_q, T_k), and with causal=True also the causal mask."""
    mask = None if mask is None else np.broadcast_to(as_mask(mask, shape), shape)  # a view
    if validate.check_causal(causal):
        lower = np.tril(np.ones(shape[-2:], dtype=bool))  # (T_q, T_k)
        mask = np.broadcast_to(lower, shape) if mask is None else mask & lower
    return mask


def tensor_parallel_attention(X, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                              n_heads, world_size, mask=None):
    """Multi-head self-attention split by heads over P simulated ranks: returns (out, partials).

    X: (..., T, d); W_q, W_k, W_v: (d, h * d_head); W_o: (h * d_head, d_out); biases as in
    `multihead_attention`; mask (True = may attend) broadcasts to (..., h, T, T). Rank r attends
    with its h/P heads and projects with its rows of W_o: partials[r] = O_r W_o[r], (..., T, d_out),
    before the all-reduce. out = their sum + b_o (added once, not P times) = `multihead_attention`.
    """
    X = as_float_array("X", X)
    validate.check_sequence("X", X)
    h, P = check_split(n_heads, world_size)
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        validate.check_divisible(matrix(name, W, X.shape[-1], "X").shape[1], h, f"the width of {name}")
    mask = heads_mask(mask, (*X.shape[:-2], h, X.shape[-2], X.shape[-2]))  # (..., h, T, T)
    columns = [None if a is None else shard_by_heads(a, h, P) for a in (W_q, W_k, W_v, b_q, b_k, b_v)]
    rows = shard_by_heads(matrix("W_o", W_o, np.shape(W_v)[1], "the merged heads"), h, P, axis=0)
    g = h // P  # heads per rank
    partials = []
    for r in range(P):
        Wq, Wk, Wv, bq, bk, bv = (None if c is None else c[r] for c in columns)
        rank_mask = None if mask is None else mask[..., r * g:(r + 1) * g, :, :]  # (..., h/P, T, T)
        partial, _ = multihead_attention(X, Wq, Wk, Wv, rows[r], g, mask=rank_mask, b_q=bq, b_k=bk, b_v=bv)
        partials.append(partial)  # (..., T, d_out)
    out = all_reduce(partials)[0]  # every rank holds the sum; this is rank 0's
    if b_o is not None:
        b_o = as_float_array("b_o", b_o)
        validate.check_vector("b_o", b_o, out.shape[-1])
        out += b_o
    return out, partials


def check_heads_and_positions(Q, K, V):
    """Q, K, V as floats of shape (..., h, T, d_head), the same heads and positions (V may differ in width)."""
    Q, K, V = (as_float_array(n, a) for n, a in (("Q", Q), ("K", K), ("V", V)))
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        validate.check_ndim(name, a, 3)
    validate.check_same("Q.shape", Q.shape, "K.shape", K.shape, "the shapes (..., h, T, d_head) of queries and keys")
    validate.check_same("K.shape[:-1]", K.shape[:-1], "V.shape[:-1]", V.shape[:-1], "the keys' and values' heads")
    return Q, K, V


def ulysses_attention(Q, K, V, *, world_size, mask=None, causal=False):
    """Attention with the sequence split over P simulated ranks and an all-to-all to a split by heads.

    Q, K, V: (..., h, T, d_head), P dividing h and T. Rank r starts with positions r*T/P ..
    (r+1)*T/P - 1 of every head; an all-to-all gives rank s heads s*h/P .. (s+1)*h/P - 1 at every
    position; rank s attends; a second all-to-all gives each rank its positions back. Returns out
    (..., h, T, d_head), equal to `scaled_dot_product_attention(Q, K, V, mask)`.
    """
    Q, K, V = check_heads_and_positions(Q, K, V)
    h, P = check_split(Q.shape[-3], world_size)
    T, _ = check_split(Q.shape[-2], P, "T")
    mask = heads_mask(mask, (*Q.shape[:-1], T), causal)  # (..., h, T, T)
    n, g = T // P, h // P  # positions per rank, heads per rank
    held = [[a[..., r * n:(r + 1) * n, :] for a in (Q, K, V)] for r in range(P)]  # (..., h, T/P, d) each

    def by_heads(x):  # what a rank sends to ranks 0 .. P-1: its positions of their heads
        return [x[..., s * g:(s + 1) * g, :, :] for s in range(P)]  # (..., h/P, T/P, d) each
    received = [all_to_all([by_heads(held[r][i]) for r in range(P)]) for i in range(3)]  # q, k, v
    outs = []
    for s in range(P):
        q, k, v = (np.concatenate(received[i][s], axis=-2) for i in range(3))  # (..., h/P, T, d)
        rank_mask = None if mask is None else mask[..., s * g:(s + 1) * g, :, :]  # (..., h/P, T, T)
        outs.append(scaled_dot_product_attention(q, k, v, rank_mask)[0])  # (..., h/P, T, d_v)
    back = all_to_all([[o[..., r * n:(r + 1) * n, :] for r in range(P)] for o in outs])  # back[r][s]: rank s's heads
    mine = [np.concatenate(back[r], axis=-3) for r in range(P)]  # rank r: (..., h, T/P, d_v)
    return np.concatenate(mine, axis=-2)  # (..., h, T, d_v)


def chunk_ids(world_size, layout):
    """The two chunks (of 2P) that each rank holds: [(a, b) for ranks 0 .. P-1]."""
    P = validate.check_int("world_size", world_size)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    if layout == "contiguous":
        return [(2 * r, 2 * r + 1) for r in range(P)]
    return [(r, 2 * P - 1 - r) for r in range(P)]  # one early chunk and one late: the causal work balances


def sequence_chunks(T, world_size, layout):
    """The global positions each rank holds in ring attention: a list of P arrays of T/P positions.

    The sequence is cut into 2P chunks of T/(2P) positions; "contiguous": rank r holds chunks 2r
    and 2r+1; "zigzag": chunks r and 2P-1-r.
    """
    T = validate.check_int("T", T)
    P = validate.check_int("world_size", world_size)
    ids = chunk_ids(P, layout)
    if T % (2 * P):
        raise ValueError(f"T={T} is not divisible by 2 * world_size = {2 * P}: the ring cuts the sequence into "
                         f"{2 * P} equal chunks, two per rank")
    c = T // (2 * P)
    return [np.concatenate([np.arange(a * c, (a + 1) * c), np.arange(b * c, (b + 1) * c)]) for a, b in ids]


def attention_partial(Q, K, V, mask=None):
    """Attention of the queries on these keys only: (out, lse), the part the online softmax merges.

    Q: (..., T_q, d_k), K: (..., T_k, d_k), V: (..., T_k, d_v); mask broadcasts to (..., T_q, T_k).
    out (..., T_q, d_v): softmax over these keys, times V. lse (..., T_q): log of the sum of exp(scores)
    over the allowed keys; a row with none gets lse = -inf and out = 0.
    """
    Q, K, V = (as_float_array(n, a) for n, a in (("Q", Q), ("K", K), ("V", V)))
    batch = validate.check_qkv(Q, K, V)
    mask = as_mask(mask, (*batch, Q.shape[-2], K.shape[-2]))
    dtype = np.result_type(Q, K, V)
    Q, K, V = (at_least_float32(a) for a in (Q, K, V))
    scores = (Q / math.sqrt(Q.shape[-1])) @ transpose(K)  # (..., T_q, T_k)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)  # (..., T_q, 1)
    top = np.where(np.isfinite(top), top, 0)  # a row with no allowed key: avoid -inf - (-inf)
    e = np.exp(scores - top)  # 0 where masked
    total = e.sum(axis=-1, keepdims=True)  # (..., T_q, 1)
    out = np.divide(e @ V, total, out=np.zeros((*total.shape[:-1], V.shape[-1]), dtype=e.dtype), where=total > 0)
    with np.errstate(divide="ignore"):  # log 0 = -inf, as it should
        lse = (top + np.log(total))[..., 0]  # (..., T_q)
    return out.astype(dtype, copy=False), lse.astype(dtype, copy=False)


def merge_partials(out_a, lse_a, out_b, lse_b):
    """The online-softmax merge of two partial attentions over disjoint keys: (out, lse).

    out_a, out_b: (..., T, d_v); lse_a, lse_b: (..., T). lse = log(e^lse_a + e^lse_b), and
    out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b: each part weighted by its share of the
    softmax's mass. A side with lse = -inf (no allowed key) weighs 0; a row where both are -inf
    stays out = 0, lse = -inf. No exp of an lse itself is taken: lse = 1e4 is fine.
    """
    out_a, lse_a, out_b, lse_b = (as_float_array(n, a) for n, a in
                                  (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)))
    validate.check_ndim("out_a", out_a, 1)
    validate.check_same("out_a.shape", out_a.shape, "out_b.shape", out_b.shape, "the two parts' shapes")
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        validate.check_same("out_a.shape[:-1]", out_a.shape[:-1], f"{name}.shape", lse.shape,
                            "the rows of out (..., T, d_v) and of lse (..., T)")
    lse = np.logaddexp(lse_a, lse_b)  # (..., T): -inf only where both are -inf
    finite = np.where(np.isneginf(lse), 0, lse)  # such a row: weights exp(-inf - 0) = 0, no NaN
    weight_a = np.exp(lse_a - finite)[..., None]  # (..., T, 1)
    weight_b = np.exp(lse_b - finite)[..., None]
    out = weight_a * out_a + weight_b * out_b
    return out.astype(np.result_type(out_a, out_b, lse_a, lse_b), copy=False), lse


def check_ring_inputs(Q, K, V, key_padding_mask):
    """Q, K, V (B, h, T, d_head) as floats, and the key padding mask (B, T) as booleans (or None)."""
    Q, K, V = check_heads_and_positions(Q, K, V)
    validate.check_ndim("Q", Q, 4, 4)
    if key_padding_mask is None:
        return Q, K, V, None
    keep = np.asarray(key_padding_mask)
    if keep.dtype != bool:
        raise TypeError(f"key_padding_mask must be boolean (True = may attend), got dtype {keep.dtype}")
    validate.check_same("key_padding_mask.shape", keep.shape, "(B, T)", (Q.shape[0], Q.shape[2]),
                        "the key padding mask's shape and the keys' (B, T)")
    return Q, K, V, keep


def chunk_pair_mask(q_chunk, k_chunk, c, causal, real):
    """The mask (None, (c, c) or (B, 1, c, c)) of one chunk of queries against one chunk of keys."""
    mask = np.tril(np.ones((c, c), dtype=bool)) if causal and q_chunk == k_chunk else None  # the diagonal
    if real is not None:
        pad = real[:, None, None, :]  # (B, 1, 1, c): the real keys of this chunk
        mask = pad if mask is None else mask & pad
    return mask


def attend_to_held(queries, my_chunks, held, state, causal):
    """One step of rank r: its two query chunks attend to the key/value chunks it holds now, and each
    result is merged into `state` (a list of two (out, lse)). Returns how many chunk pairs it computed."""
    keys, values, real, key_chunks = held
    c = queries.shape[-2] // 2
    computed = 0
    for i, q_chunk in enumerate(my_chunks):
        q = queries[..., i * c:(i + 1) * c, :]  # (B, h, c, d)
        for j, k_chunk in enumerate(key_chunks):
            if causal and k_chunk > q_chunk:
                continue  # every key comes after every query: masked entirely, skipped
            keys_j = slice(j * c, (j + 1) * c)
            mask = chunk_pair_mask(q_chunk, k_chunk, c, causal, None if real is None else real[:, keys_j])
            part = attention_partial(q, keys[..., keys_j, :], values[..., keys_j, :], mask)
            state[i] = merge_partials(*state[i], *part)
            computed += 1
    return computed


def pass_along(held):
    """One step of the ring: each rank sends what it holds to the next, so rank r now holds what rank r - 1 held."""
    return held[-1:] + held[:-1]


def ring_attention(Q, K, V, *, world_size, layout="zigzag", causal=False, key_padding_mask=None):
    """Ring attention over P simulated ranks: returns (out, chunk_pairs).

    Q, K, V: (B, h, T, d_head), 2P dividing T; key_padding_mask (B, T), True = a real key.
    Every rank starts with its two chunks of Q, K, V (`sequence_chunks`); at step s = 0 .. P-1
    rank r holds the keys and values of rank (r - s) % P, skips the chunk pairs that causality
    masks entirely, and merges with `merge_partials`. out (B, h, T, d_head) equals
    `scaled_dot_product_attention`; chunk_pairs[r] is how many (query chunk, key chunk) pairs
    rank r computed: 4r + 3 (contiguous, causal), 2P + 1 (zigzag, causal), 4P (not causal).
    """
    Q, K, V, keep = check_ring_inputs(Q, K, V, key_padding_mask)
    causal = validate.check_causal(causal)
    P = validate.check_int("world_size", world_size)
    positions, chunks = sequence_chunks(Q.shape[-2], P, layout), chunk_ids(P, layout)
    held = [(K[..., pos, :], V[..., pos, :], None if keep is None else keep[:, pos], chunks[r])
            for r, pos in enumerate(positions)]  # what rank r starts with: (B, h, T/P, d) ...
    empty = (np.zeros((*Q.shape[:-2], Q.shape[-2] // (2 * P), V.shape[-1]), dtype=np.result_type(Q, V)),
             np.full((*Q.shape[:-2], Q.shape[-2] // (2 * P)), -np.inf, dtype=np.result_type(Q, V)))
    state = [[empty, empty] for _ in range(P)]  # per rank, per query chunk: (out, lse) so far
    chunk_pairs = [0] * P
    for step in range(P):
        held = pass_along(held) if step else held  # at step s, rank r holds what rank (r - s) % P started with
        for r, pos in enumerate(positions):
            chunk_pairs[r] += attend_to_held(Q[..., pos, :], chunks[r], held[r], state[r], causal)
    out = np.empty((*Q.shape[:-1], V.shape[-1]), dtype=empty[0].dtype)  # (B, h, T, d_v)
    for r, pos in enumerate(positions):
        out[..., pos, :] = np.concatenate([o for o, _ in state[r]], axis=-2)
    return out, chunk_pairs


def all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    """The bytes one rank sends in a ring all-reduce of n_elements: 2 (P - 1) / P * n * bytes_per_element.

    A reduce-scatter (P - 1 steps, each sending n/P elements) then an all-gather (P - 1 steps more).
    A rank alone (P = 1) sends nothing. Returns a float: the share is seldom a whole number of bytes.
    """
    n = validate.check_int("n_elements", n_elements, minimum=0)
    P = validate.check_int("world_size", world_size)
    b = validate.check_int("bytes_per_element", bytes_per_element)
    return 2 * (P - 1) * n * b / P


def check_scheme(scheme, P, T, h, h_kv):
    """Refuse a scheme that cannot use P ranks on these sizes."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if h % h_kv:
        raise ValueError(f"n_heads={h} is not divisible by n_kv_heads={h_kv}: each key/value head serves a group")
    if scheme in ("tensor", "ulysses"):
        check_split(h, P)
        if h_kv % P and P % h_kv:
            raise ValueError(f"n_kv_heads={h_kv} and world_size={P}: P must divide h_kv, or h_kv divide P "
                             f"(each key/value head then replicated on P / h_kv ranks)")
    if scheme == "ulysses":
        check_split(T, P, "seq_len")
    if scheme == "ring" and T % (2 * P):
        raise ValueError(f"seq_len={T} is not divisible by 2 * world_size = {2 * P}: the ring cuts it into 2P chunks")


def payload_per_layer(scheme, *, world_size, batch, seq_len, d_model, n_heads, n_kv_heads, d_head,
                      bytes_per_element=None):
    """What one rank hands to collectives per attention layer: {"forward": {op: n}, "backward": {op: n}}.

    n counts elements, or bytes when bytes_per_element is given. It is the payload a wrapper sees,
    not the wire (see `wire_bytes`). "tensor": one all-reduce of B*T*d each way. "ulysses": all-to-alls
    of q, k, v and out, B*(T/P)*d_head*(2h + 2m), each way, with m = h_kv when P divides h_kv, else m = P
    (the key/value heads are repeated to one per rank first). "ring": forward, P - 1 sends of k and v,
    (P - 1) * 2*B*h_kv*(T/P)*d_head; backward, k and v travel again and their gradients dk, dv travel
    P steps to return home: (2 (P - 1) + 1) times that block (nothing at P = 1).
    """
    P, B, T, d, h, h_kv, d_head = (validate.check_int(n, v) for n, v in (
        ("world_size", world_size), ("batch", batch), ("seq_len", seq_len), ("d_model", d_model),
        ("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("d_head", d_head)))
    check_scheme(scheme, P, T, h, h_kv)
    unit = 1 if bytes_per_element is None else validate.check_int("bytes_per_element", bytes_per_element)
    if scheme == "tensor":
        forward = backward = {"all_reduce": B * T * d}
    elif scheme == "ulysses":
        moved = h_kv if h_kv % P == 0 else P  # P = 4, h_kv = 2: k and v go out as 4 heads, one per rank
        forward = backward = {"all_to_all": B * (T // P) * d_head * (2 * h + 2 * moved)}
    else:
        block = 2 * B * h_kv * (T // P) * d_head  # k and v of one rank's T/P positions
        home = block if P > 1 else 0  # one rank alone keeps its gradients: nothing to bring home
        forward, backward = {"send": (P - 1) * block}, {"send": 2 * (P - 1) * block + home}
    return {"forward": {op: n * unit for op, n in forward.items()},
            "backward": {op: n * unit for op, n in backward.items()}}


def wire_bytes(payload, world_size, bytes_per_element=4):
    """The bytes one rank puts on the wire for a payload in elements ({pass: {op: elements}}, as
    `payload_per_layer` gives it): a ring all-reduce sends 2(P - 1)/P of its payload, an all-to-all
    (P - 1)/P (a rank keeps its own piece), a send all of it. Returns {pass: {op: bytes}}."""
    P = validate.check_int("world_size", world_size)
    b = validate.check_int("bytes_per_element", bytes_per_element)
    shares = {"all_reduce": 2 * (P - 1) / P, "all_to_all": (P - 1) / P, "send": 1.0}
    if not isinstance(payload, dict) or not all(isinstance(ops, dict) for ops in payload.values()):
        raise TypeError(f"payload must be a dict {{pass: {{op: elements}}}}, got {type(payload).__name__}")
    unknown = {op for ops in payload.values() for op in ops} - set(shares)
    if unknown:
        raise ValueError(f"unknown collective(s) {sorted(unknown)}: expected {sorted(shares)}")
    return {direction: {op: shares[op] * n * b for op, n in ops.items()} for direction, ops in payload.items()}
