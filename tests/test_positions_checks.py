"""The checks of chapter 10 (`check_sinusoidal_positions`, `check_alibi_bias`): solutions written
from scratch pass on several seeds, by the route the text asks for (slices, broadcasting: no loop), while the
same answers computed with loops break that route; every catalogued mistake, and a few more wrong answers that
learners write, is rejected, the catalogued ones with their own hint."""

import math

import numpy as np
import pytest

import mha.checks as checks
from mha.checks.registry import CHECKS

SEEDS = (0, 1, 2, 3, 4)


def sinusoidal_positions(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    """Entry by entry, as the formula reads."""
    table = np.zeros((T, d_model))
    for t in range(T):
        for i in range(d_model // 2):
            angle = (offset + t) / base ** (2 * i / d_model)
            table[t, 2 * i], table[t, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table.astype(dtype)


def sinusoidal_positions_vectorised(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    """With slices: the even columns get the sines, the odd ones the cosines."""
    angles = np.arange(offset, offset + T)[:, None] / base ** (np.arange(0, d_model, 2) / d_model)
    table = np.empty((T, d_model), dtype=dtype)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table


def alibi_bias(T_q, T_k, slopes):
    """Loops over heads, queries and keys, in the slopes' float dtype."""
    bias = np.zeros((len(slopes), T_q, T_k), dtype=(np.asarray(slopes) * 1.0).dtype)
    for h, m in enumerate(slopes):
        for i in range(T_q):
            for j in range(T_k):
                bias[h, i, j] = -m * abs(T_k - T_q + i - j)
    return bias


def alibi_bias_broadcast(T_q, T_k, slopes):
    """Positions of the queries and keys, broadcast against each other."""
    queries = np.arange(T_k - T_q, T_k).reshape(-1, 1)
    slopes = np.asarray(slopes) * 1.0  # floats, float32 kept
    return -np.reshape(slopes, (-1, 1, 1)) * np.abs(queries - np.arange(T_k)).astype(slopes.dtype)


@pytest.mark.parametrize("seed", SEEDS)
def test_right_sinusoidal_tables_pass(seed, capsys):
    checks.check_sinusoidal_positions(sinusoidal_positions_vectorised, seed=seed)
    assert capsys.readouterr().out.strip() == "check_sinusoidal_positions: all 5 cases passed."


@pytest.mark.parametrize("seed", SEEDS)
def test_right_alibi_biases_pass(seed, capsys):
    checks.check_alibi_bias(alibi_bias_broadcast, seed=seed)
    assert capsys.readouterr().out.strip() == "check_alibi_bias: all 5 cases passed."


@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("name,fn", [("sinusoidal_positions", sinusoidal_positions), ("alibi_bias", alibi_bias)])
def test_right_answers_written_with_loops_break_the_route_the_text_asks_for(name, fn, seed):
    """The rule is judged once every answer is right: its message says that the values were right."""
    with pytest.raises(checks.CheckFailed) as failed:
        getattr(checks, f"check_{name}")(fn, seed=seed)
    assert str(failed.value).startswith(f"{name} does not follow the route the exercise asks for: "), failed.value
    assert "uses a loop (for or while) on line 4" in str(failed.value)


MISTAKES = [(name, m) for name in ("sinusoidal_positions", "alibi_bias") for m in CHECKS[name].mistakes]


@pytest.mark.parametrize("name,mistake", MISTAKES, ids=[m.fn.__name__ for _, m in MISTAKES])
@pytest.mark.parametrize("seed", (0, 1))
def test_every_catalogued_mistake_is_rejected_with_its_hint(name, mistake, seed):
    with pytest.raises(checks.CheckFailed) as failed:
        getattr(checks, f"check_{name}")(mistake.fn, seed=seed)
    assert mistake.hint in str(failed.value)


def sinusoidal_without_dtype(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    return sinusoidal_positions(T, d_model, base=base, offset=offset).astype(np.float16)  # too coarse


def sinusoidal_base_fixed(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    return sinusoidal_positions(T, d_model, offset=offset, dtype=dtype)  # ignores base


def sinusoidal_positions_from_1(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    return sinusoidal_positions(T, d_model, base=base, offset=offset + 1, dtype=dtype)


def alibi_square_only(T_q, T_k, slopes):
    return alibi_bias(T_k, T_k, slopes)[:, :T_q]  # the FIRST T_q rows, not the last


def alibi_cache_off_by_one(T_q, T_k, slopes):
    queries = np.arange(T_k - T_q + 1, T_k + 1).reshape(-1, 1)  # one position too late
    return -np.reshape(slopes, (-1, 1, 1)) * np.abs(queries - np.arange(T_k))


def alibi_squared(T_q, T_k, slopes):
    return -np.abs(alibi_bias(T_q, T_k, slopes)) ** 2 / np.reshape(slopes, (-1, 1, 1))


@pytest.mark.parametrize("name,fn", [
    ("sinusoidal_positions", sinusoidal_without_dtype), ("sinusoidal_positions", sinusoidal_base_fixed),
    ("sinusoidal_positions", sinusoidal_positions_from_1), ("alibi_bias", alibi_square_only),
    ("alibi_bias", alibi_cache_off_by_one), ("alibi_bias", alibi_squared)])
@pytest.mark.parametrize("seed", (0, 1))
def test_other_wrong_answers_are_rejected(name, fn, seed):
    with pytest.raises(checks.CheckFailed, match=f"{name} gives a wrong answer"):
        getattr(checks, f"check_{name}")(fn, seed=seed)
