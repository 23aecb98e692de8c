"""The checks of chapter 15's exercises on what one rank computes (mha.checks.ch15_ranks): the references are what
they stand for (the exchange puts every head back, the ring and the ranks' partial outputs add up to one process's
attention); every wrong solution that a learner writes fails on its named case, on every seed, with the hint that
fits; every catalogued mistake fails with its own hint; the library's routes are refused. A from-scratch solution
of each passes on every seed, and in the student edition: tests/test_checks_ch15.py and test_checks_routes_ch15.py
(solutions_ch15.FROM_SCRATCH)."""

import re

import numpy as np
import pytest

from learners import SEEDS, assert_trap_fails_on_its_case, hint_of, student_edition
from solutions_ch15 import RANKS_15, all_cases, failures_on_every_seed, labelled, rank_partial_output, run

import mha.numpy as mnp
from mha.checks.ch15_ranks import partial as attention_here
from mha.checks.registry import CHECKS, expected_answer


# The references are what they stand for ---------------------------------------------------------------------------


def test_the_exchange_gives_each_rank_its_heads_at_every_position():
    for case in all_cases("ulysses_all_to_all"):
        if case.raises:
            continue
        (held,) = case.args
        whole = np.concatenate(held, axis=-2)  # (..., h, T, d): the positions put back in order
        np.testing.assert_array_equal(np.concatenate(expected_answer("ulysses_all_to_all", case), axis=-3), whole)


def test_the_ring_s_chunks_put_together_are_attention_over_the_whole_sequence():
    for case in all_cases("ring_attention_lists"):
        Q, K, V = (np.concatenate(c, axis=-2) for c in case.args)
        T = Q.shape[-2]
        mask = np.tril(np.ones((T, T), dtype=bool)) if case.kwargs.get("causal") else None
        whole, _ = attention_here(Q.astype(float), K.astype(float), V.astype(float), mask)
        got = np.concatenate(expected_answer("ring_attention_lists", case), axis=-2)
        np.testing.assert_allclose(got, whole, rtol=1e-4, atol=1e-5, err_msg=case.label)


def test_the_ranks_partial_outputs_add_up_to_multihead_attention():
    for case in all_cases("rank_partial_output"):
        if case.raises:
            continue
        X, W_q, W_k, W_v, W_o, h, _, P = case.args
        total = sum(mnp.rank_partial_output(X, W_q, W_k, W_v, W_o, h, r, P) for r in range(P))
        whole, _ = mnp.multihead_attention(X, W_q, W_k, W_v, W_o, h)
        np.testing.assert_allclose(total, whole, rtol=1e-4, atol=1e-5, err_msg=case.label)


@pytest.mark.parametrize("name,words", [("ulysses_all_to_all", "6 heads over 4 ranks"),
                                        ("rank_partial_output", "6 heads over 4 ranks")])
def test_the_reference_raises_where_the_case_requires_it_and_that_case_comes_last(name, words):
    case = labelled(name, words)
    assert case.raises is ValueError and CHECKS[name].named_cases(0)[-1].label == case.label
    with pytest.raises(ValueError, match="not divisible by world_size=4"):
        case.call(getattr(mnp, name))


# Wrong solutions a learner writes: their named case, their hint -------------------------------------------------------


def exchange_positions_reversed(held):
    P, g = len(held), held[0].shape[-3] // len(held)
    return [np.concatenate([a[..., s * g:(s + 1) * g, :, :] for a in held[::-1]], axis=-2) for s in range(P)]


def exchange_by_split_positions(held):
    P = len(held)
    pieces = [np.array_split(a, P, axis=-2) for a in held]
    return [np.concatenate([pieces[r][s] for r in range(P)], axis=-3) for s in range(P)]


def ring_without_merging(Q_chunks, K_chunks, V_chunks, *, causal=False):
    P = len(Q_chunks)
    return [mnp.attention_partial(Q_chunks[r], K_chunks[(r + 1) % P], V_chunks[(r + 1) % P])[0] for r in range(P)]


def ring_with_a_triangle_everywhere(Q_chunks, K_chunks, V_chunks, *, causal=False):
    P, n = len(Q_chunks), Q_chunks[0].shape[-2]
    tri = np.tril(np.ones((n, n), dtype=bool)) if causal else None
    outs = []
    for r in range(P):
        state = None
        for owner in range(r + 1 if causal else P):
            part = mnp.attention_partial(Q_chunks[r], K_chunks[owner], V_chunks[owner], tri)
            state = part if state is None else mnp.merge_partials(*state, *part)
        outs.append(state[0])
    return outs


