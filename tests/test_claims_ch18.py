"""Chapter 18's sentences about what a fixed state can recall, asserted over the stored seeds.

The sweep "ch18_recall" (mha.experiments.recall, written by tools/data/seed_sweeps.py): multi-query associative
recall (Arora et al. 2023) with 8, 16, 32 and 64 key-value pairs, learned by one small layer whose token mixer is
softmax attention, linear attention, DeltaNet or Gated DeltaNet, the three linear ones holding the same state
(2 heads x 16 x 16 numbers), five training seeds each. Each claim is asserted over every stored seed with a
margin the seeds' spread supports, and on a held-out DeltaNet seed trained here; one stored row is trained
again here. The task and the models are checked first: the sequences hold what they say, the mixers compute
the library's rules, and the states hold the numbers the table states.
"""

import numpy as np
import pytest
import torch

import mha.torch as mt
from mha.experiments import recall, seeds
from mha.experiments.induction import one_thread
from mha.experiments.recall_model import MIXERS, RecallMixer, RecallModel

RECALL = "ch18_recall"


# The task and the models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pairs", [1, 5, 64])
def test_a_sequence_stores_pairs_then_asks_every_key_once(pairs):
    inputs, targets = recall.mqar_batch(pairs, 7, torch.Generator().manual_seed(pairs))
    assert inputs.shape == targets.shape == (7, 3 * pairs)
    for row, target in zip(inputs.tolist(), targets.tolist()):
        keys, values, queries = row[0:2 * pairs:2], row[1:2 * pairs:2], row[2 * pairs:]
        assert len(set(keys)) == pairs and all(0 <= k < recall.N_KEYS for k in keys)
        assert all(recall.N_KEYS <= v < recall.VOCAB_SIZE for v in values)
        assert sorted(queries) == sorted(keys)  # every key asked once
        answer = dict(zip(keys, values))
        assert target[:2 * pairs] == [recall.IGNORE] * (2 * pairs)
        assert target[2 * pairs:] == [answer[q] for q in queries]


def test_the_task_refuses_more_pairs_than_keys():
    with pytest.raises(ValueError, match=r"pairs must be in \[1, 64\] \(distinct keys\), got 65"):
        recall.mqar_batch(65, 1, torch.Generator())
    with pytest.raises(ValueError, match="kind must be one of"):
        RecallMixer("mamba", 8, n_heads=1, d_k=4, d_v=4)
    with pytest.raises(ValueError, match="pairs must be one of"):
        recall.run_number("delta", 12, 0)


def test_run_numbers_and_their_inverse():
    numbers = [recall.run_number(m, n, s) for m in MIXERS for n in recall.PAIRS for s in range(5)]
    assert len(set(numbers)) == 80
    assert [recall.split_number(x) for x in numbers] == [(m, n, s) for m in MIXERS for n in recall.PAIRS
                                                         for s in range(5)]


def token_by_token(mixer, x):
    """The mixer of `mixer` (a RecallMixer) on x (1, T, d_model), its rule computed token after token
    (the recurrent forms, or softmax over the keys so far): (1, T, d_model)."""
    previous = torch.nn.functional.pad(x, (0, 0, 1, 0))[:, :-1]
    q, k, v = mixer.heads(mixer.W_q(x), mixer.d_k), mixer.heads(mixer.W_k(previous), mixer.d_k), \
        mixer.heads(mixer.W_v(x), mixer.d_v)  # (1, h, T, d)
    if mixer.kind == "softmax":
        out = torch.cat([torch.softmax(q[..., t:t + 1, :] @ k[..., :t + 1, :].transpose(-1, -2)
                                       / mixer.d_k ** 0.5, dim=-1) @ v[..., :t + 1, :]
                         for t in range(x.shape[1])], dim=-2)  # (1, h, T, d_v)
    elif mixer.kind == "linear":
        out = mt.linear_attention_recurrent(mt.elu_feature_map(q), mt.elu_feature_map(k), v)[0]
    else:
        beta = torch.sigmoid(mixer.W_b(x)).transpose(1, 2)  # (1, h, T)
        g = None if mixer.kind == "delta" else \
            (-mixer.A_log.exp() * torch.nn.functional.softplus(mixer.W_a(x) + mixer.dt_bias)).transpose(1, 2)
        out = mt.gated_delta_rule_recurrent(mt.l2_normalize(q), mt.l2_normalize(k), v, g, beta)[0]
    return mixer.W_o(mixer.norm(out).transpose(1, 2).flatten(2))  # (1, T, d_model)


