"""Chapter 15, what one rank computes: the checks of `ulysses_all_to_all`, `ring_attention_lists` and
`rank_partial_output`, their cases and their catalogued mistakes (chapter 15's first three checks are in ch15.py).

The traps sit in the named cases. ulysses_all_to_all: 2 heads per rank with T/P = 3 positions (a split of the
positions, or a concatenation along the heads, changes the shapes), 4 ranks (chunks in reverse order, heads dealt
round-robin), P = 1, and 6 heads over 4 ranks last (ValueError). ring_attention_lists: d_v != d_k (a scale by
the values' width), P = 1, 4 ranks with and without the causal mask (a lower triangle on every chunk, or none on
the rank's own), chunks of one position. rank_partial_output: the last rank of 4 (its heads, its rows of W_O),
P = 1 (the whole attention without b_O), P = h, float32, a batch, and 6 heads over 4 ranks last (ValueError).
"""

import numpy as np

from mha.checks.compare import ListOf
from mha.checks.inputs import batch, normal, weights
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import RANK_PARTIAL_FORBIDS, RING_LOOP_FORBIDS, ULYSSES_EXCHANGE_FORBIDS
from mha.checks.syntax import Rule

# ulysses_all_to_all: from T/P positions of every head to h/P heads at every position -------------------------------


def held_by_ranks(r, lead, h, n, d, P, dtype=np.float64):
    """P arrays (*lead, h, n, d): each rank's n = T/P positions of every head."""
    return [normal(r, (*lead, h, n, d), dtype) for _ in range(P)]


@cases_for("ulysses_all_to_all", returns=ListOf("rank"), fresh=True,
           may_use="NumPy: slicing, np.split, np.concatenate (not mnp.all_to_all)", forbids=ULYSSES_EXCHANGE_FORBIDS)
def ulysses_all_to_all_cases(r):
    """2 ranks of 2 heads and 3 positions, 4 ranks, P = 1, float32, a batch, and 6 heads over 4 ranks (last)."""
    return [
        Case("P = 2 ranks, h = 4 heads, T/P = 3 positions each, d_head = 2: (h, T/P, d) = (4, 3, 2)",
             (held_by_ranks(r, (), 4, 3, 2, 2),)),
        Case("P = 4 ranks, h = 8 heads (2 per rank), T/P = 2, a batch B = 2", (held_by_ranks(r, (2,), 8, 2, 3, 4),)),
        Case("P = h = 4: one head per rank, T/P = 1 position each", (held_by_ranks(r, (), 4, 1, 3, 4),)),
        Case("P = 1: one rank holds everything already", (held_by_ranks(r, (2,), 3, 5, 2, 1),)),
        Case("float32, P = 2, (B, h, T/P, d) = (2, 6, 2, 4)", (held_by_ranks(r, (2,), 6, 2, 4, 2, np.float32),)),
        Case("6 heads over 4 ranks: a rank cannot hold 1.5 heads, raise ValueError",
             (held_by_ranks(r, (), 6, 2, 2, 4),), raises=ValueError),
    ]


@random_cases_for("ulysses_all_to_all")
def ulysses_all_to_all_random_cases(r):
    """P of 1, 2, 4 or 8 ranks with 1 to 3 heads each, a 4-D batch, and float32."""
    def sizes():
        P = int(r.choice([1, 2, 4, 8]))
        return P * int(r.integers(1, 4)), int(r.integers(1, 4)), int(r.integers(1, 5)), P
    return [
        Case("random: (B, B', h, T/P, d_head)", (held_by_ranks(r, batch(r, 2), *sizes()),)),
        Case("random: float32 (h, T/P, d_head)", (held_by_ranks(r, (), *sizes(), np.float32),)),
    ]


def exchanged(held, heads_of_rank):
    """Rank s's heads `heads_of_rank(s, h, P)` at every position (the mistakes' helper)."""
    P = len(held)
    return [np.concatenate([a[..., list(heads_of_rank(s, a.shape[-3], P)), :, :] for a in held], axis=-2)
            for s in range(P)]


@mistake("ulysses_all_to_all", "rank s must receive the positions in rank order, rank 0's first: concatenate what "
         "ranks 0, 1, ..., P - 1 sent it, so that position t sits at row t")
