"""Chapter 11's checks: right solutions written from scratch pass whatever the seed, every catalogued
mistake is rejected with its hint, and wrong solutions outside the catalogue are rejected too."""

import numpy as np
import pytest
from learners import unguarded

import mha.checks as checks
from mha.checks import ch11, registry
from mha.checks.registry import CHECKS

NAMES = ("causal_lm_loss", "generate_greedy")


def causal_lm_loss(logits, tokens):
    """From scratch: log-softmax by hand, in float64, one sequence at a time; the loss in the logits' dtype."""
    dtype = np.asarray(logits).dtype
    logits = np.asarray(logits, dtype=np.float64)
    flat_logits = logits.reshape(-1, *logits.shape[-2:])  # (N, T, V)
    flat_tokens = np.asarray(tokens).reshape(-1, logits.shape[-2])  # (N, T)
    losses = []
    for seq_logits, seq_tokens in zip(flat_logits, flat_tokens):
        for t in range(len(seq_tokens) - 1):
            row = seq_logits[t]
            top = row.max()
            log_total = top + np.log(np.sum(np.exp(row - top)))
            losses.append(log_total - row[seq_tokens[t + 1]])
    return np.mean(losses).astype(dtype)


def generate_greedy(logits_fn, prompt, n_new, *, max_len=None):
    """From scratch: a list that grows, cropped to the window, the last row's argmax."""
    prompt = np.asarray(prompt)
    batch_shape = prompt.shape[:-1]
    rows = [list(row) for row in prompt.reshape(-1, prompt.shape[-1])]
    for _ in range(n_new):
        window = np.array([row if max_len is None else row[-max_len:] for row in rows])  # (N, T)
        logits = np.asarray(logits_fn(window.reshape(*batch_shape, window.shape[-1])))
        last = logits.reshape(len(rows), window.shape[-1], -1)[:, -1, :]  # (N, V)
        for row, scores in zip(rows, last):
            row.append(int(np.argmax(scores)))
    return np.array(rows).reshape(*batch_shape, -1)


SOLUTIONS = {"causal_lm_loss": causal_lm_loss, "generate_greedy": generate_greedy}


@pytest.mark.parametrize("name", NAMES)
def test_a_right_solution_from_scratch_passes_whatever_the_seed(name, capsys):
    for seed in (None, 0, 1, 2, 3):
        getattr(checks, f"check_{name}")(SOLUTIONS[name], seed=seed)
    assert capsys.readouterr().out.count(f"check_{name}: all {len(CHECKS[name].named_cases(0))} cases passed.") == 5


@pytest.mark.parametrize("name", NAMES)
def test_the_catalogue_of_classic_mistakes(name):
    hints = {m.fn.__name__ for m in CHECKS[name].mistakes}
    expected = {"causal_lm_loss": {"lm_loss_without_shift", "lm_loss_shifted_backwards", "lm_loss_log_of_logits",
                                   "lm_loss_softmax_over_positions", "lm_loss_summed_over_positions"},
                "generate_greedy": {"generate_from_the_last_token_only", "generate_argmax_over_positions",
                                    "generate_without_the_prompt"}}[name]
    assert expected <= hints


MISTAKES = [m for name in NAMES for m in CHECKS[name].mistakes]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.fn.__name__ for m in MISTAKES])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_mistake_is_rejected_with_its_hint(mistake, seed):
    with pytest.raises(checks.CheckFailed) as info:
        getattr(checks, f"check_{mistake.name}")(unguarded(mistake.fn), seed=seed)
    assert f"hint: {mistake.hint}" in str(info.value)


def loss_of_the_first_sequence_only(logits, tokens):
    return causal_lm_loss(np.asarray(logits).reshape(-1, *np.shape(logits)[-2:])[:1],
                          np.asarray(tokens).reshape(-1, np.shape(tokens)[-1])[:1])


def loss_in_float16(logits, tokens):
    return causal_lm_loss(np.asarray(logits, dtype=np.float16), tokens)


def generate_for_the_first_prompt_only(logits_fn, prompt, n_new, *, max_len=None):
    prompt = np.asarray(prompt)
    first = generate_greedy(logits_fn, prompt.reshape(-1, prompt.shape[-1])[:1], n_new, max_len=max_len)
    return np.broadcast_to(first, (*prompt.shape[:-1], first.shape[-1]))


def generate_with_repeats(logits_fn, prompt, n_new, *, max_len=None):
    """Calls the model once, then repeats its first choice."""
    prompt = np.asarray(prompt)
    first = np.asarray(logits_fn(prompt if max_len is None else prompt[..., -max_len:]))[..., -1, :].argmax(-1)
    return np.concatenate([prompt, np.repeat(first[..., None], n_new, axis=-1)], axis=-1)


@pytest.mark.parametrize("name,fn", [
    ("causal_lm_loss", loss_of_the_first_sequence_only), ("causal_lm_loss", loss_in_float16),
    ("generate_greedy", generate_for_the_first_prompt_only), ("generate_greedy", generate_with_repeats),
])
def test_more_wrong_solutions_are_rejected(name, fn):
    for seed in (0, 1):
        with pytest.raises(checks.CheckFailed):
            getattr(checks, f"check_{name}")(fn, seed=seed)


def test_the_toy_model_depends_on_the_whole_context_and_its_positions():
    model = ch11.ToyLanguageModel(np.random.default_rng(0), 7)
    tokens = np.array([[3, 1, 4, 1, 5]])
    logits = model(tokens)
    assert logits.shape == (1, 5, 7)
    assert not np.array_equal(model(tokens[:, -1:])[:, -1], logits[:, -1]), "the last token alone is not enough"
    assert not np.array_equal(model(tokens[:, 1:])[:, -1], logits[:, -1]), "a shorter window changes the answer"
    assert np.array_equal(model(tokens[:, :3]), logits[:, :3]), "the model is causal"
    with pytest.raises(TypeError, match="integer token ids"):
        model(tokens.astype(float))


def test_the_checks_print_one_line_for_the_chapters_solutions(capsys):
    checks.check_causal_lm_loss(causal_lm_loss)
    checks.check_generate_greedy(generate_greedy)
    assert capsys.readouterr().out.splitlines() == ["check_causal_lm_loss: all 4 cases passed.",
                                                   "check_generate_greedy: all 5 cases passed."]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.fn.__name__ for m in MISTAKES])
def test_every_mistake_fails_a_named_case_where_its_hint_is_the_one_given(mistake):
    """The named cases alone catch every catalogued mistake, and on the first one it fails, no mistake
    registered before it gives the same answer: the hint names the mistake that was made, whatever the seed."""
    check = CHECKS[mistake.name]
    for case in check.named_cases(0):
        with np.errstate(all="ignore"):
            got = case.call(mistake.fn)
            expected = case.call(SOLUTIONS[mistake.name])
        if np.shape(got) != np.shape(expected) or not np.allclose(got, expected, equal_nan=True):
            assert registry.matching_hint(check, case, got) == mistake.hint, case.label
            return
    pytest.fail(f"no named case catches {mistake.fn.__name__}")
