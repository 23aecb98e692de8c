"""The checks of chapter 18's exercises (mha.checks.ch18, ch18_chunk): linear_attention_step, gated_delta_update and
gated_delta_chunk. Their references give the recurrence's answers (solutions from scratch, C steps of the update,
transformers' torch_recurrent_gated_delta_rule) on every case they draw; the named traps are there on every seed;
every wrong solution that a learner writes fails on its named case, on every seed, with the hint that fits (or the
message that fits where no hint does); every catalogued mistake fails with its own hint; a loop over the chunk's tokens
is refused by the rule; the library's routes are refused, in the notebook and in the student edition; right solutions
from scratch pass there and in the grader; and the exercises' texts agree with the checks."""

from pathlib import Path

import numpy as np
import pytest

from learners import SEEDS, exercise_texts, hint_of, student_edition, torch_twin, unguarded
from solutions_ch18 import CHAPTER_18, FROM_SCRATCH, all_cases, failures_on_every_seed, labelled, run
from wrong_ch18 import LOOPS, MESSAGES, TRAPPED

import mha.numpy as mnp
import mha.checks
from mha.checks.registry import CHECKS, expected_answer

ROOT = Path(__file__).resolve().parents[1]
STEP, UPDATE, CHUNK = CHAPTER_18


def scratch(name):
    """The right solutions from scratch of check `name` (the first bears the exercise's name)."""
    return [f for f in FROM_SCRATCH if f.__name__.startswith(name)]


# The references give the recurrence's answers -----------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAPTER_18)
def test_the_reference_agrees_with_solutions_from_scratch_on_every_case(name):
    """Each from-scratch solution gives the reference's answer, in its dtype, on the named and random cases of ten
    seeds: within 1e-12 in float64 and 1e-5 in float32."""
    for case in all_cases(name):
        expected = expected_answer(name, case)
        for solution in scratch(name):
            got = case.call(solution)
            for e, g in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected, got))):
                assert e.dtype == g.dtype == case.args[0].dtype and e.shape == g.shape, (case.label, solution.__name__)
                tol = 1e-5 if e.dtype == np.float32 else 1e-12
                np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=f"{case.label} {solution.__name__}")


def test_the_chunk_reference_is_C_steps_of_the_update_reference_read_by_q():
    for case in all_cases(CHUNK, SEEDS[:4]):
        state, q, k, v, g, beta = case.args
        outs = []
        for t in range(k.shape[-2]):
            state = expected_answer(UPDATE, type(case)("", (state, k[..., t, :], v[..., t, :],
                                                            None if g is None else g[..., t], beta[..., t])))
            outs.append(np.einsum("...k,...kv->...v", q[..., t, :], state))
        out, new_state = expected_answer(CHUNK, case)
        tol = 1e-5 if out.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, np.stack(outs, axis=-2), rtol=tol, atol=tol, err_msg=case.label)
        np.testing.assert_allclose(new_state, state, rtol=tol, atol=tol, err_msg=case.label)


def test_the_step_reference_is_linear_attention_over_the_cached_tokens():
    """The state after the step is the earlier one plus k^T v; the output is q @ that (with an empty state, (q . k)
    v)."""
    for case in all_cases(STEP, SEEDS[:4]):
        state, q, k, v = case.args
        out, new_state = expected_answer(STEP, case)
        tol = 1e-5 if out.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(new_state - state, k[..., :, None] * v[..., None, :], rtol=tol, atol=tol)
        if not state.any():
            np.testing.assert_allclose(out, (q * k).sum(-1, keepdims=True) * v, rtol=tol, atol=tol)


