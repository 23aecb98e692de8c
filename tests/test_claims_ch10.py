"""Chapter 10's claims over seeds: every sentence about the trained models holds on every stored seed.

The chapter reads two stored sweeps of mha.experiments.positions (tools/data/seed_sweeps.py made them
under generic kernels): `ch10_extrapolation`, the five models trained at length 16 (and the RoPE
one read with dynamic NTK) tested at 8 to 128, and `ch10_mixed_lengths`, the exercise's models trained on lengths 8 to 16. Each test
below names the sentence it holds up. One row of each sweep is trained again here and must agree
with the stored one within the sweep's tolerance, and each sweep's held-out seed (trained here, never
stored) must keep every sentence that speaks of every seed. The cheap random draws (the test sets, the
shuffles, the exercise's random layer) are drawn afresh here, 20 times each.
"""

import numpy as np
import pytest
import torch

import mha.numpy as mnp
from mha.experiments import seeds
from mha.experiments.positions import (MIXED_KINDS, MIXED_LENGTHS, POSITIONS, TEST_LENGTHS, LastAssignmentTask,
                                       held_out, lengths_for)

TASK = LastAssignmentTask()
SWEEP = "ch10_extrapolation"
MIXED = "ch10_mixed_lengths"


def accuracies(name, kind, lengths):
    """{length: accuracy on every stored seed (n_seeds,)} for one kind of model."""
    table = seeds.column(name, kind)  # (n_seeds, the lengths this kind was tested at)
    return dict(zip(lengths_for(kind, lengths), table.T))


@pytest.fixture(scope="module")
def ceiling():
    """The best accuracy without order, on the chapter's test set at each length."""
    return {n: TASK.order_blind_accuracy(held_out(TASK, n)[0]) for n in TEST_LENGTHS}


@pytest.fixture(scope="module")
def acc():
    """{kind: {length: accuracy on every stored seed}} for the models trained at length 16 (and RoPE stretched)."""
    return {kind: accuracies(SWEEP, kind, TEST_LENGTHS) for kind in POSITIONS}


def test_one_row_of_the_extrapolation_sweep_is_rederived_within_the_tolerance(one_torch_thread):
    stored, fresh, gap = seeds.rederive("ch10_extrapolation", 0)  # every seed costs the same: seed 0
    assert gap <= seeds.load(SWEEP)["tolerance"], f"seed 0 re-derived {gap:.3f} away: {stored} vs {fresh}"


def test_one_row_of_the_mixed_lengths_sweep_is_rederived_within_the_tolerance(one_torch_thread):
    stored, fresh, gap = seeds.rederive("ch10_mixed_lengths", 0)
    assert gap <= seeds.load(MIXED)["tolerance"], f"seed 0 re-derived {gap:.3f} away: {stored} vs {fresh}"


def test_enough_seeds_are_stored():
    assert len(seeds.load(SWEEP)["rows"]) >= 10 and len(seeds.load(MIXED)["rows"]) >= 10


def test_every_row_holds_every_kind():
    for row in seeds.load(SWEEP)["rows"]:
        for kind in POSITIONS:
            assert len(row[kind]) == len(lengths_for(kind, TEST_LENGTHS)), (row["seed"], kind)
            assert f"last_weight_{kind}" in row and f"other_weight_{kind}" in row, (row["seed"], kind)
        assert "far_weight_rope" in row and "far_weight_rope_dynamic" in row, row["seed"]


def test_the_ceiling_of_a_set_is_about_0_42_at_length_16_on_any_test_set(ceiling):
    """"about 0.42 at length 16": on the chapter's test set and on 20 other draws of 1000 sequences."""
    assert round(ceiling[16], 2) == 0.42
    for seed in range(20):
        tokens, _ = TASK.batch(1000, 16, torch.Generator().manual_seed(seed))
        assert abs(TASK.order_blind_accuracy(tokens) - 0.42) < 0.02


def test_without_positions_every_seed_sits_on_the_ceiling_at_every_length(acc, ceiling):
    """"The models reach the ceiling and stop there"; "stays on the ceiling of a set at every length"."""
    for n in TEST_LENGTHS:
        assert np.abs(acc["none"][n] - ceiling[n]).max() < 0.05, n


