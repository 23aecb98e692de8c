"""Chapter 15, heads across devices: the checks of `shard_by_heads`, `merge_partials` and `all_reduce_bytes`,
their cases and their catalogued mistakes.

The traps sit in the named cases. shard_by_heads: heads of d_head > 1 columns (a (d_head, h) reshape picks
the wrong columns), W_O split by rows (axis=0) with a width that the wrong axis also splits, P from 1 to 8,
and 6 heads over 4 ranks, which np.split cuts into halves of heads without complaint (the function must
raise ValueError there; that case comes last, after every case with an answer). merge_partials: first one
head's out (T, d_v) with T = d_v, where a weight (T,) that forgot its [..., None] broadcasts without an
error, along the wrong axis (a batch would raise instead); -inf on either side and on both; lse of about
+1e4 and -1e4, where exp(lse) overflows or underflows. all_reduce_bytes: P = 4 first (where 2/P and
(P - 1)/P differ from each other and from 2(P - 1)/P), a P whose share is no whole number of bytes, P = 1.
"""

import math

import numpy as np

from mha.checks.compare import ListOf
from mha.checks.inputs import batch, normal, sizes, weights
from mha.checks.routes import BYTES_ROUTES, MERGE_PARTIALS_FORBIDS, SHARD_ROUTES
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for

# shard_by_heads: each rank's columns (or rows) of a projection ------------------------------------------------


def projection(r, rows, cols, dtype=np.float64):
    """A (rows, cols) weight matrix: W_Q, W_K, W_V with cols = h * d_head, or W_O with rows = h * d_head."""
    return weights(r, rows, cols, dtype)



@cases_for("shard_by_heads", returns=ListOf("shard"),  # "Return a list of P arrays ..., as a copy."
           may_use="NumPy: np.split, reshape and slicing (not mnp.heads_from_fused)", forbids=SHARD_ROUTES, fresh=True)
def shard_by_heads_cases(r):
    """W_Q with heads of 3 columns, P = 1, 2, 4 and 8, W_O by rows, a bias, float32, a stack of layers, and 6 heads
    over 4 ranks (last: it must raise ValueError)."""
    return [
        Case("W_Q (d, h * d_head) = (8, 12): h = 4 heads of 3 columns, P = 2 ranks", (projection(r, 8, 12), 4, 2)),
        Case("P = h = 4: one head of 2 columns per rank", (projection(r, 6, 8), 4, 4)),
        Case("P = 1: one rank holds every head", (projection(r, 5, 8), 2, 1)),
        Case("P = 8 ranks, h = 16 heads of 2 columns, float32", (projection(r, 4, 32, np.float32), 16, 8)),
        Case("W_O (h * d_head, d_out) = (12, 6), split by rows: axis=0, h = 4, P = 2",
             (projection(r, 12, 6), 4, 2), {"axis": 0}),
        Case("W_O float32, (16, 8): h = 8 heads of 2 rows, P = 4, axis=0",
             (projection(r, 16, 8, np.float32), 8, 4), {"axis": 0}),
        Case("a bias b_Q (h * d_head,) = (12,): h = 6, P = 3", (0.5 * r.standard_normal(12), 6, 3)),
        Case("axis=1, the columns by their positive index: h = 4, P = 2", (projection(r, 3, 12), 4, 2), {"axis": 1}),
        Case("W_Q of 3 layers stacked, (3, d, h * d_head) = (3, 4, 18): h = 6, P = 2",
             (normal(r, (3, 4, 18)), 6, 2)),
        Case("6 heads over 4 ranks: a rank cannot hold 1.5 heads, raise ValueError (np.split of the 12 columns "
             "by 4 would cut heads in two)", (projection(r, 4, 12), 6, 4), raises=ValueError),
    ]


@random_cases_for("shard_by_heads")
def shard_by_heads_random_cases(r):
    """W_Q and W_O of P = 1, 2, 4 or 8 ranks with 1 to 3 heads each, a float32 bias, and projected queries of a
    4-D batch split by heads."""
    def heads():  # (h, P, d_head)
        P = int(r.choice([1, 2, 4, 8]))
        return P * int(r.integers(1, 4)), P, int(r.integers(2, 5))
    (h, P, d_head), (h_o, P_o, d_head_o), (h_b, P_b, d_head_b), (h_x, P_x, d_head_x) = (heads() for _ in range(4))
    d = int(r.integers(2, 7))
    return [
        Case("random: W_Q, W_K or W_V (d, h * d_head)", (projection(r, d, h * d_head), h, P)),
        Case("random: W_O (h * d_head, d_out), axis=0", (projection(r, h_o * d_head_o, d), h_o, P_o), {"axis": 0}),
        Case("random: a float32 bias (h * d_head,)", (normal(r, h_b * d_head_b, np.float32), h_b, P_b)),
        Case("random: projected queries of a 4-D batch (B, B', T, h * d_head)",
             (normal(r, batch(r, 2) + (int(r.integers(1, 4)), h_x * d_head_x)), h_x, P_x)),
    ]