def ulysses_positions_reversed(held):
    P = len(held)
    return exchanged(held[::-1], lambda s, h, P: range(s * h // P, (s + 1) * h // P))


@mistake("ulysses_all_to_all", "rank s gets a contiguous group of heads, s * h/P .. (s + 1) * h/P - 1, not every "
         "P-th head (s, s + P, ...)")
def ulysses_heads_dealt_out(held):
    return exchanged(held, lambda s, h, P: range(s, h, P))


@mistake("ulysses_all_to_all", "index s of the list is rank s: rank 0 gets the first h/P heads, not the last")
def ulysses_ranks_reversed(held):
    return exchanged(held, lambda s, h, P: range((P - 1 - s) * h // P, (P - s) * h // P))


@mistake("ulysses_all_to_all", "split the heads (axis -3) and join the positions (axis -2): after the exchange a "
         "rank holds h/P heads at all T positions, not all h heads at T/P^2 positions")
def ulysses_axes_swapped(held):
    P = len(held)
    pieces = [np.array_split(a, P, axis=-2) for a in held]  # the positions cut, wrongly
    return [np.concatenate([pieces[r][s] for r in range(P)], axis=-3) for s in range(P)]


@mistake("ulysses_all_to_all", "an all-to-all is an exchange: each rank keeps 1/P of what it held and receives "
         "its heads' positions from every other rank, it does not keep its own positions of them only")
def ulysses_keeps_its_own(held):
    P = len(held)
    return [held[s][..., s * held[s].shape[-3] // P:(s + 1) * held[s].shape[-3] // P, :, :].copy() for s in range(P)]


check_ulysses_all_to_all = make_check("ulysses_all_to_all")

# ring_attention_lists: each rank keeps its queries, the key/value chunks go round -----------------------------------


def chunks_of(r, P, n, d_k, d_v, lead=(), dtype=np.float64):
    """(Q_chunks, K_chunks, V_chunks): P chunks each of n positions, (*lead, n, d_k) or (*lead, n, d_v)."""
    return tuple([normal(r, (*lead, n, d), dtype) for _ in range(P)] for d in (d_k, d_k, d_v))


# attention_partial is permitted: all the key chunks put together and one call per rank would be the answer, no loop.
# (list.append shares its name with np.append, which stays: a rule reads names, not what they belong to.)
RING_LOOP_RULES = (Rule("never put two chunks of keys or values together, a rank holds one at a time: no "
                        "np.concatenate, np.stack, np.vstack, np.hstack, np.block, np.r_ or np.array of the chunks",
                        forbids=("concatenate", "concat", "stack", "vstack", "hstack", "dstack", "column_stack",
                                 "row_stack", "block", "r_", "c_", "array", "asarray", "asanyarray")),)


@cases_for("ring_attention_lists", returns=ListOf("out"),
           may_use="NumPy, mnp.attention_partial and mnp.merge_partials (not mnp.ring_attention)",
           forbids=RING_LOOP_FORBIDS, rules=RING_LOOP_RULES)
def ring_attention_lists_cases(r):
    """4 ranks with d_v != d_k, causal and not, P = 1, chunks of one position, float32, and a batch of heads."""
    return [
        Case("P = 4 ranks of 3 positions, d_k = 4, d_v = 2", chunks_of(r, 4, 3, 4, 2)),
        Case("causal=True, P = 4 ranks of 3 positions", chunks_of(r, 4, 3, 4, 4), {"causal": True}),
        Case("P = 1: the rank holds every key at step 0", chunks_of(r, 1, 5, 3, 3)),
        Case("causal=True, P = 1: the lower triangle of the rank's own chunk", chunks_of(r, 1, 4, 2, 3),
             {"causal": True}),
        Case("causal=True, chunks of one position, P = 5", chunks_of(r, 5, 1, 2, 2), {"causal": True}),
        Case("a batch of heads (B, h, T/P, d) = (2, 3, 2, 4), P = 3", chunks_of(r, 3, 2, 4, 4, (2, 3))),
        Case("float32, P = 2, causal=True", chunks_of(r, 2, 3, 4, 4, dtype=np.float32), {"causal": True}),
    ]


@random_cases_for("ring_attention_lists")
def ring_attention_lists_random_cases(r):
    """1 to 6 ranks of 1 to 4 positions, a 4-D batch, float32, causal or not."""
    def ring():
        return int(r.integers(1, 7)), int(r.integers(1, 5)), int(r.integers(1, 5)), int(r.integers(1, 5))
    return [
        Case("random: a 4-D batch", chunks_of(r, *ring(), batch(r, 2)), {"causal": bool(r.integers(2))}),
        Case("random: float32, causal", chunks_of(r, *ring(), dtype=np.float32), {"causal": True}),
    ]


def partial(q, k, v, mask=None):
    """(out, lse) of q's attention on these keys alone, computed here (the mistakes' own)."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., n, n_k)
    scores = scores if mask is None else np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - top)
    return e @ v / e.sum(axis=-1, keepdims=True), (top + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]


def merge(a, b):
    """The online-softmax merge of two (out, lse), both with some allowed key."""
    lse = np.logaddexp(a[1], b[1])
    return np.exp(a[1] - lse)[..., None] * a[0] + np.exp(b[1] - lse)[..., None] * b[0], lse


def ring_with(Q, K, V, causal, attend, combine=merge, steps=None):
    """The ring loop with one step changed: `attend(q, k, v, mask)`, `combine(state, part)`, `steps` steps."""
    P, n = len(Q), Q[0].shape[-2]
    state = [None] * P
    for step in range(P if steps is None else steps):
        for r in range(P):
            owner = (r - step) % P
            if causal and owner > r:
                continue
            mask = np.tril(np.ones((n, n), dtype=bool)) if causal and owner == r else None
            part = attend(Q[r], K[owner], V[owner], mask)
            state[r] = part if state[r] is None else combine(state[r], part)
    return [out for out, _ in state]


@mistake("ring_attention_lists", "merge each step's (out, lse) with what the rank has so far (merge_partials): "
         "the last step's out alone is the attention on one chunk of keys only")
def ring_keeps_the_last_step(Q_chunks, K_chunks, V_chunks, *, causal=False):
    return ring_with(Q_chunks, K_chunks, V_chunks, causal, partial, lambda state, part: part)


@mistake("ring_attention_lists", "the partial outs do not weigh the same: merge them by their lse (merge_partials), "
         "not by halves (the mean of what you have and the new part)")
def ring_halves_the_steps(Q_chunks, K_chunks, V_chunks, *, causal=False):
    return ring_with(Q_chunks, K_chunks, V_chunks, causal, partial,
                     lambda state, part: ((state[0] + part[0]) / 2, np.logaddexp(state[1], part[1])))


@mistake("ring_attention_lists", "the ring takes P steps, one per chunk of keys: after P - 1 steps a rank has not "
         "yet met the last chunk")
def ring_one_step_short(Q_chunks, K_chunks, V_chunks, *, causal=False):
    return ring_with(Q_chunks, K_chunks, V_chunks, causal, partial, steps=max(len(Q_chunks) - 1, 1))


@mistake("ring_attention_lists", "scale the scores by 1/sqrt(d_k), the width of the queries and keys, not by the "
         "values' width d_v")
def ring_scaled_by_d_v(Q_chunks, K_chunks, V_chunks, *, causal=False):
    def by_d_v(q, k, v, mask=None):
        return partial(q * np.sqrt(q.shape[-1] / v.shape[-1]), k, v, mask)
    return ring_with(Q_chunks, K_chunks, V_chunks, causal, by_d_v)


@mistake("ring_attention_lists", "causal: only the rank's own chunk needs the lower triangle; an earlier rank's "
         "keys all come before its queries, and are seen whole")
def ring_triangle_on_every_chunk(Q_chunks, K_chunks, V_chunks, *, causal=False):
    def triangle(q, k, v, mask=None):
        return partial(q, k, v, np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool)) if causal else mask)
    return ring_with(Q_chunks, K_chunks, V_chunks, causal, triangle)


@mistake("ring_attention_lists", "causal: a query sees the keys at its own position and before, so the rank's own "
         "chunk needs the lower triangle, and a later rank's chunk is skipped")
def ring_causal_ignored(Q_chunks, K_chunks, V_chunks, *, causal=False):
    return ring_with(Q_chunks, K_chunks, V_chunks, False, partial)


check_ring_attention_lists = make_check("ring_attention_lists")

# rank_partial_output: what one rank of tensor parallelism hands to the all-reduce ----------------------------------


def layer(r, d, h, d_head, d_out, lead=(2,), T=3, dtype=np.float64):
    """(X, W_q, W_k, W_v, W_o): X (*lead, T, d), W_q, W_k, W_v (d, h * d_head), W_o (h * d_head, d_out)."""
    return (normal(r, (*lead, T, d), dtype), *(weights(r, d, h * d_head, dtype) for _ in range(3)),
            weights(r, h * d_head, d_out, dtype))


@cases_for("rank_partial_output", forbids=RANK_PARTIAL_FORBIDS,
           may_use="NumPy, mnp.shard_by_heads and mnp.multihead_attention (not mnp.tensor_parallel_attention)")
def rank_partial_output_cases(r):
    """The last of 4 ranks (2 heads each, d_head = 3), rank 0, P = 1, P = h, float32, one sequence, and 6 heads over 4
    ranks (last)."""
    return [
        Case("rank 3 of P = 4: heads 6 and 7 of h = 8 (d_head = 3), W_o's rows 18 .. 23", (*layer(r, 5, 8, 3, 4), 8, 3, 4)),
        Case("rank 0 of P = 2, h = 4 heads of 2, d_out = 6", (*layer(r, 4, 4, 2, 6), 4, 0, 2)),
        Case("P = 1: the whole attention, without b_O", (*layer(r, 6, 2, 3, 6), 2, 0, 1)),
        Case("P = h = 4: rank 2 holds head 2 alone", (*layer(r, 4, 4, 2, 4), 4, 2, 4)),
        Case("float32, rank 1 of P = 2", (*layer(r, 4, 4, 2, 4, dtype=np.float32), 4, 1, 2)),
        Case("one sequence X (T, d) = (4, 6), rank 1 of P = 3, h = 6", (*layer(r, 6, 6, 1, 3, lead=(), T=4), 6, 1, 3)),
        Case("6 heads over 4 ranks: raise ValueError", (*layer(r, 4, 6, 2, 4), 6, 0, 4), raises=ValueError),
    ]


@random_cases_for("rank_partial_output")
def rank_partial_output_random_cases(r):
    """A random rank of 1, 2 or 4 ranks with 1 to 3 heads each, a 4-D batch, float32."""
    def split():
        P = int(r.choice([1, 2, 4]))
        return P * int(r.integers(1, 4)), P
    (h, P), (h32, P32) = split(), split()
    return [
        Case("random: a 4-D batch", (*layer(r, 5, h, 2, 3, batch(r, 2)), h, int(r.integers(P)), P)),
        Case("random: float32", (*layer(r, 4, h32, 3, 4, dtype=np.float32), h32, int(r.integers(P32)), P32)),
    ]


def attend_heads(X, W_q, W_k, W_v, W_o, n_heads, heads, rows_of_o=None):
    """Sum over `heads` of head_i's attention times its rows of W_o (rows_of_o: the rows of W_o used instead)."""
    d_head = W_q.shape[1] // n_heads
    total = 0.0
    for i in heads:
        cols = slice(i * d_head, (i + 1) * d_head)
        q, k, v = X @ W_q[:, cols], X @ W_k[:, cols], X @ W_v[:, cols]  # (..., T, d_head)
        out, _ = partial(q, k, v)
        rows = cols if rows_of_o is None else rows_of_o(i, d_head)
        total = total + out @ W_o[rows]  # (..., T, d_out)
    return total


@mistake("rank_partial_output", "return this rank's part only, before the all-reduce: the heads r * h/P .. "
         "(r + 1) * h/P - 1, not all h heads (the all-reduce adds the others' parts)")
def partial_of_every_head(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    return attend_heads(X, W_q, W_k, W_v, W_o, n_heads, range(n_heads))


@mistake("rank_partial_output", "the all-reduce sums the partial outputs: do not divide by the number of ranks")
def partial_divided_by_p(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    g = n_heads // world_size
    return attend_heads(X, W_q, W_k, W_v, W_o, n_heads, range(rank * g, (rank + 1) * g)) / world_size


@mistake("rank_partial_output", "rank r holds a contiguous group of heads, r * h/P .. (r + 1) * h/P - 1, not every "
         "P-th head (r, r + P, ...)")
def partial_heads_dealt_out(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    return attend_heads(X, W_q, W_k, W_v, W_o, n_heads, range(rank, n_heads, world_size))


@mistake("rank_partial_output", "each of the rank's h/P heads attends alone, with its own softmax and 1/sqrt(d_head): "
         "the rank's columns are h/P heads, not one wide head")
def partial_as_one_wide_head(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    width = W_q.shape[1] // world_size
    cols = slice(rank * width, (rank + 1) * width)
    out, _ = partial(X @ W_q[:, cols], X @ W_k[:, cols], X @ W_v[:, cols])
    return out @ W_o[cols]


@mistake("rank_partial_output", "W_o is split by rows: the rank's heads meet their own rows of W_o, the same block "
         "r * h/P * d_head .. as their columns of W_q, W_k and W_v, not rank 0's rows")
def partial_with_the_first_rows(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    g = n_heads // world_size
    return attend_heads(X, W_q, W_k, W_v, W_o, n_heads, range(rank * g, (rank + 1) * g),
                        lambda i, d_head: slice((i - rank * g) * d_head, (i - rank * g + 1) * d_head))


check_rank_partial_output = make_check("rank_partial_output")