def test_the_update_and_chunk_references_equal_transformers_recurrent_gated_delta_rule():
    """transformers' torch_recurrent_gated_delta_rule (qwen3_next, float32 inside; q divided by sqrt(d_k) inside, so
    given q * sqrt(d_k)) on the float64 cases with a decay: the chunk's outputs and final state, and one token's update
    (a chunk of one token), within 1e-5 of the largest value."""
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule
    compared = 0
    for case in all_cases(CHUNK, SEEDS[:3]):
        state, q, k, v, g, beta = case.args
        if g is None or state.dtype != np.float64 or state.ndim < 3 or g.min() < -30:
            continue  # transformers takes (B, T, H, d) and a decay; float32 inside cannot hold exp(-800)
        lead = state.shape[:-2]
        flat = [a.reshape(-1, *a.shape[len(lead):]) for a in (state, q * q.shape[-1] ** 0.5, k, v, g, beta)]
        S, Q, K, V, G, B = (torch.from_numpy(a) for a in flat)
        out, final = torch_recurrent_gated_delta_rule(Q[:, None].transpose(1, 2), K[:, None].transpose(1, 2),
                                                      V[:, None].transpose(1, 2), G[:, None].transpose(1, 2),
                                                      B[:, None].transpose(1, 2), initial_state=S[:, None],
                                                      output_final_state=True)
        expected_out, expected_state = expected_answer(CHUNK, case)
        theirs_out = out[:, :, 0].numpy().reshape(expected_out.shape)
        theirs_state = final[:, 0].numpy().reshape(expected_state.shape)
        for e, t in ((expected_out, theirs_out), (expected_state, theirs_state)):
            np.testing.assert_allclose(t, e, rtol=0, atol=1e-5 * np.abs(e).max(), err_msg=case.label)
        first = expected_answer(UPDATE, type(case)("", (state, k[..., 0, :], v[..., 0, :], g[..., 0], beta[..., 0])))
        one, = (torch_recurrent_gated_delta_rule(*(x[:, :1, None] for x in (Q, K, V)), G[:, :1, None], B[:, :1, None],
                                                 initial_state=S[:, None], output_final_state=True)[1:])
        np.testing.assert_allclose(one[:, 0].numpy().reshape(first.shape), first, rtol=0,
                                   atol=1e-5 * np.abs(first).max(), err_msg=case.label)
        compared += 1
    assert compared >= 6


# The traps are in the named cases -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_the_first_cases_hold_their_traps_on_every_seed(seed):
    state, q, k, v = CHECKS[STEP].named_cases(seed)[0].args
    assert state.shape[-2] == state.shape[-1] and state.ndim == 3 and state.shape[0] > 1 and np.abs(state).min() > 0
    assert (np.einsum("...k,...k->...", q, k) > 0).all()  # reading before the write differs
    state, k, v, g, beta = CHECKS[UPDATE].named_cases(seed)[0].args
    assert state.shape[-2] == state.shape[-1] == state.shape[0] == g.shape[-1] == beta.shape[-1]
    assert (-1.5 <= g).all() and (g <= -0.1).all() and (0.2 <= beta).all() and (beta <= 0.9).all()
    np.testing.assert_allclose(np.linalg.norm(k, axis=-1), 1.0)
    state, q, k, v, g, beta = CHECKS[CHUNK].named_cases(seed)[0].args
    C, (d_k, d_v) = k.shape[-2], state.shape[-2:]
    assert C >= 3 and d_k != d_v and np.abs(state).min() > 0 and state.ndim == 4
    assert (np.ptp(g, axis=-1) > 0.1).all() and (np.ptp(beta, axis=-1) > 0.1).all() and (g <= -0.1).all()
    # (I + A)^-1 differs from I - A by more than the tolerance: its A^2 term
    G = np.cumsum(g, axis=-1)
    ratio = np.exp(np.tril(G[..., :, None] - G[..., None, :]))
    A = np.tril(beta[..., :, None] * ratio * (k @ np.swapaxes(k, -1, -2)), -1)
    assert np.abs(np.linalg.inv(np.eye(C) + A) - (np.eye(C) - A)).max() > 1e-3


def test_the_other_named_cases_hold_their_traps():
    for name, words in ((STEP, "d_k = 4, d_v = 3"), (UPDATE, "d_k = 5, d_v = 3")):
        state = labelled(name, words).args[0]
        assert state.shape[-2:] == (int(words[6]), 3)
    state, k, v, g, beta = labelled(UPDATE, "g = 0 and beta = 1").args
    after = expected_answer(UPDATE, labelled(UPDATE, "g = 0 and beta = 1"))
    np.testing.assert_allclose(np.einsum("...k,...kv->...v", k, after), v, rtol=1e-12, atol=1e-12)
    assert labelled(UPDATE, "g = None").args[3] is None and labelled(CHUNK, "g = None").args[4] is None
    assert labelled(UPDATE, "no batch axis").args[3].shape == ()
    g = labelled(CHUNK, "strong decays: g in -100.5").args[4]
    assert g.dtype == np.float64 and (np.exp(np.cumsum(g, -1))[..., -1] == 0).all()
    assert (np.cumsum(g, -1)[..., 0] - np.cumsum(g, -1)[..., -1] < 709).all()  # no difference overflows here
    g = labelled(CHUNK, "float32, strong decays").args[4]
    G = np.cumsum(g, -1)
    with np.errstate(over="ignore", under="ignore"):
        assert g.dtype == np.float32 and np.isinf(np.exp(G[..., None, :] - G[..., :, None])).any()
        assert (np.exp(G)[..., -1] == 0).all()
    assert labelled(CHUNK, "C = 1").args[1].shape[-2] == 1


