"""Chapter 12's sharing experiment as library code: the grouped model, what its keys and values
cost, the seeded training, and the row that the sweep "ch12_sharing" stores per seed. What the
trained models show over the 45 seeds is asserted in tests/test_claims_ch12.py, on the stored table."""

import torch

from mha.experiments import seeds
from mha.experiments.heads import TwoRelationTask
from mha.experiments.sharing import KV_HEADS, LOSS_WINDOW, GroupedReadout, train_shared

TASK = TwoRelationTask(T=8, n_symbols=8, d_value=4)


def test_the_cache_and_the_projections_shrink_with_the_key_value_heads():
    runs = [train_shared(TASK, n_heads=4, n_kv_heads=h_kv, d_head=5, steps=1) for h_kv in (4, 2, 1)]
    assert [run.cache_width for run in runs] == [40, 20, 10]
    assert [run.kv_parameters for run in runs] == [2 * h_kv * 5 * TASK.d_in for h_kv in (4, 2, 1)]


def test_a_grouped_readout_gives_both_targets_for_every_token():
    X, Y, _ = TASK.batch(3, torch.Generator().manual_seed(0))
    model = GroupedReadout(TASK.d_in, 4, 2, TASK.d_out, d_head=5)
    assert model(X).shape == Y.shape == (3, TASK.T, 2 * TASK.d_value)
    assert model.attention.W_k.weight.shape == (2 * 5, TASK.d_in)  # two key/value heads of width 5


def test_training_is_seeded():
    first, again, other = (train_shared(TASK, 4, 2, 5, steps=5, seed=seed) for seed in (3, 3, 4))
    assert first.losses == again.losses and first.errors == again.errors
    assert first.losses != other.losses


def test_the_stored_sweep_holds_every_value_the_chapter_reads():
    table = seeds.load("ch12_sharing")
    per_model = {"previous_error": None, "partner_error": None, "losses": 400 // LOSS_WINDOW,
                 "previous_attention": 4, "partner_attention": 4}  # None: one number
    expected = {"seed"} | {f"{name}_{h_kv}" for name in per_model for h_kv in KV_HEADS}
    for row in table["rows"]:
        assert set(row) == expected
        for name, length in per_model.items():
            for h_kv in KV_HEADS:
                value = row[f"{name}_{h_kv}"]
                assert isinstance(value, float) if length is None else len(value) == length
