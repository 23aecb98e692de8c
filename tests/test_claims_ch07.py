"""Chapter 7's claims over seeds (CONTRIBUTING.md, "Claims hold beyond the case tried").

The chapter trains small models on one seed and reads the same trainings on many seeds from
the stored tables of five sweeps (mha.experiments.heads): "ch07_two_heads", "ch07_layouts",
"ch07_almost_identical", "ch07_conv_filters" and "ch07_perturbation". Here every sentence and
every assert of the chapter is checked on every stored row and on each sweep's held-out seeds
(trained here, never stored: what the chapter says about every seed must hold on them too), and
one row of each sweep, the chapter's own seed, is trained again on this machine and compared within
the sweep's tolerance. (The exact claim, identical heads staying identical bit for bit, is tests/test_heads.py.)
"""

import numpy as np
import pytest

from mha.experiments import heads, seeds

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def within_tolerance(name, rederived):
    """The fresh row of seeds.rederive(name, seed), once it is within the sweep's tolerance."""
    _, fresh, gap = rederived
    assert gap <= seeds.get_sweep(name).tolerance, f"{name}, seed {fresh['seed']}: {gap:.3g} apart"
    return fresh


def test_random_heads_split_and_identical_heads_stay_one_head_on_every_seed():
    column = lambda key: seeds.column("ch07_two_heads", key)  # noqa: E731
    assert len(column("difference")) >= 10
    assert (column("twin_difference") == 0).all() and column("difference").min() > 1
    assert column("errors").max() < 0.05
    twin = column("twin_errors")
    assert twin[:, 0].max() < 0.1 and twin[:, 1].min() > 0.85  # "its error on that half stays near 1"
    assert (column("previous_head") != column("partner_head")).all()
    assert 0 < (column("previous_head") == 0).sum() < len(twin)  # "the two may swap"
    assert min(column("previous_scores").max(axis=1).min(), column("partner_scores").max(axis=1).min(),
               column("wrap").min()) > 0.8
    for knocked, kept in (("without_previous_head", 1), ("without_partner_head", 0)):
        errors = column(knocked)
        assert 0.95 < errors[:, 1 - kept].min() and errors[:, 1 - kept].max() < 1.05  # "about 1"
        assert errors[:, kept].max() < 0.05


def test_the_two_heads_story_holds_on_the_held_out_seeds(one_torch_thread):
    """The chapter's asserts on every seed, on seeds 100 and 101 (about 4 s each; on 101 the partner
    head gives the partner 0.89, below the 0.9 an earlier version asserted)."""
    for row in seeds.held_out_rows("ch07_two_heads"):
        assert row["twin_difference"] == 0 and row["difference"] > 1 and max(row["errors"]) < 0.05
        assert row["twin_errors"][0] < 0.1 < 0.5 < row["twin_errors"][1]
        assert row["previous_head"] != row["partner_head"]
        assert min(max(row["previous_scores"]), max(row["partner_scores"]), row["wrap"]) > 0.8
        for knocked, kept in (("without_previous_head", 1), ("without_partner_head", 0)):
            assert row[knocked][1 - kept] > 0.5 > 0.05 > row[knocked][kept]


def test_a_row_of_the_two_heads_sweep_is_rederived():
    fresh = within_tolerance("ch07_two_heads", seeds.rederive("ch07_two_heads", 0))  # the chapter's seed
    assert fresh["twin_difference"] == 0.0


