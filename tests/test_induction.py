"""Chapter 11's experiment: the data, the training (its claims over several seeds), the head scores, the
knock-outs, and the shipped weights that the chapter reads."""

import shutil
import subprocess
import sys
import zipfile
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


@pytest.fixture(scope="module")
def live_models():
    """The chapter's live training, 800 steps, for three seeds: {seed: (float64 parameters, losses)}."""
    torch.set_num_threads(1)
    trained = {}
    for seed in (0, 1, 2):
        model, losses = induction.train_induction(steps=800, seed=seed, progress=False)
        trained[seed] = model.double().numpy_params(), losses
    return trained


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_claims_of_the_live_training_hold_for_several_seeds(seed, live_models, held_out):
    """The chapter trains 800 steps live and asserts these claims; they hold with margins for every seed."""
    params, losses = live_models[seed]
    losses_per_position = induction.next_token_losses(params, held_out)
    first, repeat = losses_per_position[:, :11].mean(), losses_per_position[:, 12:].mean()
    _, weights = mnp.decoder_only_transformer(held_out, **params)
    previous, copying = induction.previous_token_scores(weights, 12), induction.induction_scores(weights, 12)
    assert first > 3.0 and repeat < 0.5
    assert previous[0].max() > 0.7 and copying[1].min() > 0.6
    assert losses[0] > 3.0 and np.mean(losses[-100:]) < 1.3


def test_knocking_out_the_strongest_previous_token_head_breaks_copying_in_a_second_model(live_models, held_out):
    """The chapter's Predict exercise (seed 1, 800 steps): block 1's two heads both look back, but only the
    stronger one is needed; each induction head alone almost suffices."""
    params, _ = live_models[1]
    _, weights = mnp.decoder_only_transformer(held_out, **params)
    previous = induction.previous_token_scores(weights, 12)
    knocked = induction.knock_out_losses(params, held_out, 12)
    assert previous[0].min() > 0.5, "both heads of block 1 look back"
    assert knocked[0].argmax() == previous[0].argmax() and knocked[0].max() > 2.0
    assert knocked[0].min() < 1.0 and knocked[1].max() < 1.5


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
    assert knocked[0, 0] > 3.0, "without the previous-token head, nothing is copied"
    assert knocked[0, 1] < 0.5 and knocked[1].max() < 1.0, "each induction head alone almost suffices"
    runs = induction.alphabet_runs(np.random.default_rng(5), 200, 12)
    assert induction.repeat_loss(params, runs, 12) < 0.05, "it copies pairs it never saw in training"


def test_the_shipped_model_continues_a_repeated_segment(shipped):
    params, _ = shipped
    segment = np.array([induction.LETTERS.index(c) for c in "kvbzqhtp"])

    def logits_fn(tokens):
        return mnp.decoder_only_transformer(tokens, **params)[0]

    out = mnp.generate_greedy(logits_fn, np.concatenate([segment, segment]), 14, max_len=32)
    assert induction.spell(out) == "kvbzqhtp" * 3 + "kvbzqh"


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


def test_the_weights_ship_in_the_wheel(tmp_path):
    """Chapter 11 reads them in Colab, where mha is pip-installed without the repository."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (checkout / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path),
                            str(checkout)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel, = tmp_path.glob("mha-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "mha/experiments/induction_model.npz" in archive.namelist()