def test_without_positions_shuffling_the_assignments_changes_no_logit():
    """"the answers change, the logits do not", on every seed; the answers change under any shuffle."""
    assert seeds.column(SWEEP, "none_shuffle_gap").max() < 1e-5
    tokens, answers = held_out(TASK, 16)
    for seed in range(20):
        order = torch.randperm(15, generator=torch.Generator().manual_seed(seed))
        shuffled = torch.cat([tokens[:, :-1][:, order], tokens[:, -1:]], dim=-1)
        assert 0.3 < (TASK.answer(shuffled) != answers).float().mean().item() < 0.9


def test_at_the_training_length_the_tables_learn_the_task_and_alibi_a_little_less(acc, ceiling):
    """"learned positions lift the models far above the ceiling"; "fixed sinusoids do as well as a
    learned table"; "ALiBi learns the task too, a little less well than the two tables"."""
    learned, sinusoidal, alibi = acc["learned"][16], acc["sinusoidal"][16], acc["alibi"][16]
    assert learned.min() > 0.85 and sinusoidal.min() > 0.85 and alibi.min() > 0.8  # the chapter's asserts
    assert np.abs(sinusoidal - learned).max() < 0.05
    assert (alibi < np.minimum(learned, sinusoidal)).all()


def test_the_tables_fail_at_length_8_inside_the_training_length(acc):
    """"Learned positions ... also fail at length 8"; the sinusoids "fail at length 8 like the learned table"."""
    for kind in ("learned", "sinusoidal"):
        assert (acc[kind][8] < acc[kind][16] - 0.1).all(), kind
        assert acc[kind][8].max() < 0.85, kind


def test_the_sinusoids_break_down_past_the_training_length(acc, ceiling):
    """"at length 32 it is back near the ceiling of a set, and at 64 every seed is below that
    ceiling. At 64 and 128 the median seed is worse than a model without positions"."""
    sinusoidal, none = acc["sinusoidal"], acc["none"]
    assert sinusoidal[32].max() < 0.5 and abs(np.median(sinusoidal[32]) - ceiling[32]) < 0.05
    assert sinusoidal[64].max() < ceiling[64]  # also the chapter's assert
    for n in (64, 128):
        assert np.median(sinusoidal[n]) < np.median(none[n]), n
    assert sinusoidal[128].max() - sinusoidal[128].min() > 0.1  # "the seeds scatter widely"


def test_alibi_keeps_its_accuracy_at_8_times_the_training_length(acc):
    alibi = acc["alibi"]
    assert min(a.min() for a in alibi.values()) > 0.8  # the chapter's assert
    assert (alibi[128] > alibi[16] - 0.05).all()
    assert np.abs(alibi[64] - alibi[8]).max() < 0.06  # "at 64 within about 0.05 of its accuracy at 8" (exercise)


def test_rope_learns_the_task_as_well_as_the_tables_and_better_than_alibi(acc):
    """"RoPE learns the task as well as the two tables, seed by seed (never more than 0.01 below the
    better one), and better than ALiBi on every seed"; "it works at length 8 as well as at 16"."""
    rope = acc["rope"]
    tables = np.maximum(acc["learned"][16], acc["sinusoidal"][16])  # the better table, per seed
    assert rope[16].min() > 0.9  # the chapter's assert
    assert (rope[16] > tables - 0.01).all() and (rope[16] > acc["alibi"][16]).all()
    assert (rope[8] > rope[16] - 0.01).all() and rope[8].min() > 0.9


def test_rope_past_the_training_length_falls_but_stays_above_the_sinusoids(acc, ceiling):
    """"Past 16 it is lower at every doubling of the length, on every seed, yet it stays above the ceiling
    of a set and above the sinusoids. At 64 and 128 it is below ALiBi on every seed"."""
    rope, longer = acc["rope"], TEST_LENGTHS[1:]
    for shorter, n in zip(longer, longer[1:]):
        assert (rope[n] < rope[shorter]).all(), n
    for n in TEST_LENGTHS[2:]:
        assert (rope[n] > ceiling[n]).all() and (rope[n] > acc["sinusoidal"][n]).all(), n
    for n in (64, 128):
        assert (rope[n] < acc["alibi"][n]).all(), n