def test_one_head_fails_and_two_heads_beat_four_at_an_equal_budget_on_every_seed():
    stored = lambda key, layout: seeds.column("ch07_layouts", f"{key}_{layout[0]}x{layout[1]}")  # noqa: E731
    errors = {layout: stored("errors", layout) for layout in heads.LAYOUTS}
    weights = {layout: stored("partner_weights", layout) for layout in heads.LAYOUTS}
    assert len(errors[1, 20]) >= 10
    for one_head in ((1, 20), (1, 40)):
        assert errors[one_head].min() > 0.3  # "above 0.3 on both halves"
        assert 0.45 < weights[one_head].min() and weights[one_head].max() < 0.55  # "about half"
    assert max(errors[layout][:, 0].max() for layout in heads.LAYOUTS if layout[0] > 1) < 0.02
    partner = {layout: e[:, 1] for layout, e in errors.items()}
    assert round(min(errors[1, 20].min(), errors[1, 40].min()), 2) == 0.42  # "0.42 at the lowest over these 10"
    ratios = np.concatenate([partner[4, 5] / partner[2, 10], partner[4, 10] / partner[2, 20]])
    assert ratios.min() > 1.5 and (round(ratios.min(), 1), round(ratios.max(), 1)) == (2.4, 9.4)  # "2.4 to 9.4"
    assert (partner[2, 20] < partner[2, 10]).all() and (partner[4, 10] < partner[4, 5]).all()
    best_of_two = weights[2, 10].max(axis=1)
    assert 0.845 <= best_of_two.min() and best_of_two.max() < 0.905  # "0.85 to 0.90 of its weight"
    sharing = (weights[4, 5] > 0.3).sum(axis=1)
    assert sharing.min() == 1 and sharing.max() == 3  # "one to three heads give it more than 0.3"
    assert weights[4, 5].max() < 0.705  # "the best of them gets at most 0.70"
    assert (weights[4, 5].max(axis=1) < best_of_two).all()  # "less than the best of the two heads ... same seed"


def test_the_layouts_claims_hold_on_the_held_out_seed(one_torch_thread):
    """Seed 100 (about 40 s): one head above 0.3, the previous value learned, two heads beat four by 1.5
    or more (1.85 here: "other seeds come closer"), the larger budget wins, four narrow heads' best
    below two heads' best."""
    for row in seeds.held_out_rows("ch07_layouts"):
        errors = {layout: row[f"errors_{layout[0]}x{layout[1]}"] for layout in heads.LAYOUTS}
        best = {layout: max(row[f"partner_weights_{layout[0]}x{layout[1]}"]) for layout in heads.LAYOUTS}
        assert min(*errors[1, 20], *errors[1, 40]) > 0.3
        assert max(errors[layout][0] for layout in heads.LAYOUTS if layout[0] > 1) < 0.02
        assert errors[4, 5][1] > 1.5 * errors[2, 10][1] and errors[4, 10][1] > 1.5 * errors[2, 20][1]
        assert errors[2, 20][1] < errors[2, 10][1] and errors[4, 10][1] < errors[4, 5][1]
        assert best[4, 5] < best[2, 10] and best[2, 10] > 0.5  # "most of the partner's weight"


def test_a_row_of_the_layouts_sweep_is_rederived():
    fresh = within_tolerance("ch07_layouts", seeds.rederive("ch07_layouts", 0))
    assert fresh["errors_4x5"][1] > 1.5 * fresh["errors_2x10"][1]  # two heads beat four on the fresh row too


def test_unequal_w_o_blocks_split_the_heads_and_sgd_keeps_them_equal_on_every_seed():
    apart = seeds.column("ch07_almost_identical", "adam_w_o_doubled")
    assert len(apart) >= 10 and 0.08 <= apart.min() and apart.max() < 0.225  # "0.08 to 0.22"
    assert (seeds.column("ch07_almost_identical", "sgd") == 0).all()


def test_unequal_w_o_blocks_split_the_heads_on_the_held_out_seeds(one_torch_thread):
    for row in seeds.held_out_rows("ch07_almost_identical"):  # about 4 s each
        assert row["adam_w_o_doubled"] > 0.05 and row["sgd"] == 0, row["seed"]


def test_a_row_of_the_almost_identical_sweep_is_rederived():
    fresh = within_tolerance("ch07_almost_identical", seeds.rederive("ch07_almost_identical", 0))
    assert fresh["sgd"] == 0.0


