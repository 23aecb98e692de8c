"""Chapter 11, training a Transformer: the checks of `causal_lm_loss` and `generate_greedy`, their cases
and their catalogued mistakes."""

import numpy as np

from mha.checks.common import ToyLanguageModel
from mha.checks.inputs import batch, normal, sizes
from mha.checks.reference import NUMPY as mn
from mha.checks.routes import CAUSAL_LM_LOSS_FORBIDS, GENERATE_GREEDY_FORBIDS
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for, registered

# causal_lm_loss: the logits at position t scored against token t + 1 --------------------------


@cases_for("causal_lm_loss", may_use="NumPy only (np.exp, np.log, np.take_along_axis; not mnp.log_softmax, "
                                     "not mnp.cross_entropy)",
           forbids=CAUSAL_LM_LOSS_FORBIDS)
def causal_lm_loss_cases(r):
    """One sequence, a batch whose logits reach above 1000 in one sequence and fall 800 below the others at one
    position of another, the shortest sequence (T = 2), and a model so sure of the wrong tokens that the right
    ones get probabilities below the smallest float64 (exp(-800) is 0)."""

    def case(label, shape, V):
        return Case(label, (2 * r.standard_normal(shape + (V,)), r.integers(0, V, size=shape)))

    far = 2 * r.standard_normal((3, 5, 7))
    far[0] += 1000.0  # exp overflows: a softmax without the shift by the maximum gives inf / inf
    far[1, 2] -= 800.0  # one position 800 below the others: shifted by the maximum of all the logits, exp is 0
    logits, tokens = 2 * r.standard_normal((2, 5, 6)), r.integers(0, 6, size=(2, 5))
    logits[0, np.arange(4), tokens[0, 1:]] -= 800.0  # the right token is very unlikely: exp(-800) underflows to 0
    return [
        case("one sequence of 6 tokens, a vocabulary of 5", (6,), 5),
        Case("a batch of 3 sequences of 5 tokens, a vocabulary of 7: logits above 1000 in sequence 0, "
             "and 800 below the others at one position of sequence 1", (far, r.integers(0, 7, size=(3, 5)))),
        case("T = 2: a single prediction per sequence", (4, 2), 3),
        Case("a confidently wrong model: the right tokens' logits 800 below the others", (logits, tokens)),
    ]


@random_cases_for("causal_lm_loss")
def causal_lm_loss_random_cases(r):
    """A 3-D batch of sequences, float32 logits with int32 tokens, and logits of every scale."""
    (T, V), b = sizes(r, 2, 2, 8), batch(r, 2)
    return [
        Case("random: a batch of batches", (normal(r, b + (T, V + 1), scale=3.0), r.integers(0, V + 1, size=b + (T,)))),
        Case("random: float32 logits, int32 tokens", (normal(r, (b[0], T, V), np.float32),
                                                     r.integers(0, V, size=(b[0], T)).astype(np.int32))),
        Case("random: large logits", (normal(r, (T + 1, V + 2), scale=500.0), r.integers(0, V + 2, size=T + 1))),
    ]


def _lm_loss(logits, tokens, *, wrong):
    """causal_lm_loss with one step done `wrong`."""
    logits, tokens = np.asarray(logits, dtype=float), np.asarray(tokens)
    if wrong == "no_shift":
        logits_used, targets = logits, tokens
    elif wrong == "backwards":
        logits_used, targets = logits[..., 1:, :], tokens[..., :-1]
    elif wrong == "roll":
        logits_used, targets = logits, np.roll(tokens, -1, axis=-1)
    else:
        logits_used, targets = logits[..., :-1, :], tokens[..., 1:]
    if wrong == "log_of_logits":
        log_p = np.log(logits_used)
    elif wrong == "positions_axis":
        log_p = mn.log_softmax(logits_used, axis=-2)
    elif wrong == "naive_softmax":
        e = np.exp(logits_used)
        log_p = np.log(e / e.sum(axis=-1, keepdims=True))
    elif wrong == "global_max":
        shifted = logits_used - logits_used.max()  # one maximum for every position of every sequence
        log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    else:
        log_p = mn.log_softmax(logits_used)
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]  # (..., T - 1)
    if wrong == "sum_over_positions":
        return -picked.sum(axis=-1).mean()
    return picked.mean() if wrong == "no_minus" else -picked.mean()


