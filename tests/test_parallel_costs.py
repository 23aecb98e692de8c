"""Chapter 15's cost model: FLOPs and wire bytes of one layer split over P devices.

The formulas are held against numbers worked out by hand for a small layer; the sweep's
facts that the chapter states are asserted on every point of the sweep, not on one."""

import itertools
import math
import re
import warnings
from pathlib import Path

import matplotlib
import pytest

from mha import plot
from mha.experiments import parallel_costs as pc

matplotlib.use("Agg")

# A small layer worked by hand: d = 8, h = 4 heads of d_head = 2, h_kv = 2, d_ff = 12.
SMALL = pc.ModelShape("small", d_model=8, n_layers=1, n_heads=4, n_kv_heads=2, d_head=2, d_ff=12,
                      context=8, cite="none")
B, T = 2, 8
TABLE = pc.cost_table()  # both models, both links, three schemes, every valid P in 2..64: a training step
FORWARD = pc.cost_table(training=False)  # the same, the forward pass alone
POWERS_OF_TWO = [2, 4, 8, 16, 32, 64]


def series(model, scheme, link, table=TABLE):
    """The table's rows for one line of the figure, in increasing P."""
    rows = sorted((r for r in table if (r.model, r.scheme, r.link) == (model, scheme, link)), key=lambda r: r.P)
    assert rows, (model, scheme, link)
    return rows


LINES = list(itertools.product(pc.MODELS, pc.SCHEMES, pc.LINKS))


def test_layer_flops_of_a_small_layer_match_the_hand_count():
    projections = 2 * 2 * 8 * 8 * (2 * 8 + 2 * 2 * 2)  # 2 B T d (2 h d_head + 2 h_kv d_head) = 6144
    attention = 4 * 2 * 8 * 8 * 8  # 4 B T^2 (h d_head) = 4096, halved when causal
    feed_forward = 2 * 2 * 8 * 3 * 8 * 12  # 2 B T 3 d d_ff = 9216
    assert (projections, attention, feed_forward) == (6144, 4096, 9216)
    assert pc.layer_flops(SMALL, B, T, causal=False) == 19456 == projections + attention + feed_forward
    assert pc.layer_flops(SMALL, B, T) == 17408 == projections + attention // 2 + feed_forward


@pytest.mark.parametrize("scheme,P,elements", [
    ("tensor", 2, 256),  # two all-reduces of B T d = 128 elements, x 2(P-1)/P = 1
    ("tensor", 4, 384),  # 256 x 2 x 3/4
    ("ulysses", 2, 96),  # B (T/P) d_head (2h + 2h_kv) = 2*4*2*12 = 192, x (P-1)/P = 1/2
    ("ulysses", 4, 96),  # P = 4 > h_kv = 2: 4 kv replicas, 2*2*2*(8 + 8) = 128, x 3/4
    ("ring", 2, 64),  # (P-1) 2 B h_kv (T/P) d_head = 1*2*2*2*4*2
    ("ring", 4, 96),  # 3*2*2*2*2*2
])
def test_wire_bytes_of_a_small_layer_match_the_hand_count(scheme, P, elements):
    assert pc.wire_elements_per_layer(SMALL, scheme, P, B, T) == elements
    assert pc.wire_bytes_per_layer(SMALL, scheme, P, B, T) == 2 * elements  # bfloat16
    assert pc.wire_bytes_per_layer(SMALL, scheme, P, B, T, bytes_per_element=4) == 4 * elements


def test_layer_times_divide_flops_by_P_and_the_peak_and_bytes_by_the_bandwidth():
    gpu, link = pc.Gpu("toy", flops_per_s=1e3, cite="none"), pc.Link("toy", bytes_per_s=10.0, cite="none")
    times = pc.layer_times(SMALL, "tensor", 2, link, batch=B, seq_len=T, gpu=gpu, training=False)
    assert times.compute_s == pytest.approx(17408 / 2 / 1e3)
    assert times.comm_s == pytest.approx(512 / 10.0) and times.gradient_s == 0
    assert times.ratio == pytest.approx(51.2 / 8.704)
    step = pc.layer_times(SMALL, "tensor", 2, link, batch=B, seq_len=T, gpu=gpu)  # forward, backward, gradients
    assert step.compute_s == pytest.approx(3 * 17408 / 2 / 1e3)
    assert step.comm_s == pytest.approx(2 * 512 / 10.0) and step.gradient_s == 0  # P = 2 = h_kv: no copies
    # one real point: Llama-2-7B, two GPUs on NVLink: two all-reduces of 4096 x 4096 bf16
    real = pc.layer_times("Llama-2-7B", "tensor", 2, "NVLink 4", training=False)
    assert real.comm_s == pytest.approx(2 * 4096 * 4096 * 2 / 450e9)
    assert pc.layer_times("Llama-2-7B", "tensor", 2, "NVLink 4").comm_s == pytest.approx(2 * real.comm_s)