def test_random_filters_split_on_some_seeds_and_identical_filters_never_do():
    column = lambda key: seeds.column("ch07_conv_filters", key)  # noqa: E731
    random_loss, identical_loss, active = column("random_loss"), column("identical_loss"), column("random_active")
    filters = column("random_filters")
    slopes = filters[:, :, 2] - filters[:, :, 0]
    assert len(random_loss) == 20
    # the asserts of the chapter's cell, on every seed
    assert (column("identical_gap") == 0).all() and identical_loss.min() > 0.45 and column("random_gap").min() > 0
    assert round(identical_loss.min(), 2) == 0.47  # "at 0.47 or above on these 20 seeds"
    assert (random_loss < identical_loss + 0.01).all()  # "on these 20 seeds ... never ended worse"
    # the counts of the solution's sentences
    found, one_way, nothing = random_loss < 0.2, (0.2 <= random_loss) & (random_loss < 0.6), random_loss >= 0.6
    opposite = found & (slopes[:, 0] * slopes[:, 1] < 0) & (active.min(axis=1) < 0.6)
    assert (found.sum(), opposite.sum(), one_way.sum(), nothing.sum()) == (9, 6, 5, 6)
    assert (active[found & ~opposite].max(axis=1) > 0.9).all()  # the other branch lets almost everything through
    assert (np.abs(random_loss[nothing] - (2 - 4 / np.pi)) < 0.02).all()  # "near 0.73, the average's loss"
    assert (nothing & (active.min(axis=1) < 0.05)).sum() >= 4  # "on most of these, a closed ReLU"
    shown = seeds.load("ch07_conv_filters")["rows"][3]  # the run shown: seed 3
    assert shown["seed"] == 3 and opposite[3] and abs(shown["random_loss"] - 0.09) < 0.01


def test_the_conv_filters_asserts_hold_on_the_held_out_seeds_and_a_random_start_can_lose(one_torch_thread):
    """Seeds 100 and 101 (about 10 s each): identical filters stay identical and above 0.45, random ones
    stay apart; on seed 101 the random start ends worse than the identical one, with filters less than
    0.1 apart ("that is not a rule": an earlier version asserted the opposite on every seed)."""
    rows = seeds.held_out_rows("ch07_conv_filters")
    for row in rows:
        assert row["identical_gap"] == 0 and row["identical_loss"] > 0.45 and row["random_gap"] > 0
    assert any(row["random_loss"] > row["identical_loss"] + 0.05 and row["random_gap"] < 0.1 for row in rows)


def test_a_row_of_the_conv_filters_sweep_is_rederived():
    fresh = within_tolerance("ch07_conv_filters", seeds.rederive("ch07_conv_filters", 3))
    assert fresh["identical_gap"] == 0.0


def test_every_perturbation_grows_and_the_smaller_one_needs_longer_on_every_seed():
    column = lambda key: seeds.column("ch07_perturbation", key)  # noqa: E731
    split = {tag: np.round(100 * column(f"split_{tag}")) for tag in ("1e-03", "1e-09")}
    grown = {tag: column(f"end_gap_{tag}") / column(f"start_gap_{tag}") for tag in split}
    errors = {tag: column(f"errors_{tag}") for tag in split}
    assert len(split["1e-09"]) == 12
    # the asserts of the chapter's cells, on every seed
    assert (column("start_gap_1e-09") < 1e-8).all() and (column("start_gap_1e-03") < 1e-2).all()
    assert grown["1e-03"].min() > 100 and grown["1e-09"].min() > 1e5  # "several hundredfold", "five orders"
    assert errors["1e-03"].max() < 0.05 and errors["1e-09"][:, 0].max() < 0.05
    assert (split["1e-09"] > split["1e-03"]).all()
    # the sentences of the solution
    assert (split["1e-03"].min(), split["1e-03"].max()) == (38, 95)
    within = split["1e-09"] <= 600
    assert within.sum() == 11 and (split["1e-09"][within].min(), split["1e-09"][within].max()) == (339, 596)
    solved = errors["1e-09"].max(axis=1) < 0.05
    assert solved.sum() == 10 and (errors["1e-09"][~solved, 1] > 0.9).all()  # "still near 1"


def test_the_perturbation_asserts_hold_on_the_held_out_seed(one_torch_thread):
    """Seed 100 (about 25 s): the training cell's asserts, and the later rise for the smaller eps."""
    for row in seeds.held_out_rows("ch07_perturbation"):
        for eps, tag in ((1e-9, "1e-09"), (1e-3, "1e-03")):
            start, end = row[f"start_gap_{tag}"], row[f"end_gap_{tag}"]
            assert start < 10 * eps and end > 100 * start and row[f"errors_{tag}"][0] < 0.05
        assert max(row["errors_1e-03"]) < 0.05 and row["split_1e-09"] > row["split_1e-03"]


def test_a_row_of_the_perturbation_sweep_is_rederived():
    fresh = within_tolerance("ch07_perturbation", seeds.rederive("ch07_perturbation", 0))  # the chapter's run
    assert max(fresh["errors_1e-09"]) < 0.05
