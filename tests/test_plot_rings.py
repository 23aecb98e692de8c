"""Chapter 15's two ring figures: the ring all-reduce simulated piece by piece (each rank sends one piece of P
per step, 2(P - 1) steps, and every rank ends with the sum), and one rank's ring schedule with its compute and
its transfers (the wire hides when a transfer is shorter than a step's compute); both drawn from those
simulations."""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

import mha.numpy as mnp
from mha import plot_rings
from mha.experiments import parallel, parallel_costs as pc

matplotlib.use("Agg")


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8])
def test_the_ring_all_reduce_sums_and_sends_one_piece_per_rank_per_step(P):
    rng = np.random.default_rng(P)
    partials = [rng.standard_normal(2 * P + 1) for _ in range(P)]  # pieces of unequal sizes when P does not divide
    states = parallel.ring_all_reduce_steps(partials)
    assert len(states) == 2 * P - 1 and states[0]["phase"] == "start"
    assert [s["phase"] for s in states[1:]] == ["reduce-scatter"] * (P - 1) + ["all-gather"] * (P - 1)
    total = sum(partials)
    for r in range(P):
        assert np.allclose(np.concatenate(states[-1]["pieces"][r]), total, rtol=0, atol=1e-12)
        assert states[-1]["sums"][r] == [tuple(range(P))] * P
        if P > 1:  # after the reduce-scatter, rank r holds the whole sum of piece r + 1
            assert states[P - 1]["sums"][r][(r + 1) % P] == tuple(range(P))
    for state in states[1:]:
        assert sorted(r for r, _ in state["sent"]) == list(range(P))  # every rank sends exactly one piece
    even = parallel.ring_all_reduce_steps([rng.standard_normal(4 * P) for _ in range(P)])  # P | n: equal pieces
    for r in range(P):  # the elements rank r sent: 2(P - 1) pieces of n/P, the formula's 2(P - 1)/P n
        sent = sum(len(before["pieces"][r][k]) for before, after in zip(even, even[1:]) for s, k in after["sent"]
                   if s == r)
        assert sent == mnp.all_reduce_bytes(4 * P, P, 1)


def test_the_ring_timeline_hides_the_wire_only_when_a_transfer_is_shorter_than_a_step():
    compute, transfers = pc.ring_timeline(2.0, 1.0, 4)
    assert compute == [(0, 2), (2, 4), (4, 6), (6, 8)] and transfers == [(0, 1), (2, 3), (4, 5)]
    compute, transfers = pc.ring_timeline(1.0, 3.0, 4)
    assert compute[-1] == (9.0, 10.0) and compute[-1][1] == 3 * 3.0 + 1.0  # (P - 1) transfers + one step
    assert pc.ring_timeline(1.0, 3.0, 1) == ([(0.0, 1.0)], [])
    c, t = pc.ring_step_times("Llama-2-70B", 8, "NVLink 4")  # T = 4096: the block's attention against its transfer
    assert c == pytest.approx(4 * 64 * 512 ** 2 * 128 / 2 / 989e12)  # 4 B h (T/P)^2 d_head, halved: causal
    assert t == pytest.approx(2 * 8 * 512 * 128 * 2 / 450e9)  # k and v of h_kv = 8 heads, bfloat16
    assert 1 < t / c < 1.2  # about even at T = 4096: NVLink just fails to hide it
    c_long, t_long = pc.ring_step_times("Llama-2-70B", 8, "InfiniBand NDR", seq_len=65536)
    assert t_long < c_long and pc.ring_step_times("Llama-2-70B", 8, "InfiniBand NDR")[1] > 9 * c


def test_the_figures_draw_the_simulations():
    states = parallel.ring_all_reduce_steps([np.arange(8.0) * 10 ** r for r in range(4)])
    fig = plot_rings.ring_all_reduce(states)
    assert len(fig.axes) == 7
    texts = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert texts[0] == [str(r) for r in range(4) for _ in range(4)] and set(texts[-1]) == {"0123"}
    assert texts[3].count("0123") == 4  # after the reduce-scatter: one whole sum per rank
    framed = [p for p in fig.axes[1].patches if not p.get_fill()]
    assert len(framed) == 4  # one piece received by each rank
    timelines = {"a": pc.ring_timeline(2.0, 1.0, 4), "b": pc.ring_timeline(1.0, 3.0, 4)}
    fig = plot_rings.ring_overlap(timelines)
    bars = [[(round(p.get_x(), 6), round(p.get_width(), 6)) for p in ax.patches] for ax in fig.axes]
    assert bars[0][:4] == [(0.0, 2000.0), (2000.0, 2000.0), (4000.0, 2000.0), (6000.0, 2000.0)]
    assert bars[1][3] == (9000.0, 1000.0)  # the last step waits for the third transfer
    with pytest.raises(ValueError, match="at least one case"):
        plot_rings.ring_overlap({})
    plt.close("all")