def each_rank(W, n_heads, world_size, axis, heads_of_rank):
    """The shards that a rule `heads_of_rank(r) -> head indices` gives, with W's head axis read as h blocks of
    d_head, head after head (the mistakes' helper)."""
    moved = np.moveaxis(W, axis, -1)  # (..., h * d_head)
    blocks = moved.reshape(*moved.shape[:-1], n_heads, -1)  # (..., h, d_head)
    shards = [blocks[..., list(heads_of_rank(r)), :] for r in range(world_size)]  # (..., h/P, d_head) each
    return [np.moveaxis(s.reshape(*s.shape[:-2], -1), -1, axis) for s in shards]  # back to W's layout


@mistake("shard_by_heads", "the width holds h blocks of d_head, head after head: reshape it to (h, d_head), not "
         "(d_head, h); head i owns columns i * d_head .. (i + 1) * d_head - 1")
def shard_heads_interleaved(W, n_heads, world_size, *, axis=-1):
    moved = np.moveaxis(W, axis, -1)  # (..., h * d_head)
    wrong = moved.reshape(*moved.shape[:-1], -1, n_heads)  # (..., d_head, h): column j read as head j % h
    g = n_heads // world_size
    shards = [wrong[..., r * g:(r + 1) * g].reshape(*moved.shape[:-1], -1) for r in range(world_size)]
    return [np.moveaxis(s, -1, axis) for s in shards]


@mistake("shard_by_heads", "split the axis you are given: W_O (h * d_head, d_out) is split by its rows, axis=0; "
         "only W_Q, W_K, W_V and their biases are split by columns")
def shard_always_the_columns(W, n_heads, world_size, *, axis=-1):
    return np.split(W, world_size, axis=-1)


@mistake("shard_by_heads", "W_Q, W_K and W_V (d_in, h * d_head) hold their heads in the columns (axis=-1): "
         "splitting the rows cuts the input's d_in features instead")
def shard_always_the_rows(W, n_heads, world_size, *, axis=-1):
    return np.split(W, world_size, axis=0)


@mistake("shard_by_heads", "return the shards in rank order: index r of the list is rank r, which holds heads "
         "r * h/P .. (r + 1) * h/P - 1")
def shard_ranks_reversed(W, n_heads, world_size, *, axis=-1):
    return np.split(W, world_size, axis=axis)[::-1]


@mistake("shard_by_heads", "return one shard per rank (world_size of them), each with h/P heads, not one shard "
         "per head")
def shard_one_per_head(W, n_heads, world_size, *, axis=-1):
    return np.split(W, n_heads, axis=axis)


@mistake("shard_by_heads", "h // world_size is the number of heads in each shard; the number of shards is "
         "world_size")
def shard_by_heads_per_rank(W, n_heads, world_size, *, axis=-1):
    return np.split(W, n_heads // world_size, axis=axis)


@mistake("shard_by_heads", "a rank holds a contiguous group of heads, r * h/P .. (r + 1) * h/P - 1, not every "
         "P-th head (r, r + P, r + 2P, ...)")
def shard_heads_dealt_out(W, n_heads, world_size, *, axis=-1):
    return each_rank(W, n_heads, world_size, axis, lambda r: range(r, n_heads, world_size))


check_shard_by_heads = make_check("shard_by_heads")

# merge_partials: the online softmax's merge of two partial attentions -------------------------------------------


def attention_on(Q, K, V):
    """(out, lse) of Q's attention on these keys alone, computed here (never by the learner's library)."""
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])  # (..., T, T_k)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - top)
    return e @ V / e.sum(axis=-1, keepdims=True), (top + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]


def halves(Q, K, V, cut):
    """(out_a, lse_a, out_b, lse_b): the queries' attention on the keys before `cut` and on those after."""
    return (*attention_on(Q, K[..., :cut, :], V[..., :cut, :]), *attention_on(Q, K[..., cut:, :], V[..., cut:, :]))


