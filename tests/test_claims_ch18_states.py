"""Chapter 18's sentences about states written by hand, on draws the chapter did not print.

The chapter stores n random pairs in a 16 x 16 state three ways (the least-squares state, linear attention's sum,
the delta rule) over draws 180-184, and its Experiment "Forgetting, by overwriting and by the gate" writes 200
pairs with four rules over draws 1800-1804. Its sentences are asserted here on ten other draws of each, with the
same code path (the library's step and update), so that they hold beyond the draws shown.
"""

import numpy as np
import pytest

import mha.numpy as mnp

D = 16
COUNTS = (4, 8, 16, 32, 64)
HELD_OUT = range(280, 290)


def recall_errors(seed):
    """Relative recall errors ||K S - V|| / ||V|| of the best state, the sum and the delta rule, per pair count."""
    rng = np.random.default_rng(seed)
    errors = {"best": [], "linear": [], "delta": []}
    for n in COUNTS:
        K = mnp.l2_normalize(rng.normal(size=(n, D)))  # (n, d_k): keys of length 1
        V = rng.normal(size=(n, D))  # (n, d_v)
        delta = np.zeros((D, D))
        for key, value in zip(K, V):
            delta = mnp.gated_delta_update(delta, key, value, None, 1.0)
        for name, S in (("best", np.linalg.pinv(K) @ V), ("linear", K.T @ V), ("delta", delta)):
            errors[name].append(np.linalg.norm(K @ S - V) / np.linalg.norm(V))
    return {name: np.array(values) for name, values in errors.items()}


@pytest.mark.parametrize("seed", HELD_OUT)
def test_the_bound_the_sum_and_the_delta_rule_as_the_chapter_says(seed):
    errors = recall_errors(seed)
    small = np.array(COUNTS) <= D
    assert errors["best"][small].max() < 1e-10  # up to d_k pairs: recalled exactly
    bound = np.sqrt(1 - D / np.array(COUNTS)[~small])
    assert np.all(np.abs(errors["best"][~small] - bound) < 0.06), (errors["best"], bound)  # "about sqrt(1 - d_k/n)"
    assert errors["linear"][0] > 0.2  # the sum already errs at 4 pairs
    assert np.all(errors["delta"] < errors["linear"])  # the delta rule errs less, at every n
    assert np.all(errors["delta"] > errors["best"] - 1e-12)  # and no rule beats the least-squares state
    assert 0.7 < errors["linear"][2] < 1.3  # by n = d_k the sum's error is about the values' size


AGES = ((0, 1), (1, 4), (4, 16), (16, 64), (64, 200))


def forgetting(seed):
    """Mean relative errors per age group after 200 writes, for the four rules of the Experiment."""
    rng = np.random.default_rng(seed)
    keys = mnp.l2_normalize(rng.normal(size=(200, D)))  # (200, d_k)
    values = rng.normal(size=(200, D)) / 4  # (200, d_v)
    age = 199 - np.arange(200)
    result = {}
    for rule in ("linear", "delta"):
        for alpha in (1.0, 0.8):
            S = np.zeros((D, D))
            for key, value in zip(keys, values):
                if rule == "delta":
                    S = mnp.gated_delta_update(S, key, value, np.log(alpha), 1.0)
                else:
                    _, S = mnp.linear_attention_step(alpha * S, key, key, value)
            miss = np.linalg.norm(keys @ S - values, axis=1) / np.linalg.norm(values, axis=1)
            result[rule, alpha] = np.array([miss[(age >= lo) & (age < hi)].mean() for lo, hi in AGES])
    return result


@pytest.mark.parametrize("seed", [1900 + i for i in range(10)])
def test_forgetting_by_overwriting_and_by_the_gate_as_the_solution_says(seed):
    errors = forgetting(seed)
    # the newest pair: exact for a key of length 1; l2_normalize's eps (1e-6 inside the root) leaves k.k = 1 - 1e-6
    assert errors["delta", 1.0][0] < 1e-5 and errors["delta", 0.8][0] < 1e-5  # "prints as 0.00 on every draw"
    assert errors["linear", 1.0][0] > 1.5  # linear attention without a gate: more than the value's size
    assert errors["linear", 0.8][0] < 0.6  # with the gate, the newest pair's error a fraction of it
    for rule in ("linear", "delta"):
        assert np.all((errors[rule, 0.8][-2:] > 1.0) & (errors[rule, 0.8][-2:] < 1.2))  # a little above 1
    assert np.all((errors["delta", 1.0][-2:] > 1.25) & (errors["delta", 1.0][-2:] < 1.6))  # near 1.4
