"""Chapter 11's claims over seeds: every sentence about a trained model, asserted on every stored seed.

The table `ch11_knockouts` (tools/data/train_induction.py --seeds) holds ten models trained like the
shipped one, seeds 0 to 9, read after 800 steps (the chapter's live training, keys "live_...") and
after 2000 (the shipped model's steps). Seed 0 is the shipped model itself. The chapter prints
the table; these tests assert its sentences, and its cells' asserts, on every row. Claims about
"this model" are asserted on the shipped weights in tests/test_induction.py.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt
from mha.experiments import induction, seeds

NAME = "ch11_knockouts"
ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "book" / "11_training_a_transformer.ipynb"
LOG_26 = np.log(26)


def column(key):
    return seeds.column(NAME, key)


def chapter_code():
    return "\n".join("".join(c["source"]) for c in json.loads(CHAPTER.read_text())["cells"] if c["cell_type"] == "code")


def test_ten_seeds_are_stored_and_seed_0_is_the_shipped_model():
    table = seeds.load(NAME)
    params, about = induction.trained_params()
    assert table["seeds"] == list(range(10)) and about["seed"] == 0 and about["steps"] == induction.SHIPPED_STEPS
    assert about["kernels"] == table["kernels"], "the shipped weights and the table are made under the same kernels"
    stored, fresh = table["rows"][0], induction.read_model(params)
    assert max(np.max(np.abs(np.subtract(value, stored[key]))) for key, value in fresh.items()) < 1e-9


def test_a_stored_row_is_rederived_within_the_tolerance():
    """Seed 0, the shipped model: every seed costs the same (2000 steps)."""
    stored, fresh, gap = seeds.rederive("ch11_knockouts", 0)
    assert gap <= seeds.get_sweep(NAME).tolerance, f"seed 0 re-derived {gap:.3g} away"


def test_the_chapter_reads_the_same_sequences_as_the_table():
    code, held_out = chapter_code(), induction.held_out_sequences()
    assert "induction.segment_and_repeat(np.random.default_rng(1234), 200, 12)" in code
    assert "induction.segment_and_repeat(np.random.default_rng(1234), 200, 12, shuffle_repeat=True)" in code
    assert "induction.alphabet_runs(np.random.default_rng(5), 200, 12)" in code
    assert np.array_equal(held_out["repeat"], induction.segment_and_repeat(np.random.default_rng(1234), 200, 12))


def test_an_untrained_model_scores_a_little_worse_than_log_26_for_every_seed():
    """"An untrained model should score near log 26, a little worse": ten random starts."""
    sample = torch.randint(0, 26, (8, 32), generator=torch.Generator().manual_seed(2))
    for seed in range(10):
        torch.manual_seed(seed)
        with torch.no_grad():
            loss = mt.causal_lm_loss(induction.InductionConfig().model()(sample), sample).item()
        assert LOG_26 < loss < LOG_26 + 0.3, (seed, loss)


def test_the_live_training_asserts_hold_on_every_seed():
    """The live cell (800 steps): `assert live_first > 3.0 and live_repeat < 0.5`."""
    first, repeat = column("live_first_loss"), column("live_repeat_loss")
    assert np.all(first > 3.0) and np.all(repeat < 0.5)
    assert np.sum(repeat < 0.02) == 9 and 0.3 < repeat.max() < 0.32  # "below 0.02 for nine seeds; seed 2 at 0.31"
    assert np.argmax(repeat) == 2 and np.all(column("repeat_loss") < 0.01)  # "after 2000 steps every seed below 0.01"


def test_every_training_curve_has_a_plateau_a_drop_and_a_level_a_little_above_1():
    curves, ends = column("curve"), 50 * np.arange(1, 41)  # the mean loss of each 50 steps
    assert curves.shape == (10, 40)
    assert np.all(curves[:, :4] > 3.1), "above 3.1 for the first 200 steps"
    below_3, below_1_5 = ends[np.argmax(curves < 3, axis=1)], ends[np.argmax(curves < 1.5, axis=1)]
    assert set(below_3) <= {250, 300} and set(below_1_5) <= {400, 450}
    assert np.all((curves[:, -1] > 1.0) & (curves[:, -1] < 1.09)), "a little above 1 at step 2000"
    assert np.all((curves[:, 15] > 1.0) & (curves[:, 15] < 1.2)), "the live run levels off a little above 1"


def test_every_seed_has_the_circuit():
    previous, whole, copying = column("previous"), column("previous_whole"), column("induction")  # (10, 2, 2)
    strongest = previous[:, 0].argmax(axis=1)
    highest = previous[:, 0].max(axis=1)
    assert round(highest.min(), 2) == 0.88 and round(highest.max(), 2) == 0.95, "block 1: a head between 0.88 and 0.95"
    assert round(copying[:, 1].min(), 2) == 0.90 and round(copying[:, 1].max(), 2) == 0.95, "two induction heads"
    assert np.all(copying[:, 0] < 0.1) and np.all(previous[:, 1] < 0.12)
    over_whole = whole[np.arange(10), 0, strongest]
    assert round(over_whole.min(), 2) == 0.51 and round(over_whole.max(), 2) == 0.63, "over the whole sequence"
    other = previous[:, 0].min(axis=1)
    assert round(other[0], 2) == 0.22 and round(other.max(), 2) == 0.85, "the other head: 0.22 here, up to 0.85"


def test_the_shipped_models_scores_against_a_head_that_attends_evenly():
    """"0.22 and 0.09 are a little above what a head that attends evenly scores (0.19 and 0.06)"."""
    evenly = (np.tril(np.ones((24, 24))) / np.arange(1, 25)[:, None])[None, None, None]
    even_previous = induction.previous_token_scores(evenly, 12)[0, 0]
    even_induction = induction.induction_scores(evenly, 12)[0, 0]
    assert np.isclose(even_previous, np.mean([1 / (t + 1) for t in range(1, 12)]))
    assert np.isclose(even_induction, np.mean([1 / (t + 1) for t in range(12, 24)]))
    shipped = seeds.load(NAME)["rows"][0]
    previous, copying = np.array(shipped["previous"]), np.array(shipped["induction"])
    assert round(even_previous, 2) == 0.19 and round(even_induction, 2) == 0.06
    assert even_previous < previous[0, 1] < even_previous + 0.05, "0.22: a little above 0.19"
    assert even_induction < copying[0, 1] < even_induction + 0.05, "0.09: a little above 0.06"
    assert round(previous[0, 0], 2) == 0.94 and round(shipped["previous_whole"][0][0], 2) == 0.62


def test_the_knock_outs_that_hold_on_every_seed():
    knocked, both_off = column("knocked"), column("block_2_off")  # (10, 2, 2), (10,)
    worst_1, worst_2 = knocked[:, 0].max(axis=1), knocked[:, 1].max(axis=1)
    assert np.all(worst_1 > worst_2), "the costliest single knock-out is a head of block 1"
    assert np.all(both_off > LOG_26) and round(both_off.min(), 2) == 4.49 and round(both_off.max(), 2) == 5.41
    strongest = column("previous")[:, 0].argmax(axis=1)
    assert np.array_equal(column("previous_head_knocked"), knocked[np.arange(10), 0, strongest])


def test_the_knock_outs_that_depend_on_the_seed():
    previous, knocked = column("previous")[:, 0], column("knocked")
    worst_1 = knocked[:, 0].max(axis=1)
    alone = np.flatnonzero(worst_1 > LOG_26)
    assert list(alone) == [0, 1, 2, 3, 4, 5, 6, 7, 8], "on nine seeds one head of block 1 is a single point of failure"
    assert round(worst_1[alone].min(), 2) == 3.52 and round(worst_1[alone].max(), 2) == 5.92
    assert np.round(previous[9], 2).tolist() == [0.88, 0.85] and np.round(knocked[9, 0], 2).tolist() == [1.13, 1.90]
    assert round(knocked[:, 1].min(), 2) == 0.02 and round(knocked[:, 1].max(), 2) == 3.14
    assert np.argmax(knocked[:, 1].max(axis=1)) == 6 and knocked[6, 1].argmax() == 1 and knocked[6, 1, 1] < LOG_26


def test_the_knock_out_exercises_asserts_and_answers_hold_on_every_seed():
    """ex-ch11-knock-out trains 800 steps (seed 1) and asserts what holds for every row of the table."""
    previous, knocked, both_off = column("live_previous")[:, 0], column("live_knocked"), column("live_block_2_off")
    margin = knocked[:, 0].max(axis=1) - knocked[:, 1].max(axis=1)
    assert np.all(margin > 0.5) and round(margin.min(), 2) == 1.27  # `second_knocked[0].max() > ... + 0.5`
    assert np.all(both_off > LOG_26) and round(both_off.min(), 2) == 4.16 and round(both_off.max(), 2) == 4.82
    assert np.sum(knocked[:, 0].max(axis=1) > LOG_26) == 6, "above log 26 on 6 of the 10"
    assert np.sum(((previous > 0.5) & (knocked[:, 0] < 1)).any(axis=1)) == 7
    shared = [seed for seed in range(10) if np.all(knocked[seed, 0] > 1)]
    assert shared == [2, 9], "on seeds 2 and 9 each head of block 1 costs more than 1"
    assert np.round(previous[1], 2).tolist() == [0.70, 0.94] and round(knocked[1, 0, 0], 2) == 0.13


def test_copying_new_pairs_and_the_shuffled_repeat_on_every_seed():
    assert np.all(column("runs_first_loss") > LOG_26) and np.all(column("runs_repeat_loss") < 0.02)
    induction_scores, baseline = column("induction")[:, 1], column("induction_shuffled")[:, 1]
    follows = column("after_copy_shuffled")[:, 1]
    assert np.all(induction_scores > 6 * baseline) and np.all(follows > 0.8)  # the chapter's assert, every seed
    assert np.all(baseline > 0.06), "still a little above an evenly attending head"


def test_every_seed_continues_the_segment_and_the_run_and_slips_on_transformer():
    copied = column("copied")  # (10, 3): letters right before the first slip
    assert np.all(copied[:, 0] == 16) and np.all(copied[:, 1] == 16), "without a slip"
    assert np.all(copied[:, 2] <= 2), "every seed slips within the first three letters of transformer"


def gap_losses(params, seed):
    """The gap exercise's loss on the repeat, (4 values of k, letters from all 26 / from outside the segment)."""
    rng = np.random.default_rng(seed)
    segment = induction.segment_and_repeat(rng, 200, 8)[:, :8]
    outside = [np.setdiff1d(np.arange(26), row) for row in segment]
    losses = []
    for k in (0, 4, 8, 16):
        anywhere = rng.integers(26, size=(200, k))
        elsewhere = np.stack([rng.choice(pool, size=k, replace=False) for pool in outside])
        losses.append([induction.next_token_losses(params, np.concatenate([segment, between, segment], axis=1))
                       [:, 8 + k:].mean() for between in (anywhere, elsewhere)])
    return np.array(losses)