def parts(r, shape, dtype=np.float64, centre=0.0):
    """(out_a, lse_a, out_b, lse_b) drawn at random: outs of `shape` (..., T, d_v), lse around `centre`."""
    out_a, out_b = normal(r, shape, dtype), normal(r, shape, dtype)
    lse_a, lse_b = (normal(r, shape[:-1], dtype, 3.0) + dtype(centre) for _ in range(2))
    return out_a, lse_a, out_b, lse_b


def without_keys(part, rows, side):
    """`part` with lse = -inf and out = 0 in query `rows` of `side` ("a" or "b"): no allowed key there."""
    out_a, lse_a, out_b, lse_b = (a.copy() for a in part)
    out, lse = (out_a, lse_a) if side == "a" else (out_b, lse_b)
    out[..., rows, :] = 0.0
    lse[..., rows] = -np.inf
    return out_a, lse_a, out_b, lse_b


@cases_for("merge_partials", returns=("out", "lse"), may_use="NumPy: np.logaddexp, np.exp, np.where",
           forbids=MERGE_PARTIALS_FORBIDS)
def merge_partials_cases(r):
    """Two halves of one head's attention (T = d_v), a batch of heads, unequal blocks, -inf on one side, lse near
    +-1e4, -inf on both sides, float32, and one query row."""
    Q, K, V = r.standard_normal((4, 4)), r.standard_normal((6, 4)), r.standard_normal((6, 4))
    Qs, Ks, Vs = r.standard_normal((2, 2, 4, 3)), r.standard_normal((2, 2, 6, 3)), r.standard_normal((2, 2, 6, 3))
    big = parts(r, (2, 3, 5))
    return [
        Case("two halves of the keys of one head's attention, out (T, d_v) = (4, 4), 3 keys each", halves(Q, K, V, 3)),
        Case("a batch of heads, (B, h, T, d_v) = (2, 2, 4, 3), 3 keys each", halves(Qs, Ks, Vs, 3)),
        Case("unequal blocks: 1 key, then 5", halves(Qs, Ks, Vs, 1)),
        Case("lse_b = -inf in rows 0 and 2: the second block had no allowed key there (out_b = 0)",
             without_keys(parts(r, (3, 4, 2)), [0, 2], "b")),
        Case("lse_a = -inf in row 1: the first block had no allowed key there",
             without_keys(parts(r, (2, 3, 4, 2)), [1], "a")),
        Case("lse of about 1e4: exp(lse) overflows to inf", parts(r, (2, 3, 5), centre=1e4)),
        Case("lse of about -1e4: exp(lse) underflows to 0", parts(r, (3, 4, 3), centre=-1e4)),
        Case("one side dominates: lse_a is 50 above lse_b", (big[0], big[1] + 50.0, big[2], big[1])),
        Case("lse = -inf on both sides in row 3: it stays out = 0, lse = -inf",
             without_keys(without_keys(parts(r, (2, 4, 3)), [3], "a"), [3], "b")),
        Case("float32 parts", parts(r, (2, 3, 4), np.float32)),
        Case("one query row: out (T, d_v) = (1, 5), lse (1,)", parts(r, (1, 5))),
    ]


@random_cases_for("merge_partials")
def merge_partials_random_cases(r):
    """Halves of a 4-D attention, float32 parts with -inf rows, and lse far from 0."""
    (T, d), cut, lead = sizes(r, 2, 2, 5), int(r.integers(1, 4)), batch(r, 2)
    Q, K, V = normal(r, lead + (T, d)), normal(r, lead + (2 * T, d)), normal(r, lead + (2 * T, d))  # cut < 2T
    shape = batch(r, 2) + (T, d)
    return [
        Case("random: halves of a 4-D attention", halves(Q, K, V, cut)),
        Case("random: float32 parts with a row without keys",
             without_keys(parts(r, shape, np.float32), [int(r.integers(T))], str(r.choice(["a", "b"])))),
        Case("random: lse far from 0", parts(r, shape, centre=float(r.choice([-5e3, 5e3, 2e4])))),
    ]


def logaddexp(lse_a, lse_b):
    """log(e^lse_a + e^lse_b), -inf where both are (the mistakes' own)."""
    return np.logaddexp(lse_a, lse_b)