def test_dynamic_ntk_changes_nothing_up_to_16_and_recovers_part_of_the_loss_beyond(acc):
    """"the same up to 16. Beyond, it is better than plain RoPE at 64 and 128 by at least 0.15 on every
    seed ... At 32 it raises the median, though not on every seed ... at 128 it is below ALiBi on every seed"."""
    rope, stretched = acc["rope"], acc["rope_dynamic"]
    for n in (8, 16):
        assert np.array_equal(stretched[n], rope[n]), n
    for n in (64, 128):
        assert (stretched[n] > rope[n] + 0.15).all(), n
    assert np.median(stretched[32]) > np.median(rope[32])
    assert (stretched[32] < rope[32]).any()  # "though not on every seed": the sentence must stay true
    assert (stretched[128] < acc["alibi"][128]).all()
    for key in ("last_weight", "other_weight"):  # the figure's sequence at 16: the same weights
        assert np.array_equal(seeds.column(SWEEP, f"{key}_rope_dynamic"), seeds.column(SWEEP, f"{key}_rope"))


def test_at_128_plain_rope_looks_mostly_at_unseen_distances_and_dynamic_ntk_less_than_half():
    """"well over half of its weight to keys farther back than any distance of training, on every seed (0.79
    to 0.86 over these 10 seeds, where an even spread would give 0.88)"; with dynamic NTK that weight "falls by at least
    0.2 on every seed, to about one half (0.39 to 0.49 over these 10 seeds)"."""
    plain, stretched = seeds.column(SWEEP, "far_weight_rope"), seeds.column(SWEEP, "far_weight_rope_dynamic")
    assert plain.min() > 0.6 and round(112 / 128, 2) == 0.88  # an even spread over 128 keys gives 112 / 128
    assert (round(plain.min(), 2), round(plain.max(), 2)) == (0.79, 0.86)
    assert (stretched < plain - 0.2).all() and (round(stretched.min(), 2), round(stretched.max(), 2)) == (0.39, 0.49)


def test_with_positions_the_last_assignment_gets_the_most_weight_on_every_seed():
    """The figure's sequence: averaged over the heads, the last assignment gets more than any other token."""
    for kind in ("learned", "sinusoidal", "alibi", "rope"):
        last, other = seeds.column(SWEEP, f"last_weight_{kind}"), seeds.column(SWEEP, f"other_weight_{kind}")
        assert (last > other).all(), kind


def test_alibi_s_steepest_head_gives_the_last_assignment_most_of_its_weight():
    """"the steepest one, with slope 1/4, gives the last assignment more than half its weight on
    every seed; each flatter head gives it less"."""
    heads = seeds.column(SWEEP, "alibi_heads_on_last")  # (n_seeds, 4), slopes 1/4 to 1/256
    assert heads.shape[1] == 4 and (heads[:, 0] > 0.5).all()
    assert (heads[:, 1:] < heads[:, :1]).all()


def test_the_mixed_lengths_exercise_holds_on_every_seed(ceiling):
    """The exercise's asserts, and its solution: the mix cures length 8, not lengths past 16."""
    mixed = {kind: accuracies(MIXED, kind, MIXED_LENGTHS) for kind in MIXED_KINDS}  # learned, sinusoidal, alibi
    assert mixed["learned"][8].min() > 0.85 and mixed["sinusoidal"][8].min() > 0.85  # the exercise's asserts
    assert mixed["sinusoidal"][64].max() < 0.3 and mixed["alibi"][64].min() > 0.8
    for kind in ("learned", "sinusoidal"):  # "about as well at 8 and 12 as at 16"
        for n in (8, 12):
            assert np.abs(mixed[kind][n] - mixed[kind][16]).max() < 0.05, (kind, n)
    sinusoidal = mixed["sinusoidal"]  # "back near the ceiling of a set at 32, far below it at 64"
    assert sinusoidal[32].max() < 0.5 and sinusoidal[64].max() < ceiling[64] - 0.05
    alibi = mixed["alibi"]  # "at 64 within about 0.05 of its accuracy at 8"
    assert np.abs(alibi[64] - alibi[8]).max() < 0.06