@pytest.mark.parametrize("kind", MIXERS)
def test_each_mixer_computes_its_rule_token_by_token(kind):
    """float64, T = 150 (chunks of 48: three full and a shorter last one): the chunked mixer equals its rule
    token after token, and its key at token t is made from token t - 1."""
    torch.manual_seed(5)
    mixer = RecallMixer(kind, 12, n_heads=2, d_k=4, d_v=3).double()
    x = torch.randn(1, 150, 12, dtype=torch.float64)
    torch.testing.assert_close(mixer(x), token_by_token(mixer, x), rtol=0, atol=1e-12)
    changed = x.clone()
    changed[0, -1] += 1.0  # the last token: only the last output may move, through its query and value
    assert torch.equal(mixer(changed)[0, :-1], mixer(x)[0, :-1])


def test_the_linear_mixers_hold_the_same_state_and_softmax_a_growing_cache():
    """What the table's "state_numbers" say, read from the library's rules: the state the chunked functions
    return has 2 x 16 x 16 numbers per sequence whatever T; softmax attention keeps keys and values (64 a token)."""
    size = recall.SIZE
    for T in (24, 192):
        q = torch.randn(1, size.n_heads, T, size.d_k)
        v = torch.randn(1, size.n_heads, T, size.d_v)
        linear_state = mt.linear_attention_chunked(q, q, v)[1]
        delta_state = mt.gated_delta_rule_chunked(q, q, v, None, torch.rand(1, size.n_heads, T))[1]
        assert linear_state.numel() == delta_state.numel() == 512
        for kind in MIXERS:
            model = recall.new_model(kind, 0)
            assert model.state_numbers(T) == (64 * T if kind == "softmax" else 512)


def test_the_models_differ_only_in_their_gates():
    """Parameters: 24 720 for softmax and linear attention; DeltaNet adds W_b (2 x 64), Gated DeltaNet W_a,
    A_log and b_dt (132 more)."""
    counts = {kind: sum(p.numel() for p in recall.new_model(kind, 0).parameters()) for kind in MIXERS}
    assert counts == {"softmax": 24720, "linear": 24720, "delta": 24848, "gated": 24980}
    assert isinstance(recall.new_model("gated", 0), RecallModel)


# The stored sweep: the table, one row trained again, and the held-out seed -------------------------------


def paired(mixer, pairs, reference="linear"):
    """Accuracy of `mixer` minus that of `reference`, seed by seed (the same seed: the same batches)."""
    return recall.accuracies(mixer, pairs) - recall.accuracies(reference, pairs)


@pytest.fixture(scope="module")
def held_out():
    """The held-out DeltaNet (32 pairs, training seed 5; trained here, never stored): its row."""
    with one_thread():
        row = seeds.held_out_rows(RECALL)[0]
    return row


def test_a_stored_row_is_trained_again_within_its_tolerance():
    """Linear attention, 32 pairs, seed 0: 500 steps on one thread (about 20 s). Measured on an AMD EPYC machine:
    the same accuracy (0.8965) under the generic, AVX2 and AVX-512 kernels, the final loss 3e-8 apart; the
    tolerance, 0.02 (82 of 4096 queries), leaves room for other CPUs and is below every margin claimed."""
    with one_thread():
        row, fresh, gap = seeds.rederive("ch18_recall", recall.run_number("linear", 32, 0))
    assert gap <= seeds.get_sweep(RECALL).tolerance, f"{row} re-derived as {fresh}: {gap} apart"


def test_the_table_holds_five_seeds_of_every_mixer_and_number_of_pairs():
    table = seeds.load(RECALL)
    cells = recall.rows_by_cell(table["rows"])
    assert sorted(cells) == sorted((m, n) for m in MIXERS for n in (8, 16, 32, 64))
    for cell, rows in cells.items():
        assert [row["training_seed"] for row in rows] == list(range(5)), cell
    assert "OMP_NUM_THREADS=1" in table["kernels"] and table["seconds"] < 30 * 60 * 2  # 30 minutes on 2 jobs
    size = recall.SIZE
    assert (size.d_model, size.n_layers, size.n_heads, size.d_k, size.d_v, size.steps, size.tokens_per_step) == \
        (64, 1, 2, 16, 16, 500, 3072)
    state = {cell: rows[0]["state_numbers"] for cell, rows in cells.items()}
    assert all(state[(m, n)] == (64 * 3 * n if m == "softmax" else 512) for m, n in state)


def test_the_table_as_the_chapter_prints_it():
    """Median accuracy (smallest, largest) over the five seeds, rounded as printed."""
    printed = {mixer: {n: tuple(round(cell[key], 2) for key in ("median", "low", "high")) for n, cell in row.items()}
               for mixer, row in recall.recall_table().items()}
    assert printed == {
        "softmax": {8: (1.0, 1.0, 1.0), 16: (1.0, 1.0, 1.0), 32: (1.0, 1.0, 1.0), 64: (1.0, 1.0, 1.0)},
        "linear": {8: (1.0, 1.0, 1.0), 16: (0.98, 0.97, 0.98), 32: (0.87, 0.86, 0.9), 64: (0.48, 0.45, 0.5)},
        "delta": {8: (1.0, 1.0, 1.0), 16: (1.0, 1.0, 1.0), 32: (0.99, 0.98, 0.99), 64: (0.79, 0.51, 0.82)},
        "gated": {8: (1.0, 1.0, 1.0), 16: (1.0, 1.0, 1.0), 32: (0.98, 0.94, 0.99), 64: (0.63, 0.37, 0.83)}}


