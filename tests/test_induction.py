"""Chapter 11's experiment: the data, the training, the head scores, the knock-outs, and the shipped weights
that the chapter reads ("this model"). The chapter's claims over seeds, on the stored table of ten models, are
asserted in tests/test_claims_ch11.py. That the weights and the table ship in the wheel: tests/test_colab.py."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import mha.numpy as mnp
from mha.experiments import induction

ROOT = Path(__file__).resolve().parent.parent
V = 26


def successor_pairs(tokens, periods=None):
    """How many times token v + 1 (mod V) directly follows token v, the wrap of each period included."""
    pairs = (tokens[..., 1:] == (tokens[..., :-1] + 1) % V).sum()
    if periods is not None:
        first, last = tokens[:, 0], tokens[np.arange(len(tokens)), periods - 1]
        pairs += (first == (last + 1) % V).sum()
    return int(pairs)


def test_training_sequences_repeat_a_segment_of_distinct_letters_with_no_alphabet_successor():
    tokens, periods = induction.periodic_segments(np.random.default_rng(0), 500, 32, 4, 16)
    assert tokens.shape == (500, 32) and periods.min() == 4 and periods.max() == 16
    for row, L in zip(tokens, periods):
        assert len(set(row[:L])) == L, "the letters of a segment are distinct"
        assert np.array_equal(row[L:], row[:32 - L]), "then the segment repeats, period L"
    assert successor_pairs(tokens, periods) == 0


def test_held_out_sequences_and_alphabet_runs():
    rng = np.random.default_rng(1)
    pairs = induction.segment_and_repeat(rng, 100, 12)
    shuffled = induction.segment_and_repeat(np.random.default_rng(1), 100, 12, shuffle_repeat=True)
    runs = induction.alphabet_runs(rng, 100, 12)
    assert pairs.shape == shuffled.shape == runs.shape == (100, 24)
    assert np.array_equal(pairs[:, :12], pairs[:, 12:]) and np.array_equal(shuffled[:, :12], pairs[:, :12])
    assert np.array_equal(np.sort(shuffled[:, 12:]), np.sort(shuffled[:, :12]))
    assert not np.array_equal(shuffled[:, 12:], shuffled[:, :12])
    assert successor_pairs(pairs[:, :12], np.full(100, 12)) == 0
    assert successor_pairs(runs[:, :12]) == 100 * 11, "every neighbour pair of a run is one training never shows"
    assert induction.spell([7, 4, 11, 11, 14]) == "hello"


def test_the_scores_read_the_right_diagonals():
    """Hand-made weights: head 0 attends to the previous token, head 1 to t - L + 1 in the repeat."""
    L, T = 4, 8
    weights = np.zeros((1, 1, 2, T, T))  # (n_layers, B, h, T, T)
    weights[0, 0, 0, 0, 0] = 1
    weights[0, 0, 0, np.arange(1, T), np.arange(T - 1)] = 1
    weights[0, 0, 1, np.arange(L), 0] = 1
    weights[0, 0, 1, np.arange(L, T), np.arange(1, L + 1)] = 1
    assert np.array_equal(induction.previous_token_scores(weights, L), [[1.0, 1 / 3]])
    assert np.array_equal(induction.induction_scores(weights, L), [[0.0, 1.0]])


def test_the_progress_bar():
    assert induction.progress_bar(300, 1000, 2.9126, 1.94, width=10) == "step  300/1000 [###.......] loss 2.913   1.9 s"


def test_training_is_deterministic_on_one_machine(capsys):
    config = replace(induction.InductionConfig(), batch_size=4)
    first = induction.train_induction(config, 6, seed=3, progress=True, report_every=3)[1]
    second = induction.train_induction(config, 6, seed=3, progress=False)[1]
    assert first == second and len(first) == 6
    assert capsys.readouterr().out.count("step ") == 2


@pytest.fixture(scope="module")
def held_out():
    """200 new sequences, a segment of 12 letters and its repeat, from a generator training never uses."""
    return induction.segment_and_repeat(np.random.default_rng(1234), 200, 12)


def test_on_step_sees_every_step_and_a_longer_run_begins_as_a_shorter_one():
    """The schedule does not depend on the number of steps: step 3 of a 6-step run is a 3-step run."""
    config = replace(induction.InductionConfig(), batch_size=4)
    seen = {}

    def keep(step, model):
        seen[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    induction.train_induction(config, 6, seed=3, progress=False, on_step=keep)
    short, _ = induction.train_induction(config, 3, seed=3, progress=False)
    assert sorted(seen) == [1, 2, 3, 4, 5, 6]
    assert all(torch.equal(v, seen[3][k]) for k, v in short.state_dict().items())
    assert not all(torch.equal(v, seen[6][k]) for k, v in short.state_dict().items())


def test_the_weight_after_the_earlier_copy_follows_a_shuffled_repeat():
    """Hand-made weights: block 1 looks t - L + 1 back (a fixed distance), block 2 after the earlier copy."""
    L, T = 3, 6
    tokens = np.array([[0, 1, 2, 2, 0, 1]])  # the repeat is shuffled: 2 0 1
    weights = np.zeros((2, 1, 1, T, T))  # (n_layers, B, h, T, T)
    weights[0, 0, 0, np.arange(T), np.maximum(np.arange(T) - L + 1, 0)] = 1
    weights[1, 0, 0, [3, 4, 5], [3, 1, 2]] = 1  # 2 -> after position 2; 0 -> position 1; 1 -> position 2
    assert np.array_equal(induction.after_copy_weights(weights, tokens, L), [[0.0], [1.0]])
    assert np.array_equal(induction.induction_scores(weights, L), [[1.0], [0.0]])


def test_the_previous_token_score_of_the_whole_sequence():
    L, T = 4, 8
    weights = np.zeros((1, 1, 1, T, T))
    weights[0, 0, 0, np.arange(1, L), np.arange(L - 1)] = 1  # looks back in the first segment only
    assert induction.previous_token_scores(weights, L)[0, 0] == 1.0
    assert np.isclose(induction.previous_token_scores(weights, L, whole_sequence=True)[0, 0], 3 / 7)


def test_the_held_out_sequences_are_the_chapters():
    sequences = induction.held_out_sequences()
    assert {k: v.shape for k, v in sequences.items()} == {"repeat": (200, 24), "shuffled": (200, 24), "runs": (200, 24)}
    assert np.array_equal(sequences["shuffled"][:, :12], sequences["repeat"][:, :12])
    assert np.array_equal(sequences["runs"], induction.alphabet_runs(np.random.default_rng(5), 200, 12))


# The shipped weights: what the chapter prints, in float64, the same on every CPU -------------------


@pytest.fixture(scope="module")
def shipped():
    return induction.trained_params()


def test_the_shipped_weights_load_as_the_numpy_faces_parameters(shipped):
    params, about = shipped
    assert about["seed"] == 0 and about["steps"] == 2000 and about["config"]["vocab_size"] == V
    assert params["embedding"].dtype == np.float64 and params["embedding"].shape == (V, 32)
    model = induction.InductionConfig(**about["config"]).model(dtype=torch.float64)
    with torch.no_grad():
        model.embedding.weight.copy_(torch.from_numpy(params["embedding"]))
    assert set(model.numpy_params()) == set(params)
    assert set(model.numpy_params()["layers"][0]) == set(params["layers"][0])


def test_the_shipped_model_has_a_previous_token_head_and_two_induction_heads(shipped, held_out):
    params, _ = shipped
    _, weights = mnp.decoder_only_transformer(held_out, **params)
    previous, copying = induction.previous_token_scores(weights, 12), induction.induction_scores(weights, 12)
    assert previous[0, 0] > 0.9 and previous[0, 1] < 0.5 and previous[1].max() < 0.2
    assert copying[1].min() > 0.9 and copying[0].max() < 0.2


def test_the_induction_score_clearly_exceeds_a_shuffled_baseline(shipped, held_out):
    """The same score on the same segments with their repeat shuffled: the token at t - L + 1 is then not the
    one that followed the earlier copy of token t, and the induction heads no longer look there."""
    params, _ = shipped
    shuffled = induction.segment_and_repeat(np.random.default_rng(1234), 200, 12, shuffle_repeat=True)
    _, weights = mnp.decoder_only_transformer(held_out, **params)
    _, shuffled_weights = mnp.decoder_only_transformer(shuffled, **params)
    score, baseline = induction.induction_scores(weights, 12)[1], induction.induction_scores(shuffled_weights, 12)[1]
    assert score.min() > 0.9 and baseline.max() < 0.15 and np.all(score > 6 * baseline)


def test_the_shipped_model_copies_and_its_knock_outs(shipped, held_out):
    params, _ = shipped
    losses = induction.next_token_losses(params, held_out)
    assert losses[:, :11].mean() > 3.0 and losses[:, 12:].mean() < 0.05
    knocked = induction.knock_out_losses(params, held_out, 12)
    assert knocked[0, 0] > 3.0, "in this model, without the previous-token head, nothing is copied"
    assert knocked[0, 1] < 0.5 and knocked[1].max() < 1.0, "in this model, each induction head alone almost suffices"
    runs = induction.alphabet_runs(np.random.default_rng(5), 200, 12)
    assert induction.repeat_loss(params, runs, 12) < 0.05, "it copies pairs it never saw in training"


def test_the_shipped_model_continues_a_repeated_segment(shipped):
    params, _ = shipped
    segment = np.array([induction.LETTERS.index(c) for c in "kvbzqhtp"])

    def logits_fn(tokens):
        return mnp.decoder_only_transformer(tokens, **params)[0]

    out = mnp.generate_greedy(logits_fn, np.concatenate([segment, segment]), 14, max_len=32)
    assert induction.spell(out) == "kvbzqhtp" * 3 + "kvbzqh"
    assert [induction.letters_copied(params, text) for text in induction.PROMPTS] == [16, 16, 0]


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    config = replace(induction.InductionConfig(), n_layers=1)
    params = config.model().numpy_params()
    induction.save_params(tmp_path / "m.npz", params, config, seed=5)
    loaded, about = induction.load_params(tmp_path / "m.npz", dtype=np.float32)
    assert about["seed"] == 5 and about["config"]["n_layers"] == 1
    tokens = np.arange(10)[None]
    assert np.array_equal(mnp.decoder_only_transformer(tokens, **loaded)[0],
                          mnp.decoder_only_transformer(tokens, **params)[0])