# weights of SMALL's layer: 2 d (h + h_kv) d_head + 3 d d_ff = 2*8*6*2 + 3*8*12 = 192 + 288 = 480
@pytest.mark.parametrize("scheme,P,part,elements", [
    ("tensor", 4, "backward", 384),  # the forward's two all-reduces again
    ("tensor", 2, "gradients", 0),  # P = h_kv: each key/value head on one rank, nothing to sum
    ("tensor", 4, "gradients", 32),  # P = 4 > h_kv = 2: W_K, W_V columns (2 d d_head = 32) on 2 copies, x 2(2-1)/2
    ("ulysses", 4, "backward", 96),
    ("ulysses", 4, "gradients", 720),  # every weight on every rank: 480 x 2 x 3/4
    ("ring", 4, "forward", 96),  # 3 blocks of 32 (k and v: 2 B h_kv (T/P) d_head = 2*2*2*2*2)
    ("ring", 4, "backward", 224),  # 2P - 1 = 7 blocks: k, v round again (3), dk, dv home (4)
    ("ring", 2, "gradients", 480),  # 480 x 2 x 1/2
])
def test_the_backward_and_the_gradients_all_reduce_match_the_hand_count(scheme, P, part, elements):
    assert pc.layer_weights(SMALL) == 480
    assert pc.wire_elements_per_layer(SMALL, scheme, P, B, T, part) == elements
    assert pc.wire_bytes_per_layer(SMALL, scheme, P, B, T, part=part) == 2 * elements