# Wrong solutions a learner writes: their named case, their hint or their message ---------------------------------


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{i}-{t[0]}" for i, t in enumerate(TRAPPED)])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    messages = failures_on_every_seed(name, fn)
    assert (hint in hint_of(messages[0])) if hint else not hint_of(messages[0]), messages[0]
    for message in messages:
        assert f"on the case '{case}" in message, message


@pytest.mark.parametrize("name,fn,words,case", MESSAGES, ids=[f"{i}-{t[0]}" for i, t in enumerate(MESSAGES)])
def test_a_wrong_solution_without_a_hint_fails_with_its_message(name, fn, words, case):
    for message in failures_on_every_seed(name, fn, seeds=SEEDS[:4]):
        assert words in message and f"on the case '{case}" in message and not hint_of(message), message


@pytest.mark.parametrize("fn", LOOPS, ids=[f.__name__ for f in LOOPS])
def test_a_loop_over_the_chunk_s_tokens_gives_right_answers_and_is_refused_by_the_rule(fn):
    for case in all_cases(CHUNK, SEEDS[:2]):
        expected = expected_answer(CHUNK, case)
        tol = 1e-5 if expected[0].dtype == np.float32 else 1e-12
        for e, g in zip(expected, case.call(fn)):
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=case.label)
    for message in failures_on_every_seed(CHUNK, fn, seeds=SEEDS[:3]):
        assert message.startswith("gated_delta_chunk does not follow the route the exercise asks for: handle the "
                                  "chunk's tokens all at once"), message
        assert "uses a loop (for or while)" in message or "uses `reduce`" in message, message


@pytest.mark.parametrize("name", CHAPTER_18)
def test_the_catalogue_is_large_and_every_mistake_fails_with_its_own_hint_on_every_seed(name):
    mistakes = CHECKS[name].mistakes
    assert len(mistakes) >= 8
    hints = [m.hint for m in mistakes]
    assert all(len(h.split()) >= 8 for h in hints) and len(set(hints)) == len(hints)
    for m in mistakes:
        for message in failures_on_every_seed(name, unguarded(m.fn)):
            assert hint_of(message) == m.hint, (m.fn.__name__, message)


# Routes: the library's functions --------------------------------------------------------------------------------------


def ones_like_gates(k):
    return np.ones(k.shape[:-1], dtype=k.dtype)


def one_token(result):
    """(out, state) of a sequence of one token: its output (..., d_v)."""
    out, state = result
    return out[..., 0, :], state


ROUTES = [
    (STEP, lambda state, q, k, v: mnp.linear_attention_step(state, q, k, v), "calls mha's own linear_attention_step"),
    (STEP, lambda state, q, k, v: mnp.gated_delta_step(state, q, k, v + np.einsum("...k,...kv->...v", k, state), None,
                                                       ones_like_gates(k)), "calls mha's own gated_delta_step"),
    (STEP, lambda state, q, k, v: one_token(mnp.linear_attention_recurrent(
        q[..., None, :], k[..., None, :], v[..., None, :], initial_state=state)),
     "calls mha's own linear_attention_recurrent"),
    (UPDATE, lambda state, k, v, g, beta: mnp.gated_delta_update(state, k, v, g, beta),
     "calls mha's own gated_delta_update"),
    (UPDATE, lambda state, k, v, g, beta: mnp.gated_delta_step(state, k, k, v, g, beta)[1],
     "calls mha's own gated_delta_step"),
    (CHUNK, lambda state, q, k, v, g, beta: mnp.gated_delta_chunk(state, q, k, v, g, beta),
     "calls mha's own gated_delta_chunk"),
    (CHUNK, lambda state, q, k, v, g, beta: mnp.gated_delta_rule_recurrent(q, k, v, g, beta, scale=1.0,
                                                                           initial_state=state),
     "calls mha's own gated_delta_rule_recurrent"),
    (CHUNK, lambda state, q, k, v, g, beta: mnp.gated_delta_rule_chunked(q, k, v, g, beta, scale=1.0,
                                                                         initial_state=state),
     "calls mha's own gated_delta_rule_chunked"),
]


@pytest.mark.parametrize("name,route,words", ROUTES, ids=[f"{i}-{r[0]}" for i, r in enumerate(ROUTES)])
def test_the_library_s_routes_are_refused(name, route, words):
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
        assert words in message, message


@pytest.mark.parametrize("name", CHAPTER_18)
def test_the_torch_twin_is_refused(name):
    for message in failures_on_every_seed(name, torch_twin(name), seeds=SEEDS[:1]):
        assert f"calls mha's own {name}" in message, message


