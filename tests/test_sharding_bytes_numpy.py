"""mha.numpy's bytes and payload of heads across devices (chapter 15): all_reduce_bytes is what a ring
all-reduce simulated step by step sends; payload_per_layer and wire_bytes by hand, and what they refuse."""

import numpy as np
import pytest

from sharding_cases import rng, warnings_as_errors

import mha.numpy as mnp


@pytest.fixture(autouse=True)
def no_warnings():
    """Any NumPy warning (overflow, invalid value, divide by zero) fails the test."""
    with warnings_as_errors():
        yield


# bytes and payload ----------------------------------------------------------------------------------------------


def ring_all_reduce(vectors):
    """A ring all-reduce of P vectors of n elements (P dividing n), step by step: a reduce-scatter, then an
    all-gather, each P - 1 steps in which rank r sends one n/P piece to rank r + 1. Returns (the vectors every
    rank ends with, the elements each rank sent)."""
    P = len(vectors)
    pieces = [np.split(v.astype(float), P) for v in vectors]  # pieces[r][i]: rank r's copy of piece i
    sent = [0] * P
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(P - 1):
            moves = []
            for r in range(P):  # rank r sends piece (r - step) (reduce) or (r + 1 - step) (gather) to r + 1
                i = (r - step) % P if phase == "reduce-scatter" else (r + 1 - step) % P
                moves.append((r, i, pieces[r][i].copy()))
                sent[r] += pieces[r][i].size
            for r, i, piece in moves:
                nxt = (r + 1) % P
                pieces[nxt][i] = pieces[nxt][i] + piece if phase == "reduce-scatter" else piece
    return [np.concatenate(p) for p in pieces], sent


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_all_reduce_bytes_is_what_a_ring_all_reduce_sends(P):
    n = 24
    vectors = [rng(P).standard_normal(n) for _ in range(P)]
    totals, sent = ring_all_reduce(vectors)
    for total in totals:
        np.testing.assert_allclose(total, sum(vectors), rtol=0, atol=1e-12)
    for elements in sent:
        assert elements * 2 == mnp.all_reduce_bytes(n, P, 2) == pytest.approx(2 * (P - 1) / P * n * 2, rel=1e-15)


def test_all_reduce_bytes_by_hand_and_its_refusals():
    assert mnp.all_reduce_bytes(1000, 4) == 6000.0  # 2 * 3/4 * 1000 * 4 bytes
    assert mnp.all_reduce_bytes(1000, 3, 4) == pytest.approx(16000 / 3, rel=1e-15)
    assert mnp.all_reduce_bytes(5000, 1) == 0.0
    assert mnp.all_reduce_bytes(np.int64(10), np.int64(2), np.int64(2)) == 20.0
    with pytest.raises(ValueError, match="n_elements must be at least 0, got n_elements=-1"):
        mnp.all_reduce_bytes(-1, 2)
    with pytest.raises(TypeError, match="world_size must be an integer, got float 2.0"):
        mnp.all_reduce_bytes(10, 2.0)


SIZES = dict(batch=2, seq_len=16, d_model=32, n_heads=8, n_kv_heads=2, d_head=4)


def test_payload_per_layer_by_hand():
    """P = 4: tensor 2*16*32 = 1024 each way; Ulysses: h_kv = 2 < P, so k and v are repeated to 4 heads first,
    2*4*4*(16 + 8) = 768 each way (not 2*4*4*(16 + 4) = 640); ring: a block of k and v is 2*2*2*4*4 = 128
    elements, 3 sends forward, 3 + 4 backward."""
    assert mnp.payload_per_layer("tensor", world_size=4, **SIZES) == {"forward": {"all_reduce": 1024},
                                                                      "backward": {"all_reduce": 1024}}
    assert mnp.payload_per_layer("ulysses", world_size=4, **SIZES) == {"forward": {"all_to_all": 768},
                                                                       "backward": {"all_to_all": 768}}
    for h_kv, moved in ((8, 8), (4, 4), (1, 4)):  # P divides h_kv: h_kv heads move; else P copies
        sizes = {**SIZES, "n_kv_heads": h_kv}
        assert mnp.payload_per_layer("ulysses", world_size=4, **sizes)["forward"] == {"all_to_all": 32 * (16 + 2 * moved)}
    issue = dict(batch=2, seq_len=48, d_model=96, n_heads=8, n_kv_heads=2, d_head=12)  # P = 4, h = 8, h_kv = 2
    assert mnp.payload_per_layer("ulysses", world_size=4, **issue)["forward"]["all_to_all"] == 6912
    assert mnp.payload_per_layer("ring", world_size=4, **SIZES) == {"forward": {"send": 384},
                                                                    "backward": {"send": 896}}
    in_bytes = mnp.payload_per_layer("ring", world_size=4, bytes_per_element=2, **SIZES)
    assert in_bytes == {"forward": {"send": 768}, "backward": {"send": 1792}}


def test_wire_bytes_applies_each_collective_s_share():
    payload = {"forward": {"all_reduce": 1000, "all_to_all": 1000, "send": 1000}, "backward": {"send": 10}}
    wire = mnp.wire_bytes(payload, 4, bytes_per_element=2)
    assert wire == {"forward": {"all_reduce": 3000.0, "all_to_all": 1500.0, "send": 2000.0},
                    "backward": {"send": 20.0}}
    assert wire["forward"]["all_reduce"] == mnp.all_reduce_bytes(1000, 4, 2)
    assert mnp.wire_bytes(payload, 1)["forward"] == {"all_reduce": 0.0, "all_to_all": 0.0, "send": 4000.0}
    with pytest.raises(ValueError, match=r"unknown collective\(s\) \['broadcast'\]"):
        mnp.wire_bytes({"forward": {"broadcast": 1}}, 2)
    with pytest.raises(TypeError, match="payload must be a dict"):
        mnp.wire_bytes([1, 2], 2)


@pytest.mark.parametrize("scheme,P,changes,words", [
    ("pipeline", 2, {}, "scheme must be one of"),
    ("tensor", 3, {}, "n_heads=8 is not divisible by world_size=3"),
    ("ulysses", 16, {}, "n_heads=8 is not divisible by world_size=16"),
    ("tensor", 4, {"n_kv_heads": 3, "n_heads": 12}, "n_kv_heads=3 and world_size=4"),
    ("ulysses", 8, {"seq_len": 12}, "seq_len=12 is not divisible by world_size=8"),
    ("ring", 3, {}, "seq_len=16 is not divisible by 2 \\* world_size = 6"),
    ("ring", 2, {"n_kv_heads": 3}, "n_heads=8 is not divisible by n_kv_heads=3"),
])
def test_payload_per_layer_refuses_a_scheme_that_cannot_use_p_ranks(scheme, P, changes, words):
    with pytest.raises(ValueError, match=words):
        mnp.payload_per_layer(scheme, world_size=P, **{**SIZES, **changes})


def test_kv_heads_fewer_than_the_ranks_are_replicated_not_refused():
    """h_kv = 2 key/value heads over P = 4 ranks: each is replicated on 2 ranks (tensor parallelism)."""
    assert mnp.payload_per_layer("tensor", world_size=4, **SIZES)["forward"]["all_reduce"] == 2 * 16 * 32