def test_the_ring_backward_sends_4P_minus_2_tensors_against_the_forwards_2P_minus_2():
    for P in (2, 4, 8):
        forward, backward = (pc.wire_elements_per_layer(SMALL, "ring", P, B, 16, part)
                             for part in ("forward", "backward"))
        tensor = B * 2 * (16 // P) * 2  # one k (or v) block: B h_kv (T/P) d_head
        assert (forward / tensor, backward / tensor) == (2 * P - 2, 4 * P - 2)


def test_the_gradients_all_reduce_of_llama_2_70b_is_3_gb_per_rank_per_layer_at_8():
    """Every weight of a 70B layer (856 M) on every one of 8 ranks, bfloat16: 2 x 7/8 x 1.71 GB = 3.0 GB per rank,
    about 180 times what Ulysses' all-to-alls move in the forward pass of one 4096-token sequence."""
    grads = pc.wire_bytes_per_layer("Llama-2-70B", "ulysses", 8, 1, 4096, part="gradients")
    assert pc.layer_weights("Llama-2-70B") == 855_638_016 and grads == pytest.approx(2.995e9, rel=1e-3)
    assert grads == pc.wire_bytes_per_layer("Llama-2-70B", "ring", 8, 1, 4096, part="gradients")
    assert 175 < grads / pc.wire_bytes_per_layer("Llama-2-70B", "ulysses", 8, 1, 4096) < 185
    with pytest.raises(ValueError, match="part must be one of"):
        pc.wire_bytes_per_layer(SMALL, "ring", 2, 1, 8, part="optimizer")


def test_constants_are_the_published_ones_and_each_cites_an_entry_of_the_bibliography():
    assert (pc.LLAMA2_7B.d_model, pc.LLAMA2_7B.n_layers, pc.LLAMA2_7B.n_heads, pc.LLAMA2_7B.n_kv_heads,
            pc.LLAMA2_7B.d_head, pc.LLAMA2_7B.d_ff, pc.LLAMA2_7B.context) == (4096, 32, 32, 32, 128, 11008, 4096)
    assert (pc.LLAMA2_70B.d_model, pc.LLAMA2_70B.n_layers, pc.LLAMA2_70B.n_heads, pc.LLAMA2_70B.n_kv_heads,
            pc.LLAMA2_70B.d_head, pc.LLAMA2_70B.d_ff, pc.LLAMA2_70B.context) == (8192, 80, 64, 8, 128, 28672, 4096)
    assert pc.GPU.flops_per_s == 989e12
    assert pc.LINKS["NVLink 4"].bytes_per_s == 450e9 and pc.LINKS["InfiniBand NDR"].bytes_per_s == 50e9
    bib = (Path(__file__).resolve().parent.parent / "book" / "references.bib").read_text()
    keys = set(re.findall(r"^@\w+\{([^,]+),", bib, flags=re.M))
    cited = {c["cite"] for c in pc.CONSTANTS.values() if c["cite"] is not None}
    assert cited <= keys and len(cited) >= 4
    assert pc.CONSTANTS["Llama-2-70B n_kv_heads"]["value"] == 8


@pytest.mark.parametrize("model,scheme,expected", [
    ("Llama-2-7B", "tensor", [2, 4, 8, 16, 32]),  # P divides h = 32
    ("Llama-2-7B", "ulysses", [2, 4, 8, 16, 32]),
    ("Llama-2-7B", "ring", POWERS_OF_TWO),  # P divides T/2 = 2048
    ("Llama-2-70B", "tensor", POWERS_OF_TWO),  # P divides h = 64; P > h_kv = 8 replicates kv heads
    ("Llama-2-70B", "ulysses", POWERS_OF_TWO),
    ("Llama-2-70B", "ring", POWERS_OF_TWO),
])
def test_the_sweep_holds_every_valid_P_from_2_to_64_and_nothing_else(model, scheme, expected):
    assert pc.valid_world_sizes(model, scheme, 4096) == expected
    for link in pc.LINKS:
        assert [r.P for r in series(model, scheme, link)] == expected


@pytest.mark.parametrize("scheme,P,seq_len,match", [
    ("tensor", 3, 4096, "n_heads=32 is not divisible by P=3"),
    ("tensor", 64, 4096, "n_heads=32 is not divisible by P=64"),
    ("ulysses", 64, 4096, "n_heads=32 is not divisible by P=64"),
    ("ulysses", 8, 4100, "seq_len=4100 is not divisible by P=8"),
    ("ring", 3, 4096, "not divisible by 2P=6"),
    ("ring", 48, 4096, "not divisible by 2P=96"),
    ("ring", 4, 4100, "seq_len=4100 is not divisible by 2P=8"),  # T/P = 1025 positions: no two equal chunks
    ("pipeline", 2, 4096, "scheme must be one of"),
])
def test_a_P_the_scheme_cannot_use_is_refused(scheme, P, seq_len, match):
    with pytest.raises(ValueError, match=match):
        pc.wire_bytes_per_layer("Llama-2-7B", scheme, P, 1, seq_len)
    with pytest.raises(ValueError, match=match):
        pc.layer_times("Llama-2-7B", scheme, P, "NVLink 4", seq_len=seq_len)


def test_key_value_heads_split_or_replicate_and_refuse_anything_else():
    odd = pc.ModelShape("odd", d_model=48, n_layers=1, n_heads=12, n_kv_heads=3, d_head=4, d_ff=8,
                        context=24, cite="none")
    assert pc.kv_heads_per_rank(odd, 3) == 1 and pc.kv_heads_per_rank(odd, 6) == 1  # 6: two replicas of each
    assert pc.kv_heads_per_rank("Llama-2-70B", 4) == 2 and pc.kv_heads_per_rank("Llama-2-70B", 64) == 1
    with pytest.raises(ValueError, match="P=2 ranks cannot share n_kv_heads=3"):
        pc.wire_bytes_per_layer(odd, "tensor", 2, 1, 24)  # 12 heads split, but 3 kv heads cannot
    with pytest.raises(ValueError, match="P=4 ranks cannot share n_kv_heads=3"):
        pc.wire_bytes_per_layer(odd, "ulysses", 4, 1, 24)
    assert pc.wire_bytes_per_layer(odd, "ring", 4, 1, 24) > 0  # the ring never splits heads


@pytest.mark.parametrize("call,error,match", [
    (lambda: pc.layer_flops("GPT-5", 1, 8), ValueError, "model must be a ModelShape or one of"),
    (lambda: pc.layer_flops(SMALL, 0, 8), ValueError, "batch must be at least 1"),
    (lambda: pc.layer_flops(SMALL, 1.5, 8), TypeError, "batch must be an integer"),
    (lambda: pc.layer_flops(SMALL, 1, 8, causal="yes"), TypeError, "causal must be True or False"),
    (lambda: pc.wire_bytes_per_layer(SMALL, "ring", 0, 1, 8), ValueError, "P must be at least 1"),
    (lambda: pc.wire_bytes_per_layer(SMALL, "ring", 2, 1, 8, bytes_per_element=0), ValueError,
     "bytes_per_element must be a number > 0"),
    (lambda: pc.layer_times(SMALL, "ring", 2, "Ethernet", seq_len=8), ValueError, "link must be a Link or one of"),
    (lambda: pc.layer_times(SMALL, "ring", 2, "NVLink 4", seq_len=8, gpu="H100"), TypeError, "gpu must be a Gpu"),
    (lambda: pc.ModelShape("bad", 8, 1, 4, 3, 2, 12, 8, "none"), ValueError, "n_heads=4 is not divisible by n_kv"),
])
def test_bad_input_names_what_was_expected_and_what_was_given(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_every_point_of_the_sweep_is_finite_and_positive():
    assert len(TABLE) == len(FORWARD) == 2 * (5 + 5 + 6 + 6 + 6 + 6)  # two links, the six series above
    for r in TABLE + FORWARD:
        assert all(math.isfinite(v) and v > 0 for v in (r.compute_s, r.comm_s, r.ratio)), r


@pytest.mark.parametrize("model,scheme,link", LINES)
def test_compute_falls_as_one_over_P_on_every_point(model, scheme, link):
    rows = series(model, scheme, link)
    work = [r.compute_s * r.P for r in rows]  # the whole layer's compute, the same at every P
    assert max(work) == pytest.approx(min(work), rel=1e-12)


@pytest.mark.parametrize("model,link", list(itertools.product(pc.MODELS, pc.LINKS)))
def test_tensor_and_ring_ratios_grow_with_P_everywhere(model, link):
    for scheme in ("tensor", "ring"):
        ratios = [r.ratio for r in series(model, scheme, link)]
        assert all(a < b for a, b in zip(ratios, ratios[1:])), (scheme, ratios)


@pytest.mark.parametrize("model,link", list(itertools.product(pc.MODELS, pc.LINKS)))
def test_ring_communication_per_layer_is_nearly_constant_while_ulysses_falls(model, link):
    """In the forward pass; in a training step the gradients' all-reduce, 2(P - 1)/P of every weight, grows
    with P for both."""
    ring = [r.comm_s for r in series(model, "ring", link, FORWARD)]
    assert all(a < b for a, b in zip(ring, ring[1:]))  # (P - 1)/P grows towards 1 ...
    assert max(ring) / min(ring) < 2  # ... from 1/2: never even doubles from P = 2 to 64
    ulysses = [r.comm_s for r in series(model, "ulysses", link, FORWARD)]
    assert all(a > b for a, b in zip(ulysses, ulysses[1:]))  # each rank's all-to-all shrinks with T/P
    for scheme in ("ulysses", "ring"):
        steps = series(model, scheme, link)
        assert all(r.gradient_s > r.comm_s / 2 for r in steps)  # the gradients are most of a step's traffic
        assert all(a.gradient_s < b.gradient_s for a, b in zip(steps, steps[1:]))


@pytest.mark.parametrize("model,scheme", list(itertools.product(pc.MODELS, pc.SCHEMES)))
def test_nvlink_is_below_infiniband_at_every_P_by_the_bandwidth_ratio(model, scheme):
    nvlink, infiniband = series(model, scheme, "NVLink 4"), series(model, scheme, "InfiniBand NDR")
    for fast, slow in zip(nvlink, infiniband, strict=True):
        assert fast.P == slow.P and fast.ratio < slow.ratio
        assert slow.ratio / fast.ratio == pytest.approx(450e9 / 50e9)


def test_where_communication_first_costs_as_much_as_the_compute_in_a_training_step():
    crossings = {(m, s, lk): pc.first_crossing(TABLE, m, s, lk) for m, s, lk in LINES}
    assert crossings == {
        ("Llama-2-7B", "tensor", "NVLink 4"): 16, ("Llama-2-7B", "tensor", "InfiniBand NDR"): 4,
        ("Llama-2-7B", "ulysses", "NVLink 4"): 4, ("Llama-2-7B", "ulysses", "InfiniBand NDR"): 2,
        ("Llama-2-7B", "ring", "NVLink 4"): 4, ("Llama-2-7B", "ring", "InfiniBand NDR"): 2,
        ("Llama-2-70B", "tensor", "NVLink 4"): 32, ("Llama-2-70B", "tensor", "InfiniBand NDR"): 4,
        ("Llama-2-70B", "ulysses", "NVLink 4"): 4, ("Llama-2-70B", "ulysses", "InfiniBand NDR"): 2,
        ("Llama-2-70B", "ring", "NVLink 4"): 4, ("Llama-2-70B", "ring", "InfiniBand NDR"): 2,
    }
    for (m, s, lk), P in crossings.items():
        assert all((r.ratio >= 1) == (P is not None and r.P >= P) for r in series(m, s, lk))
    # tensor parallelism within an 8-GPU NVLink server: below 1 for both models, in a step (7B at P = 8: 0.77)
    assert all(r.ratio < 1 for m in pc.MODELS for r in series(m, "tensor", "NVLink 4") if r.P <= 8)


@pytest.mark.parametrize("model,scheme,link,expected", [
    ("Llama-2-70B", "ulysses", "NVLink 4", {2: 1, 4: 2, 8: 3, 16: 6, 32: 12, 64: 23}),
    ("Llama-2-70B", "ring", "NVLink 4", {2: 1, 4: 2, 8: 3, 16: 6, 32: 13, 64: 32}),
    ("Llama-2-70B", "ulysses", "InfiniBand NDR", {2: 4, 4: 12, 8: 29, 16: 65, 32: 149, 64: 375}),
    ("Llama-2-70B", "ring", "InfiniBand NDR", {2: 4, 4: 11, 8: 33, 16: 155, 32: None, 64: None}),
    ("Llama-2-70B", "tensor", "InfiniBand NDR", {2: 1, 4: None, 8: None}),
    ("Llama-2-7B", "ulysses", "NVLink 4", {8: 3}), ("Llama-2-7B", "ring", "NVLink 4", {8: 6}),
    ("Llama-2-7B", "ulysses", "InfiniBand NDR", {8: 152}),
    ("Llama-2-7B", "ring", "InfiniBand NDR", {4: None, 8: None}),  # its k, v blocks alone outweigh the compute
])
def test_the_sequences_per_step_that_hide_the_communication(model, scheme, link, expected):
    for P, B in expected.items():
        assert pc.batch_to_hide(model, scheme, P, link) == B, P
        if B is not None:  # the fewest: B sequences hide it, B - 1 do not
            assert pc.layer_times(model, scheme, P, link, batch=B).ratio < 1
            assert B == 1 or pc.layer_times(model, scheme, P, link, batch=B - 1).ratio >= 1


def test_where_communication_first_costs_as_much_as_the_compute_in_the_forward_pass():
    crossings = {(m, s, lk): pc.first_crossing(FORWARD, m, s, lk) for m, s, lk in LINES}
    assert crossings == {
        ("Llama-2-7B", "tensor", "NVLink 4"): 8, ("Llama-2-7B", "tensor", "InfiniBand NDR"): 2,
        ("Llama-2-7B", "ulysses", "NVLink 4"): None, ("Llama-2-7B", "ulysses", "InfiniBand NDR"): 4,
        ("Llama-2-7B", "ring", "NVLink 4"): 16, ("Llama-2-7B", "ring", "InfiniBand NDR"): 4,
        ("Llama-2-70B", "tensor", "NVLink 4"): 16, ("Llama-2-70B", "tensor", "InfiniBand NDR"): 4,
        ("Llama-2-70B", "ulysses", "NVLink 4"): None, ("Llama-2-70B", "ulysses", "InfiniBand NDR"): None,
        ("Llama-2-70B", "ring", "NVLink 4"): None, ("Llama-2-70B", "ring", "InfiniBand NDR"): 32,
    }
    # past the crossing the ratio stays above 1: the crossing is the whole story of each line
    for (m, s, lk), P in crossings.items():
        assert all((r.ratio >= 1) == (P is not None and r.P >= P) for r in series(m, s, lk, FORWARD))


def test_the_figure_draws_one_panel_per_model_and_a_line_per_scheme_and_link(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot.comm_compute_ratio(TABLE)
        fig.canvas.draw()
    assert capsys.readouterr() == ("", "")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == list(pc.MODELS)
    for ax in panels:
        data = [line for line in ax.lines if line.get_label() and not line.get_label().startswith("_")]
        assert len(data) == 6 and len(ax.lines) == 7  # 3 schemes x 2 links, and the line at 1
        styles = {line.get_label(): line.get_linestyle() for line in data}
        assert {s for label, s in styles.items() if "NVLink" in label} == {"-"}
        assert {s for label, s in styles.items() if "InfiniBand" in label} == {"--"}
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and "GPUs P" in ax.get_xlabel()
    assert len(fig.legends[0].get_texts()) == 6
    with pytest.raises(ValueError, match="at least one record"):
        plot.comm_compute_ratio([])