def partial_of_all_heads(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    return mnp.multihead_attention(X, W_q, W_k, W_v, W_o, n_heads)[0]


def partial_averaged(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    return rank_partial_output(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size) / world_size


# (check, wrong solution, words of the hint it must get, the fixed named case it fails on)
TRAPPED = [
    ("ulysses_all_to_all", exchange_positions_reversed, "positions in rank order", "P = 2 ranks, h = 4"),
    ("ulysses_all_to_all", exchange_by_split_positions, "split the heads (axis -3)", "P = 2 ranks, h = 4"),
    ("ring_attention_lists", ring_without_merging, "the last step's out alone", "P = 4 ranks of 3"),
    ("ring_attention_lists", ring_with_a_triangle_everywhere, "only the rank's own chunk needs the lower triangle",
     "causal=True, P = 4"),
    ("rank_partial_output", partial_of_all_heads, "this rank's part only", "rank 3 of P = 4"),
    ("rank_partial_output", partial_averaged, "do not divide by the number of ranks", "rank 3 of P = 4"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    assert_trap_fails_on_its_case(name, fn, hint, case, failures_on_every_seed)


@pytest.mark.parametrize("name", RANKS_15)
def test_every_catalogued_mistake_fails_with_its_own_hint_on_every_seed(name):
    assert len(CHECKS[name].mistakes) >= 5
    hints = [m.hint for m in CHECKS[name].mistakes]
    assert all(len(h.split()) >= 5 for h in hints) and len(set(hints)) == len(hints)
    for m in CHECKS[name].mistakes:
        for message in failures_on_every_seed(name, m.fn, seeds=SEEDS[:3]):
            assert hint_of(message) == m.hint, (m.fn.__name__, message)


# The library's routes: refused in the notebook, switched off in the student edition -----------------------------------


def exchange_through_all_to_all(held):
    P, g = len(held), held[0].shape[-3] // len(held)
    if held[0].shape[-3] % P:
        raise ValueError("world_size must divide the heads")
    received = mnp.all_to_all([[a[..., s * g:(s + 1) * g, :, :] for s in range(P)] for a in held])
    return [np.concatenate(parts, axis=-2) for parts in received]


def ring_through_one_attention(Q_chunks, K_chunks, V_chunks, *, causal=False):
    Q, K, V = (np.concatenate(c, axis=-2) for c in (Q_chunks, K_chunks, V_chunks))  # every key at once
    T = Q.shape[-2]
    out, _ = mnp.scaled_dot_product_attention(Q, K, V, mnp.causal_mask(T) if causal else None)
    return np.split(out, len(Q_chunks), axis=-2)


def partial_through_tensor_parallel_attention(X, W_q, W_k, W_v, W_o, n_heads, rank, world_size):
    return mnp.tensor_parallel_attention(X, W_q, W_k, W_v, W_o, n_heads=n_heads, world_size=world_size)[1][rank]


ROUTES = [("ulysses_all_to_all", exchange_through_all_to_all), ("ring_attention_lists", ring_through_one_attention),
          ("rank_partial_output", partial_through_tensor_parallel_attention)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[name for name, _ in ROUTES])
def test_a_library_route_is_refused_in_the_notebook_and_switched_off_in_the_student_edition(name, route, monkeypatch):
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
        assert re.search(r"calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
            assert "this is the exercise" in message, message


def test_the_ring_may_call_attention_partial_and_merge_partials_and_the_partial_output_its_building_blocks():
    """What the texts permit is not forbidden: the book's solutions pass."""
    assert {"attention_partial", "merge_partials"}.isdisjoint(CHECKS["ring_attention_lists"].forbids)
    assert {"shard_by_heads", "multihead_attention"}.isdisjoint(CHECKS["rank_partial_output"].forbids)
    assert "ring_attention" in CHECKS["ring_attention_lists"].forbids
    assert run("rank_partial_output", rank_partial_output, 0).startswith("check_rank_partial_output: all 7 cases")


def ring_with_the_chunks_put_together(Q_chunks, K_chunks, V_chunks, *, causal=False):
    """Right, with what the text permits, but no ring: every chunk of keys and values put together, then one
    partial attention per rank."""
    P, n = len(Q_chunks), Q_chunks[0].shape[-2]
    K, V = np.concatenate(K_chunks, axis=-2), np.concatenate(V_chunks, axis=-2)  # (..., T, d_k), (..., T, d_v)
    outs = []
    for r in range(P):
        allowed = np.arange(P * n) <= np.arange(r * n, (r + 1) * n)[:, None] if causal else None  # (n, T)
        outs.append(mnp.attention_partial(Q_chunks[r], K, V, allowed)[0])
    return outs


def test_a_ring_that_puts_the_chunks_together_is_right_but_breaks_the_rule_of_the_text():
    """The rule is judged once every answer is right: its message says that the answers were."""
    for message in failures_on_every_seed("ring_attention_lists", ring_with_the_chunks_put_together, seeds=SEEDS[:2]):
        assert message.startswith("ring_attention_lists does not follow the route the exercise asks for: never put "
                                  "two chunks of keys or values together"), message
        assert "uses `concatenate` on line 5" in message, message
