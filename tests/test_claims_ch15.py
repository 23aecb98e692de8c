"""Chapter 15's sentences about random draws, asserted beyond the draw shown (CONTRIBUTING.md, "Claims hold
beyond the case tried").

The chapter draws at random in two places: its NumPy simulations of the ranks (inputs and weights from one
generator), and the cases of its one launch (`mha.experiments.parallel`: each module and input from a seed).
Every bound the chapter prints about them, and every count it draws or asserts, is checked here:

- with the ranks as a list, tensor parallelism, Ulysses, the merge of two halves and ring attention (both
  splits) equal one process below 1e-12, with the chapter's shapes, on 20 draws;
- the launch's cases, at the chapter's size and P = 4, on 5 seeds each (the chapter's and 4 more): every
  error below 1e-5, every payload the formula's on every rank, the chunk pairs 4r + 3 and 2P + 1;
- causal ring attention computes 4r + 3 chunk pairs per rank with the contiguous split and 2P + 1 with the
  zigzag split at every P from 1 to 16, and the busiest rank's share (4P - 1) / (2P + 1) grows towards 2
  without reaching it;
- the figures show the library's own rules: who holds each head (`query_heads`, `kv_heads`), which rank
  computes each chunk pair.
"""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

import mha.numpy as mnp
from mha import plot
from mha.distributed import launch
from mha.distributed.equivalence import run_cases
from mha.distributed.tensor import kv_heads, query_heads
from mha.experiments import parallel

matplotlib.use("Agg")

DRAWS = range(20)
LAUNCH_SEEDS = (0, 100, 200, 300, 400)  # added to each case's own seed; 0 is the chapter's launch


def gap(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# With the ranks as a list: the chapter's bound 1e-12 on every draw ------------------------------------------------


def test_tensor_parallelism_as_a_list_equals_one_process_on_every_draw():
    B, T, d, h, P = 2, 6, 32, 8, 4
    for seed in DRAWS:
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((B, T, d))
        W_q, W_k, W_v, W_o = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(4))
        b_q, b_k, b_v, b_o = (0.1 * rng.standard_normal(d) for _ in range(4))
        causal = mnp.causal_mask(T)
        out, partials = mnp.tensor_parallel_attention(X, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=h,
                                                      world_size=P, mask=causal)
        whole, _ = mnp.multihead_attention(X, W_q, W_k, W_v, W_o, h, mask=causal, b_q=b_q, b_k=b_k, b_v=b_v,
                                           b_o=b_o)
        assert gap(out, whole) < 1e-12, seed
        assert gap(sum(partials) + b_o, whole) < 1e-12 and len(partials) == P, seed
        assert min(gap(p + b_o, whole) for p in partials) > 0.1, seed  # no rank's part is the answer alone


def test_ulysses_and_the_merge_as_lists_equal_one_process_on_every_draw():
    for seed in DRAWS:
        rng = np.random.default_rng(seed)
        Q, K, V = rng.standard_normal((3, 2, 8, 16, 4))
        reference, _ = mnp.scaled_dot_product_attention(Q, K, V, mnp.causal_mask(16))
        assert gap(mnp.ulysses_attention(Q, K, V, world_size=4, causal=True), reference) < 1e-12, seed
        Q, K, V = rng.standard_normal((3, 8, 4))
        first, second = mnp.attention_partial(Q, K[:3], V[:3]), mnp.attention_partial(Q, K[3:], V[3:])
        all_keys, _ = mnp.scaled_dot_product_attention(Q, K, V)
        assert gap(mnp.merge_partials(*first, *second)[0], all_keys) < 1e-12, seed
        assert gap(mnp.merge_partials(*second, *first)[0], all_keys) < 1e-12, seed


def test_ring_attention_as_a_list_equals_one_process_with_both_splits_on_every_draw():
    real = np.ones((2, 16), dtype=bool)
    real[0, :5] = False
    allowed = mnp.causal_mask(16) & real[:, None, None, :]
    for seed in DRAWS:
        Q, K, V = np.random.default_rng(seed).standard_normal((3, 2, 8, 16, 4))
        reference, _ = mnp.scaled_dot_product_attention(Q, K, V, allowed)
        for layout, pairs in (("contiguous", [3, 7, 11, 15]), ("zigzag", [9, 9, 9, 9])):
            out, counted = mnp.ring_attention(Q, K, V, world_size=4, layout=layout, causal=True,
                                              key_padding_mask=real)
            assert gap(out, reference) < 1e-12 and counted == pairs, (seed, layout)


# The launch: the chapter's cases on 5 seeds -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def launched():
    """summarise()'s rows of the chapter's cases, for each seed offset: one launch of P = 4 for all of them."""
    names, cases = list(parallel.cases()), []
    for offset in LAUNCH_SEEDS:
        cases += [{**case, "seed": case["seed"] + offset} for case in parallel.cases().values()]
    by_rank = launch(run_cases, 4, cases, timeout=300)
    rows = {}
    for k, offset in enumerate(LAUNCH_SEEDS):
        results = [dict(zip(names, answers[k * len(names):(k + 1) * len(names)])) for answers in by_rank]
        rows[offset] = {row["case"]: row for row in parallel.summarise(results)}
    return rows