@mistake("causal_lm_loss", "shift the targets: the logits at position t predict token t + 1, so compare "
         "logits[..., :-1, :] with tokens[..., 1:]; without the shift each position predicts its own token")
def lm_loss_without_shift(logits, tokens):
    return _lm_loss(logits, tokens, wrong="no_shift")


@mistake("causal_lm_loss", "the shift goes the other way: position t predicts the NEXT token, so drop the "
         "last position's logits (logits[..., :-1, :]) and the first token (tokens[..., 1:])")
def lm_loss_shifted_backwards(logits, tokens):
    return _lm_loss(logits, tokens, wrong="backwards")


@mistake("causal_lm_loss", "the last position has no next token: drop it, rather than wrapping around to "
         "the first token as np.roll does")
def lm_loss_rolled(logits, tokens):
    return _lm_loss(logits, tokens, wrong="roll")


@mistake("causal_lm_loss", "log(softmax) computed as exp, divide, then log fails for very unlikely tokens "
         "(exp(-800) is 0, log(0) is -inf) and overflows for large logits: compute the log-softmax directly, "
         "x - max - log(sum(exp(x - max)))")
def lm_loss_naive_softmax(logits, tokens):
    return _lm_loss(logits, tokens, wrong="naive_softmax")


@mistake("causal_lm_loss", "subtract each position's own maximum (over the vocabulary, axis -1), not the maximum "
         "of all the logits: a position 800 below it underflows to exp(-800) = 0, and log(0) = -inf")
def lm_loss_global_max(logits, tokens):
    return _lm_loss(logits, tokens, wrong="global_max")


@mistake("causal_lm_loss", "logits are not probabilities: take the log-softmax, x - max - log(sum(exp(x - max))) "
         "along the vocabulary, not the log of the logits themselves")
def lm_loss_log_of_logits(logits, tokens):
    return _lm_loss(logits, tokens, wrong="log_of_logits")


@mistake("causal_lm_loss", "normalise over the vocabulary, the last axis of the logits (..., T, V): a softmax "
         "over axis -2 compares positions instead of tokens")
def lm_loss_softmax_over_positions(logits, tokens):
    return _lm_loss(logits, tokens, wrong="positions_axis")


@mistake("causal_lm_loss", "average over every prediction, sequences and positions alike, as "
         "F.cross_entropy does: summing over the positions makes the loss grow with T")
def lm_loss_summed_over_positions(logits, tokens):
    return _lm_loss(logits, tokens, wrong="sum_over_positions")


@mistake("causal_lm_loss", "the loss is the NEGATIVE log-probability of the right token: it is >= 0, and "
         "smaller is better")
def lm_loss_without_minus(logits, tokens):
    return _lm_loss(logits, tokens, wrong="no_minus")


check_causal_lm_loss = make_check("causal_lm_loss")

# generate_greedy: the generation loop --------------------------------------------------------
# (its cases hand it a mha.checks.common.ToyLanguageModel, which crosses the grader's wire as its table)


@cases_for("generate_greedy", may_use="NumPy and a Python loop", forbids=GENERATE_GREEDY_FORBIDS)
def generate_greedy_cases(r):
    """One prompt, a batch of prompts, a context window shorter than the text, no new token, a prompt of one token.
    The model and the prompts are drawn again until every catalogued mistake that gets a case wrong gets it wrong in
    its own way (a small model can make two wrong loops agree by chance, and the hint would name the other one)."""
    V = 11
    for _ in range(100):
        model = ToyLanguageModel(r, V)
        cases = [
            Case("one prompt of 4 tokens, 5 new tokens", (model, r.integers(0, V, size=4), 5)),
            Case("a batch of 2 prompts of 4 tokens, 6 new tokens", (model, r.integers(0, V, size=(2, 4)), 6)),
            Case("max_len=4: the model sees only the last 4 tokens", (model, r.integers(0, V, size=(2, 3)), 6),
                 {"max_len": 4}),
            Case("n_new = 0: the prompt, unchanged", (model, r.integers(0, V, size=(2, 3)), 0)),
            Case("a prompt of a single token", (model, r.integers(0, V, size=(3, 1)), 4)),
        ]
        if mistakes_told_apart("generate_greedy", cases):
            return cases
    raise AssertionError("no draw of 100 tells the mistakes of generate_greedy apart")  # (it takes 1 or 2)