def test_transformers_gated_delta_rule_is_refused_by_the_rule():
    def recurrent_rule(state, q, k, v, g, beta):
        import torch
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule
        out, final = torch_recurrent_gated_delta_rule(*(torch.from_numpy(a) for a in (q, k, v, g, beta)),
                                                      initial_state=torch.from_numpy(state), output_final_state=True)
        return out.numpy(), final.numpy()
    message = failures_on_every_seed(CHUNK, recurrent_rule, seeds=SEEDS[:1])[0]
    assert "gated_delta_chunk" in message and ("transformers" in message or "raised" in message), message


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_solution_from_scratch_passes_on_every_seed_and_in_the_student_edition(fn, monkeypatch):
    name = next(n for n in CHAPTER_18 if fn.__name__.startswith(n))
    count = len(CHECKS[name].named_cases(0))
    for seed in SEEDS[:3]:
        assert run(name, fn, seed) == f"check_{name}: all {count} cases passed."
    with student_edition(name, monkeypatch):
        for seed in SEEDS[3:5]:
            assert run(name, fn, seed).startswith(f"check_{name}: all "), seed


def test_the_grader_passes_solutions_from_scratch_and_refuses_a_loop_and_the_library():
    """tools/grading in its worker (the student edition, no torch; bubblewrap where it works)."""
    import inspect
    import textwrap

    import nbformat

    from tools.grading import notebook, sandbox
    from wrong_ch18 import chunk_token_by_token

    def cell(*functions, named=None):
        sources = [textwrap.dedent(inspect.getsource(f)) for f in functions]
        renamed = f"\n\n{named} = {functions[-1].__name__}\n" if named else ""
        return "import numpy as np\nimport mha.numpy as mnp\n\n" + "\n\n".join(sources) + renamed

    def grade(cells, names, seed):
        book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        checks = [{"check": f"check_{n}", "function": n} for n in names]
        return notebook.run_checks(book, checks, {f"check_{n}": seed for n in names}, sandbox.Limits(), [ROOT])

    right = [f for f in FROM_SCRATCH if f.__name__ in CHAPTER_18]
    outcomes = grade([cell(f) for f in right], CHAPTER_18, 5)
    assert all(status == "passed" for status, _ in outcomes.values()), outcomes
    (status, message), = grade([cell(right[1], chunk_token_by_token, named=CHUNK)], [CHUNK], 5).values()
    assert status == "failed" and "handle the chunk's tokens all at once" in message, message
    (status, message), = grade([cell(update_library, named=UPDATE)], [UPDATE], 5).values()
    assert status == "failed" and "switched off while this exercise is graded" in message, message


def update_library(state, k, v, g, beta):
    return mnp.gated_delta_step(state, k, k, v, g, beta)[1]


def test_the_checks_settings():
    for name in CHAPTER_18:
        check = CHECKS[name]
        assert check.float32_promised and check.packages == () and not check.fresh and len(check.rules) >= 1
        module = "mha.checks.ch18_chunk" if name == CHUNK else "mha.checks.ch18"
        assert check.make_cases.__module__ == module and check.may_use == "NumPy, nothing from mha"
        assert getattr(mha.checks, f"check_{name}").__name__ == f"check_{name}"
        assert {"linear_attention_recurrent", "gated_delta_step", "gated_delta_rule_chunked"} <= set(check.absent())
    assert CHECKS[STEP].returns == CHECKS[CHUNK].returns == ("out", "new_state") and CHECKS[UPDATE].returns is None
    from mha.checks import ch18
    assert ch18.check_gated_delta_chunk is mha.checks.check_gated_delta_chunk


# The exercises' texts -------------------------------------------------------------------------------------------------


TEXTS = exercise_texts(18)
WORDS = {  # what each text must say: its inputs, its rules, the cases it names
    STEP: ("`state`", "outer product", "`(out, new_state)`", "nothing from `mha`"),
    UPDATE: ("`g`", "`beta`", "`None`", "log of the decay", "nothing from `mha`"),
    CHUNK: ("`np.linalg.solve`", "without a loop over the tokens", "`None`", "nothing from `mha`", "float32"),
}


@pytest.mark.parametrize("name", CHAPTER_18)
def test_the_exercise_s_text_agrees_with_the_check(name):
    assert name in TEXTS, f"chapter 18 has no Implement exercise for {name}"
    text = " ".join(TEXTS[name].split())
    for words in WORDS[name]:
        assert words in text, words
    assert f"`{name}(" in text, "the text gives the signature"