def shares(lse_a, lse_b, lse):
    """exp(lse_a - lse), exp(lse_b - lse) as (..., T, 1), 0 on a side with lse = -inf."""
    finite = np.where(np.isneginf(lse), 0, lse)
    return np.exp(lse_a - finite)[..., None], np.exp(lse_b - finite)[..., None]


@mistake("merge_partials", "each out is normalised by its own block's sum: weight it by its share of the whole, "
         "exp(lse_a - lse), before adding; out_a + out_b counts the probabilities twice")
def merge_adds_the_outs(out_a, lse_a, out_b, lse_b):
    return out_a + out_b, logaddexp(lse_a, lse_b)


@mistake("merge_partials", "the two parts do not weigh 1/2 each: a part weighs its share of the softmax's mass, "
         "exp(lse_a - lse)")
def merge_averages_the_outs(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, logaddexp(lse_a, lse_b)


@mistake("merge_partials", "each out takes its own block's share: exp(lse_a - lse) multiplies out_a, and "
         "exp(lse_b - lse) multiplies out_b")
def merge_swaps_the_weights(out_a, lse_a, out_b, lse_b):
    lse = logaddexp(lse_a, lse_b)
    w_a, w_b = shares(lse_a, lse_b, lse)
    return w_b * out_a + w_a * out_b, lse


@mistake("merge_partials", "lse has one number per row, (..., T): give each weight an axis, w[..., None], so "
         "that it scales every column of its row (without it, a weight (T,) scales the columns when T = d_v)")
def merge_weights_along_the_columns(out_a, lse_a, out_b, lse_b):
    lse = logaddexp(lse_a, lse_b)
    w_a, w_b = shares(lse_a, lse_b, lse)
    return w_a[..., 0] * out_a + w_b[..., 0] * out_b, lse


@mistake("merge_partials", "the merged lse is log(e^lse_a + e^lse_b), np.logaddexp(lse_a, lse_b): the larger "
         "of the two forgets the other block's mass")
def merge_lse_is_the_maximum(out_a, lse_a, out_b, lse_b):
    lse = logaddexp(lse_a, lse_b)
    w_a, w_b = shares(lse_a, lse_b, lse)
    return w_a * out_a + w_b * out_b, np.maximum(lse_a, lse_b)


@mistake("merge_partials", "the blocks' sums of exponentials add, so lse = np.logaddexp(lse_a, lse_b); lse_a + "
         "lse_b is the log of their product")
def merge_lse_added(out_a, lse_a, out_b, lse_b):
    lse = logaddexp(lse_a, lse_b)
    w_a, w_b = shares(lse_a, lse_b, lse)
    return w_a * out_a + w_b * out_b, lse_a + lse_b


@mistake("merge_partials", "divide by the total: the weights exp(lse_a - lse) and exp(lse_b - lse) add up to 1, "
         "while exp(lse_a - max) and exp(lse_b - max) do not")
def merge_without_normalising(out_a, lse_a, out_b, lse_b):
    top = np.maximum(lse_a, lse_b)
    w_a, w_b = shares(lse_a, lse_b, top)
    return w_a * out_a + w_b * out_b, logaddexp(lse_a, lse_b)


@mistake("merge_partials", "a row where both lse are -inf had no allowed key at all: -inf - (-inf) is NaN, so "
         "replace such an lse by 0 before subtracting it (np.where), and keep out = 0, lse = -inf there")
def merge_nan_where_both_are_empty(out_a, lse_a, out_b, lse_b):
    lse = logaddexp(lse_a, lse_b)
    return np.exp(lse_a - lse)[..., None] * out_a + np.exp(lse_b - lse)[..., None] * out_b, lse


@mistake("merge_partials", "where both lse are -inf, their maximum m is -inf too, and lse_a - m = -inf - (-inf) is "
         "NaN: shift by 0 in such rows, np.where(np.isfinite(m), m, 0)")
def merge_nan_from_the_maximum(out_a, lse_a, out_b, lse_b):
    top = np.maximum(lse_a, lse_b)
    s_a, s_b = np.exp(lse_a - top), np.exp(lse_b - top)
    out = (s_a[..., None] * out_a + s_b[..., None] * out_b) / (s_a + s_b)[..., None]
    return out, top + np.log(s_a + s_b)


@mistake("merge_partials", "never take exp of an lse itself: e^10000 overflows to inf and e^-10000 underflows "
         "to 0; use np.logaddexp and exp(lse_a - lse), which stay between 0 and 1")
def merge_exp_overflows(out_a, lse_a, out_b, lse_b):
    s_a, s_b = np.exp(lse_a)[..., None], np.exp(lse_b)[..., None]
    return (s_a * out_a + s_b * out_b) / (s_a + s_b), np.log(s_a + s_b)[..., 0]


@mistake("merge_partials", "keep -inf as -inf: with -inf replaced by a large negative number such as -1e9, a row "
         "that had no allowed key on either side gets a finite lse, as if it had some")
def merge_minus_inf_replaced(out_a, lse_a, out_b, lse_b):
    lse_a, lse_b = np.maximum(lse_a, -1e9), np.maximum(lse_b, -1e9)
    lse = logaddexp(lse_a, lse_b)
    return np.exp(lse_a - lse)[..., None] * out_a + np.exp(lse_b - lse)[..., None] * out_b, lse


check_merge_partials = make_check("merge_partials")

# all_reduce_bytes: what one rank sends in a ring all-reduce ------------------------------------------------------



@cases_for("all_reduce_bytes", may_use="Python arithmetic (not mnp.wire_bytes)", forbids=BYTES_ROUTES)
def all_reduce_bytes_cases(r):
    """P = 4 first, a share that is no whole number of bytes (P = 3), P = 2, 8, 64 and 1, the default of 4 bytes
    per element, no elements, and NumPy integers."""
    return [
        Case("P = 4 ranks, 1000 float32 elements (4 bytes each)", (1000, 4, 4)),
        Case("P = 3: 2 * 2/3 of 4000 bytes, no whole number", (1000, 3, 4)),
        Case("P = 2: each rank sends as many bytes as it holds", (4096, 2, 4)),
        Case("P = 8, Llama-2-7B's activations B * T * d = 4096 * 4096 in bfloat16 (2 bytes)",
             (4096 * 4096, 8), {"bytes_per_element": 2}),
        Case("P = 1: a rank alone sends nothing", (5000, 1, 4)),
        Case("the default: 4 bytes per element, P = 5", (300, 5)),
        Case("P = 64, a million bfloat16 elements", (1_000_000, 64, 2)),
        Case("no elements at all, P = 4", (0, 4, 4)),
        Case("NumPy integers: np.int64 for n_elements, world_size and bytes_per_element",
             (np.int64(12345), np.int64(6), np.int64(8))),
    ]


@random_cases_for("all_reduce_bytes")
def all_reduce_bytes_random_cases(r):
    """Sizes from one element to a billion over 1 to 64 ranks, with 1 to 8 bytes per element, the default, and
    NumPy integers."""
    def n():
        return int(r.integers(1, 10**9))

    def ranks():
        return int(r.integers(1, 65))
    return [
        Case("random: any size and width", (n(), ranks(), int(r.choice([1, 2, 4, 8])))),
        Case("random: the default width", (n(), ranks())),
        Case("random: NumPy integers", (np.int64(n()), np.int64(ranks())), {"bytes_per_element": np.int64(2)}),
    ]


@mistake("all_reduce_bytes", "a ring all-reduce makes two passes, a reduce-scatter and then an all-gather, each "
         "sending (P - 1)/P of the data: 2 (P - 1)/P in all")
def bytes_one_pass(n_elements, world_size, bytes_per_element=4):
    return (world_size - 1) / world_size * n_elements * bytes_per_element


@mistake("all_reduce_bytes", "multiply by bytes_per_element: the answer is in bytes, not in elements")
def bytes_as_elements(n_elements, world_size, bytes_per_element=4):
    return 2 * (world_size - 1) / world_size * n_elements


@mistake("all_reduce_bytes", "the ring takes 2 (P - 1) steps of n/P elements, not 2P: a rank alone (P = 1) "
         "sends nothing")
def bytes_2p_steps(n_elements, world_size, bytes_per_element=4):
    return 2 * n_elements * bytes_per_element / world_size


@mistake("all_reduce_bytes", "count what ONE rank sends, 2 (P - 1)/P * n * bytes_per_element; 2 (P - 1) * n * "
         "bytes_per_element is what all P ranks send together")
def bytes_of_every_rank(n_elements, world_size, bytes_per_element=4):
    return 2.0 * (world_size - 1) * n_elements * bytes_per_element


@mistake("all_reduce_bytes", "the answer is in bytes, not in bits: leave out the factor 8")
def bytes_in_bits(n_elements, world_size, bytes_per_element=4):
    return 8 * 2 * (world_size - 1) / world_size * n_elements * bytes_per_element


check_all_reduce_bytes = make_check("all_reduce_bytes")