def mistakes_told_apart(name, cases):
    """True when each catalogued mistake of `name` that fails on one of `cases` gets its own hint there: on the first
    case it gets wrong, no mistake before it in the catalogue gives the same answer."""
    def same(a, b):
        return np.shape(a) == np.shape(b) and np.array_equal(a, b)
    rights = [case.call(getattr(mn, name)) for case in cases]
    answers = [[case.call(m.fn) for case in cases] for m in registered(name).mistakes]
    for i, mine in enumerate(answers):
        first = next((j for j, (a, right) in enumerate(zip(mine, rights)) if not same(a, right)), None)
        if first is not None and any(same(earlier[first], mine[first]) for earlier in answers[:i]):
            return False
    return True


@random_cases_for("generate_greedy")
def generate_greedy_random_cases(r):
    """A 2-D batch of prompts with a context window, int32 prompts, and one long generation."""
    (T_0, n_new), b, V = sizes(r, 2, 1, 5), batch(r, 2), int(r.integers(4, 12))
    model = ToyLanguageModel(r, V)
    return [
        Case("random: a batch of batches, a context window", (model, r.integers(0, V, size=b + (T_0,)), n_new + 2),
             {"max_len": int(r.integers(1, T_0 + 2))}),
        Case("random: int32 prompts", (model, r.integers(0, V, size=(b[0], T_0)).astype(np.int32), n_new)),
        Case("random: one prompt, 12 new tokens", (model, r.integers(0, V, size=T_0), 12)),
    ]


def _generate(logits_fn, prompt, n_new, *, max_len=None, wrong):
    """generate_greedy with one step done `wrong`."""
    tokens = np.asarray(prompt)
    for _ in range(n_new + (wrong == "one_more")):
        context = tokens if max_len is None or wrong == "no_crop" else (
            tokens[..., :max_len] if wrong == "first_window" else tokens[..., -max_len:])
        if wrong == "last_token_only":
            context = tokens[..., -1:]
        elif wrong == "prompt_only":
            context = np.asarray(prompt) if max_len is None else np.asarray(prompt)[..., -max_len:]
        logits = logits_fn(context)  # (..., T, V)
        if wrong == "positions_axis":
            next_token = logits.argmax(axis=-2)[..., -1]
        else:
            next_token = logits[..., 0 if wrong == "first_position" else -1, :].argmax(axis=-1)
        tokens = np.concatenate([tokens, next_token[..., None]], axis=-1)
    return tokens[..., np.shape(prompt)[-1]:] if wrong == "without_prompt" else tokens


@mistake("generate_greedy", "feed the whole context, not only the last token: the next token depends on "
         "everything before it (a model of one token has no memory)")
def generate_from_the_last_token_only(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="last_token_only")


@mistake("generate_greedy", "append each new token and feed the grown sequence at the next step: feeding the "
         "prompt every time predicts the same token again and again")
def generate_from_the_prompt_only(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="prompt_only")


@mistake("generate_greedy", "take the argmax over the vocabulary, the last axis of the logits (..., T, V): "
         "axis -2 runs over positions")
def generate_argmax_over_positions(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="positions_axis")


@mistake("generate_greedy", "the LAST position's logits predict the next token (logits[..., -1, :]); "
         "position 0 predicts the second token of the context")
def generate_from_the_first_position(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="first_position")


@mistake("generate_greedy", "return the prompt followed by the new tokens, (..., T_0 + n_new), as the "
         "library does")
def generate_without_the_prompt(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="without_prompt")


@mistake("generate_greedy", "with max_len, feed only the last max_len tokens (tokens[..., -max_len:]): the model "
         "has no positions beyond its window")
def generate_without_the_window(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="no_crop")


@mistake("generate_greedy", "the window slides: keep the LAST max_len tokens (tokens[..., -max_len:]), "
         "the newest ones, not the first max_len")
def generate_from_the_first_window(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="first_window")


@mistake("generate_greedy", "generate exactly n_new tokens: loop n_new times, one token per turn")
def generate_one_token_too_many(logits_fn, prompt, n_new, *, max_len=None):
    return _generate(logits_fn, prompt, n_new, max_len=max_len, wrong="one_more")


check_generate_greedy = make_check("generate_greedy")
