"""Chapter 12's claim about sharing keys and values, on chapter 7's two-relation task: with four
query heads, two key/value heads cost nothing and one costs the partner's value, on average
over three random starts (as the chapter trains them)."""

import numpy as np
import pytest
import torch

from mha.experiments.heads import TwoRelationTask
from mha.experiments.sharing import train_shared


@pytest.fixture(scope="module")
def mean_errors():
    torch.set_num_threads(1)
    task = TwoRelationTask(T=8, n_symbols=8, d_value=4)
    return {h_kv: np.mean([train_shared(task, n_heads=4, n_kv_heads=h_kv, d_head=5, seed=seed).errors
                           for seed in (0, 1, 2)], axis=0)
            for h_kv in (4, 2, 1)}


def test_two_key_value_heads_cost_nothing_and_one_costs_the_partner(mean_errors):
    partner = {h_kv: errors[1] for h_kv, errors in mean_errors.items()}
    assert max(errors[0] for errors in mean_errors.values()) < 0.05
    assert partner[4] < 0.13 and partner[2] < 0.13
    assert partner[1] > 0.17 and partner[1] > 1.5 * max(partner[4], partner[2])


def test_the_cache_and_the_projections_shrink_with_the_key_value_heads():
    task = TwoRelationTask(T=8, n_symbols=8, d_value=4)
    runs = [train_shared(task, n_heads=4, n_kv_heads=h_kv, d_head=5, steps=1) for h_kv in (4, 2, 1)]
    assert [run.cache_width for run in runs] == [40, 20, 10]
    assert [run.kv_parameters for run in runs] == [2 * h_kv * 5 * task.d_in for h_kv in (4, 2, 1)]