def exercise_draw(seed):
    """The swap exercise's six tokens and random layer, drawn as the chapter draws them."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(6, 8))
    layer = {name: rng.normal(size=(8, 8)) / np.sqrt(8) for name in ("W_q", "W_k", "W_v", "W_o")}
    return X, layer


def test_the_swap_exercise_holds_for_any_random_layer():
    """No positions: rows only move. Sinusoids: every row changes. ALiBi: every row changes, and the
    largest change is less than half the largest with the sinusoids, on 20 random draws."""
    swap, codes = [0, 4, 2, 3, 1, 5], mnp.sinusoidal_positions(6, 8)
    alibi = mnp.alibi_bias(6, 6, mnp.alibi_slopes(2))
    for seed in range(20):
        X, layer = exercise_draw(seed)
        change, settings = {}, {"none": (X, X[swap], None), "sinusoidal": (X + codes, X[swap] + codes, None),
                                "alibi": (X, X[swap], alibi)}
        for name, (before, after, bias) in settings.items():
            first, _ = mnp.multihead_attention(before, n_heads=2, bias=bias, **layer)
            second, _ = mnp.multihead_attention(after, n_heads=2, bias=bias, **layer)
            change[name] = np.abs(second - first[swap]).max(axis=-1)  # (6,)
        assert change["none"].max() < 1e-12
        assert change["sinusoidal"].min() > 1e-2 and change["alibi"].min() > 1e-4
        assert change["alibi"].max() * 2 < change["sinusoidal"].max()


def test_the_every_seed_sentences_hold_on_the_held_out_seeds(one_torch_thread, ceiling):
    """Seed 100 of each sweep (trained here, about 20 s each): every sentence that says "on every seed".
    (On seed 100 dynamic NTK leaves 0.51 of the weight on unseen distances: "other seeds land a little
    above one half", where an earlier version said "below one half".)"""
    for row in seeds.held_out_rows(SWEEP):
        acc = {kind: dict(zip(lengths_for(kind, TEST_LENGTHS), row[kind])) for kind in POSITIONS}
        rope, stretched, alibi, sinusoidal = acc["rope"], acc["rope_dynamic"], acc["alibi"], acc["sinusoidal"]
        assert all(abs(acc["none"][n] - ceiling[n]) < 0.05 for n in TEST_LENGTHS)
        assert acc["learned"][16] > 0.85 and sinusoidal[16] > 0.85 and alibi[16] > 0.8  # the chapter's asserts
        assert alibi[16] < min(acc["learned"][16], sinusoidal[16]) and min(alibi.values()) > 0.8
        for kind in ("learned", "sinusoidal"):
            assert acc[kind][8] < acc[kind][16] - 0.1 and acc[kind][8] < 0.85, kind
        assert sinusoidal[32] < 0.5 and sinusoidal[64] < ceiling[64] and alibi[128] > alibi[16] - 0.05
        assert rope[16] > 0.9 and rope[16] > max(acc["learned"][16], sinusoidal[16]) - 0.01 and rope[16] > alibi[16]
        assert rope[8] > rope[16] - 0.01 and rope[8] > 0.9
        longer = TEST_LENGTHS[1:]
        assert all(rope[n] < rope[shorter] for shorter, n in zip(longer, longer[1:]))
        assert all(rope[n] > ceiling[n] and rope[n] > sinusoidal[n] for n in TEST_LENGTHS[2:])
        assert all(rope[n] < alibi[n] and stretched[n] > rope[n] + 0.15 for n in (64, 128))
        assert stretched[128] < alibi[128] and all(stretched[n] == rope[n] for n in (8, 16))
        plain, dynamic = row["far_weight_rope"], row["far_weight_rope_dynamic"]
        assert plain > 0.6 and dynamic < plain - 0.2
        for kind in ("learned", "sinusoidal", "alibi", "rope"):
            assert row[f"last_weight_{kind}"] > row[f"other_weight_{kind}"], kind
        steepest, *flatter = row["alibi_heads_on_last"]
        assert steepest > 0.5 and max(flatter) < steepest
    for row in seeds.held_out_rows(MIXED):
        mixed = {kind: dict(zip(lengths_for(kind, MIXED_LENGTHS), row[kind])) for kind in MIXED_KINDS}
        assert mixed["learned"][8] > 0.85 and mixed["sinusoidal"][8] > 0.85  # the exercise's asserts
        assert mixed["sinusoidal"][64] < 0.3 and mixed["alibi"][64] > 0.8
        assert all(abs(mixed[kind][n] - mixed[kind][16]) < 0.05 for kind in ("learned", "sinusoidal") for n in (8, 12))
        assert mixed["sinusoidal"][32] < 0.5 and mixed["sinusoidal"][64] < ceiling[64] - 0.05
        assert abs(mixed["alibi"][64] - mixed["alibi"][8]) < 0.06