def test_every_case_of_the_launch_is_below_the_chapters_bound_on_five_seeds(launched):
    assert len(launched) >= 5
    for offset, rows in launched.items():
        assert set(rows) == set(parallel.CHAPTER_CASES)
        for name, row in rows.items():
            assert row["worst error"] < 1e-5, (offset, name, row["worst error"])
            assert row["tensors compared"] >= 6, (offset, name)


def test_every_rank_hands_the_formulas_payload_and_computes_the_formulas_pairs_on_five_seeds(launched):
    P = 4
    for offset, rows in launched.items():
        for name, row in rows.items():
            for direction in ("forward", "backward"):
                assert row[f"{direction} payload"] == [row[f"formula {direction}"]] * P, (offset, name)
        assert rows["ring: contiguous"]["chunk pairs"] == [4 * r + 3 for r in range(P)], offset
        assert rows["ring: zigzag"]["chunk pairs"] == [2 * P + 1] * P, offset


# The balance of causal ring attention, over the whole range ------------------------------------------------------


def test_chunk_pairs_are_4r_plus_3_and_2p_plus_1_at_every_p_up_to_16():
    for P in range(1, 17):
        Q, K, V = np.random.default_rng(P).standard_normal((3, 1, 1, 2 * P, 2))  # one position per chunk
        _, contiguous = mnp.ring_attention(Q, K, V, world_size=P, layout="contiguous", causal=True)
        _, zigzag = mnp.ring_attention(Q, K, V, world_size=P, layout="zigzag", causal=True)
        assert contiguous == [4 * r + 3 for r in range(P)] and zigzag == [2 * P + 1] * P, P
        assert sum(contiguous) == sum(zigzag) == P * (2 * P + 1), P
        _, every_pair = mnp.ring_attention(Q, K, V, world_size=P, layout="zigzag")
        assert every_pair == [4 * P] * P, P  # without the mask, nothing is skipped


def test_the_busiest_ranks_share_grows_towards_twice_the_average_without_reaching_it():
    shares = [(4 * P - 1) / (2 * P + 1) for P in range(1, 4097)]
    assert shares[0] == 1 and all(a < b < 2 for a, b in zip(shares, shares[1:]))
    assert shares[63] > 1.95  # P = 64: "towards twice"


# The figures draw the library's rules -------------------------------------------------------------------------------


def block_colours(ax):
    """The face colours of the filled stripes of a tensor_parallel_weights axis, left to right, top to bottom."""
    patches = [p for p in ax.patches if p.get_fill() and p.get_width() > 0]
    return [(round(p.get_x(), 3), -round(p.get_y(), 3), tuple(p.get_facecolor()[:3])) for p in patches]


@pytest.mark.parametrize("n_heads,n_kv_heads,world_size", [(8, 8, 4), (8, 2, 4), (8, 4, 2), (4, 1, 4)])
def test_the_tensor_parallel_figure_colours_each_head_by_the_ranks_that_hold_it(n_heads, n_kv_heads, world_size):
    query = [next(r for r in range(world_size) if j in query_heads(n_heads, world_size, r)) for j in range(n_heads)]
    kv = [[r for r in range(world_size) if g in kv_heads(n_heads, n_kv_heads, world_size, r)]
          for g in range(n_kv_heads)]
    assert query == [j // (n_heads // world_size) for j in range(n_heads)]
    ax = plot.tensor_parallel_weights(query, kv)
    colours = [tuple(c) for c in plot.rank_colours(world_size)]
    drawn = [colour for _, _, colour in sorted(block_colours(ax))]
    w_q = drawn[:n_heads]
    assert w_q == [colours[r] for r in query]
    stripes = drawn[n_heads:n_heads + sum(len(ranks) for ranks in kv)]
    assert stripes == [colours[r] for ranks in kv for r in ranks]  # W_K: a stripe per rank that holds the head
    if n_kv_heads < world_size:
        assert all(len(ranks) == world_size // n_kv_heads for ranks in kv)
    plt.close("all")


def test_rank_grids_colour_each_cell_by_its_rank_and_hatch_the_skipped_ones():
    grid = np.array([[0, -1], [1, 1]])
    fig = plot.rank_grids({"pairs": grid}, world_size=2, xlabel="key chunk", ylabel="query chunk")
    cells = [p for p in fig.axes[0].patches]
    colours = [tuple(c) for c in plot.rank_colours(2)]
    assert [tuple(p.get_facecolor()[:3]) for p in cells] == [colours[0], (1.0, 1.0, 1.0), colours[1], colours[1]]
    assert cells[1].get_hatch() == "////"
    with pytest.raises(ValueError, match="ranks from 0 to 1"):
        plot.rank_grids({"bad": np.array([[2]])}, world_size=2, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="one value per rank"):
        plot.rank_bars({"a": [1, 2], "b": [1]}, ylabel="pairs")
    plt.close("all")