@pytest.mark.parametrize("draw", range(11, 21))
def test_the_gap_exercise_holds_for_ten_draws_of_the_letters(draw):
    """ex-ch11-gap on the shipped model (its own draw is 11): the cell's assert and the ranges of its text."""
    params, _ = induction.trained_params()
    losses = gap_losses(params, draw)
    assert np.all(losses[:, 1] < 0.05) and np.all(losses[1:, 0] > 0.05)  # the cell's assert
    assert 0.07 <= losses[1, 0] <= 0.11 and np.all((0.15 <= losses[2:, 0]) & (losses[2:, 0] <= 0.3))


def test_the_loss_values_exercise_holds_for_any_letters():
    """ex-ch11-loss-values: the three losses do not depend on the draw of the letters."""
    for seed in range(5):
        ids = np.random.default_rng(seed).integers(0, 26, size=(32, 32))
        half = np.zeros((32, 32, 26))
        np.put_along_axis(half[:, :-1], ids[:, 1:, None], np.log(25.0), axis=-1)
        assert np.isclose(mnp.causal_lm_loss(np.zeros((32, 32, 26)), ids), np.log(26))
        assert np.isclose(mnp.causal_lm_loss(half, ids), np.log(2))


def test_the_every_seed_sentences_hold_on_the_held_out_seed(one_torch_thread):
    """Seed 101, trained here (2000 steps, never stored): what the chapter says of every seed. On it the
    second induction head scores 0.89 and both heads of block 2 off cost 4.83, outside the ranges of the
    ten stored seeds ("the ranges of ten seeds, not bounds"); the circuit and every assert remain."""
    ends = 50 * np.arange(1, 41)
    for row in seeds.held_out_rows(NAME):
        curve = np.array(row["curve"])
        assert row["live_first_loss"] > 3.0 and row["live_repeat_loss"] < 0.5 and row["repeat_loss"] < 0.01
        assert np.all(curve[:4] > 3.1) and ends[np.argmax(curve < 3)] in (250, 300)
        assert ends[np.argmax(curve < 1.5)] in (400, 450) and 1.0 < curve[-1] < 1.09
        previous, copying = np.array(row["previous"]), np.array(row["induction"])  # (block, head) each
        assert previous[0].max() > 0.8 and copying[1].min() > 0.8, "the circuit"
        assert previous[1].max() < 0.19 and copying[0].max() < 0.2, "the other scores far below"
        knocked, live = np.array(row["knocked"]), np.array(row["live_knocked"])
        assert knocked[0].max() > knocked[1].max() and row["block_2_off"] > LOG_26
        assert live[0].max() > live[1].max() + 0.5 and row["live_block_2_off"] > LOG_26  # the exercise's asserts
        assert row["runs_first_loss"] > LOG_26 and row["runs_repeat_loss"] < 0.02
        shuffled, follows = np.array(row["induction_shuffled"])[1], np.array(row["after_copy_shuffled"])[1]
        assert np.all(copying[1] > 6 * shuffled) and np.all(follows > 0.8)  # the chapter's assert
        assert row["copied"][:2] == [16, 16] and row["copied"][2] <= 2