def test_softmax_attention_recalls_every_query_at_every_number_of_pairs():
    """"Softmax attention answers every one of the 4096 queries, at 8 pairs and at 64, on all five seeds": its
    cache grows with the sequence (12 288 numbers at 64 pairs, 24 times the linear mixers' 512)."""
    for n in recall.PAIRS:
        assert recall.accuracies("softmax", n).min() == 1.0
    assert 64 * 3 * 64 == 24 * 512


def test_linear_attention_drops_as_the_pairs_outgrow_its_state():
    """"Linear attention falls on every seed as the pairs grow: at least 0.99 at 8 pairs, 0.86 to 0.90 at 32,
    0.45 to 0.50 at 64"; its seeds agree to within 0.06 at every number of pairs."""
    linear = np.array([recall.accuracies("linear", n) for n in recall.PAIRS])  # (pairs, seeds)
    assert (np.diff(linear, axis=0) < 0).all()
    assert linear[0].min() >= 0.99 and 0.85 < linear[2].min() and linear[2].max() < 0.90
    assert 0.44 < linear[3].min() and linear[3].max() < 0.51
    assert (linear.max(axis=1) - linear.min(axis=1)).max() < 0.06


def test_the_delta_rule_recalls_more_than_linear_attention_in_the_same_state():
    """"DeltaNet, in the same 512 numbers, recalls at least 0.98 of the queries up to 32 pairs on every seed; at
    32 pairs it beats linear attention on every seed by 0.09 to 0.13; at 64 pairs it falls too (0.51 to 0.82),
    still above linear attention on every seed, by 0.03 to 0.36": how much, the seeds do not agree on."""
    for n in (8, 16, 32):
        assert recall.accuracies("delta", n).min() >= 0.98
    assert paired("delta", 16).min() > 0.015
    at_32, at_64 = paired("delta", 32), paired("delta", 64)
    assert at_32.min() > 0.085 and at_32.max() < 0.13
    assert at_64.min() > seeds.get_sweep(RECALL).tolerance and at_64.max() > 0.35
    delta_64 = recall.accuracies("delta", 64)
    assert 0.5 < delta_64.min() and delta_64.max() < 0.82 and delta_64.max() - delta_64.min() > 0.3


def test_no_fixed_state_recalls_64_pairs():
    """"At 64 pairs, four times a head's 16 dimensions, none of the three linear mixers recalls more than 0.84
    of the queries on any seed; softmax attention all of them"."""
    for mixer in ("linear", "delta", "gated"):
        assert recall.accuracies(mixer, 64).max() < 0.84
        assert (recall.accuracies("softmax", 64) - recall.accuracies(mixer, 64)).min() > 0.15


def test_the_gate_does_not_help_recall():
    """"Gated DeltaNet, its gate started almost open, recalls as DeltaNet does up to 16 pairs and beats linear
    attention at 32 on every seed (by 0.04 at least); its median is below DeltaNet's at 32 and 64 pairs: recall
    asks for no forgetting". Not claimed, because the seeds disagree: that the gate costs on every seed (seed 3
    is one query better at 32 pairs, and better at 64), or how it compares with linear attention at 64 pairs
    (worse on two seeds of five, better on three)."""
    for n in (8, 16):
        assert np.abs(paired("gated", n, "delta")).max() < 0.002
    assert paired("gated", 32).min() > 0.04 and recall.accuracies("gated", 32).min() > 0.93
    for n in (32, 64):
        assert np.median(paired("gated", n, "delta")) < 0
    assert 0 < np.sum(paired("gated", 32, "delta") > 0) < 5 and 0 < np.sum(paired("gated", 64, "delta") > 0) < 5
    assert np.sum(paired("gated", 64) < 0) == 2


def test_a_held_out_deltanet_seed_beats_every_stored_linear_attention_at_32_pairs(held_out):
    """DeltaNet at 32 pairs on a seed never stored, trained here: at least 0.97, more than 0.05 above linear
    attention's best stored seed (0.90), as on the stored seeds."""
    assert recall.split_number(held_out["seed"]) == ("delta", 32, 5)
    assert held_out["accuracy"] >= 0.97
    assert held_out["accuracy"] > recall.accuracies("linear", 32).max() + 0.05
    assert held_out["state_numbers"] == 512
