"""Toy inputs and tiny training tasks for the early chapters.

- `sentence_vectors`: the running example of chapters 1 to 6, the words of
  SENTENCE and the one vector the course gives each of them (`word_vectors`); other
  draws of its small noise (`word_noise`) show which findings hold beyond the draw shown.
- `role_vectors`: the words' roles (subject, verb, object, ...) as vectors, the
  noiseless core of `word_vectors`, for the heads planted by hand.
- `sentence_features`: an older table of hand-made features (no chapter uses it).
- `planted_relation`: the query and key matrices of a head planted by hand (chapters 3, 4).
- `add_positions`, `previous_token_batch`: random sequences whose target is each
  token's predecessor, a relation that depends on order and is not symmetric;
  `relation_batch`: the same sequences with targets that any (T, T) matrix mixes.
- `train`: a small, seeded training loop (Adam, mean squared error).
- `previous_token_sweep`, `relations_sweep`: chapter 2's trainings over seeds, registered as
  the sweeps "ch02_previous_token" and "ch02_relations" (mha.experiments.seeds).

Everything is seeded, so a chapter that calls these prints the same numbers on
every run.
"""

from functools import partial

import numpy as np
import torch

import mha.torch as mt
from mha.experiments import seeds

SENTENCE = "I am going to deposit my money at the bank".split()

# One column per feature, one row per word of SENTENCE; the values are made up
# by hand so that words that belong together share features.
FEATURES = ("person", "verb", "motion", "money", "place", "grammar", "owning", "noun")
FEATURE_TABLE = {
    #          person verb motion money place grammar owning noun
    "I":       (1.0,  0.0, 0.0,   0.0,  0.0,  0.0,    0.3,   0.5),
    "am":      (0.2,  0.8, 0.0,   0.0,  0.0,  0.6,    0.0,   0.0),
    "going":   (0.0,  1.0, 1.0,   0.0,  0.0,  0.0,    0.0,   0.0),
    "to":      (0.0,  0.0, 0.6,   0.0,  0.0,  1.0,    0.0,   0.0),
    "deposit": (0.0,  1.0, 0.3,   0.8,  0.0,  0.0,    0.0,   0.0),
    "my":      (0.8,  0.0, 0.0,   0.0,  0.0,  0.4,    1.0,   0.0),
    "money":   (0.0,  0.0, 0.0,   1.0,  0.0,  0.0,    0.4,   1.0),
    "at":      (0.0,  0.0, 0.4,   0.0,  0.6,  1.0,    0.0,   0.0),
    "the":     (0.0,  0.0, 0.0,   0.0,  0.0,  1.0,    0.0,   0.2),
    "bank":    (0.0,  0.0, 0.0,   0.8,  1.0,  0.0,    0.0,   1.0),
}


def sentence_features(scale=2.0):
    """The words of SENTENCE and their hand-made vectors X, shape (T, d) = (10, 8).

    Each row is the word's row of FEATURE_TABLE times `scale`: longer vectors
    give larger dot products, hence attention weights that are easier to read.
    """
    X = scale * np.array([FEATURE_TABLE[word] for word in SENTENCE])  # (T, d)
    return list(SENTENCE), X


# The running example's words and the roles each one plays, as if an earlier layer had
# worked them out. A word has the features listed for it and 0 for the others; "where" and
# "is" come from the question that chapter 3 asks of the sentence.
ROLE_FEATURES = ("person", "subject", "verb", "action",
                 "noun", "place", "object", "function")
ROLES = {
    "I":       dict(person=1, subject=1),
    "am":      dict(verb=0.5, function=0.5),
    "going":   dict(verb=1),
    "to":      dict(function=1),
    "deposit": dict(verb=1, action=1),
    "my":      dict(person=1, function=0.5),
    "money":   dict(noun=1, object=1),
    "at":      dict(function=1),
    "the":     dict(function=1),
    "bank":    dict(noun=1, place=1),
    "where":   dict(place=1, function=0.5),
    "is":      dict(verb=0.5, function=0.5),
}


def role_vectors(words):
    """The role vectors of `words` from ROLES: shape (T, d) = (len(words), 8), one
    column per entry of ROLE_FEATURES."""
    if isinstance(words, str):
        raise TypeError(f"words must be a list of words, got the string {words!r}: split it first")
    unknown = [w for w in words if w not in ROLES]
    if unknown:
        raise ValueError(f"no roles for {unknown}; known words: {', '.join(ROLES)}")
    return np.array([[ROLES[w].get(f, 0.0) for f in ROLE_FEATURES] for w in words])  # (T, d)


# The running example of chapters 1 to 6: one fixed vector per word, like a row of a
# model's embedding table. The roles are doubled, so that attention without parameters
# (chapter 1) gives weights that are easy to read, and a little seeded noise makes
# every word different ("to", "at" and "the" share their roles).
EMBEDDING_SCALE = 2.0  # the roles, doubled
EMBEDDING_NOISE = 0.1  # the size of the noise, before doubling


def word_noise(seed=0):
    """One row of standard normal noise per word of ROLES, shape (len(ROLES), 8), drawn with
    `seed`. The course's vectors use seed 0 (WORD_NOISE); other seeds are other draws of the
    same kind, to check which of a chapter's findings hold beyond the draw it shows."""
    return np.random.default_rng(seed).standard_normal((len(ROLES), len(ROLE_FEATURES)))


WORD_NOISE = word_noise(0)  # a row per word: the draw that the chapters show


def word_vectors(words, noise_seed=0):
    """The course's vector of each word, shape (T, d) = (len(words), 8): EMBEDDING_SCALE
    times (its roles + EMBEDDING_NOISE * its row of the noise). A word gets the same
    vector wherever it appears. `noise_seed` picks another draw of the noise (`word_noise`)."""
    roles = role_vectors(words)  # (T, d); refuses unknown words
    table = WORD_NOISE if noise_seed == 0 else word_noise(noise_seed)  # (len(ROLES), d)
    noise = table[[list(ROLES).index(w) for w in words]]  # (T, d): each word's own row
    return EMBEDDING_SCALE * (roles + EMBEDDING_NOISE * noise)


def sentence_vectors(noise_seed=0):
    """The running example: the words of SENTENCE and their vectors X, shape (10, 8).
    `noise_seed` picks another draw of the noise; 0 is the one every chapter shows."""
    return list(SENTENCE), word_vectors(SENTENCE, noise_seed)


def add_positions(tokens):
    """Append a one-hot code of each position: (..., T, d_token) -> (..., T, d_token + T).

    Without it, attention cannot tell the first token from the last: it sees a
    set of vectors, not a sequence.
    """
    *batch, T, _ = tokens.shape
    positions = torch.eye(T, dtype=tokens.dtype, device=tokens.device)  # (T, T)
    return torch.cat([tokens, positions.expand(*batch, T, T)], dim=-1)  # (..., T, d_token + T)


def previous_token_batch(batch_size, T, d_token, generator=None):
    """Random sequences and, as targets, each token's predecessor.

    Tokens are Gaussian vectors of width d_token with position codes appended
    (`add_positions`). The target at position t is the whole input vector at
    t - 1; the first token's predecessor is the last one (the sequence wraps
    around, like a clock). Returns inputs X and targets Y, both of shape
    (batch_size, T, d_token + T), with Y[:, t] == X[:, t - 1].
    """
    tokens = torch.randn(batch_size, T, d_token, generator=generator)  # (B, T, d_token)
    X = add_positions(tokens)  # (B, T, d_token + T)
    Y = torch.roll(X, shifts=1, dims=-2)  # Y[:, t] = X[:, t - 1]
    return X, Y


def relation_batch(mixing, batch_size, d_token, generator=None):
    """Random sequences and, as targets, the averages that `mixing` asks for.

    mixing: (T, T), row t holds the weights of the average of the inputs wanted at
    position t (chapter 2's exercise; the previous-token task is the shifted identity).
    Tokens are Gaussian vectors of width d_token with position codes appended. Returns
    inputs X and targets mixing @ X, both of shape (batch_size, T, d_token + T).
    """
    T = mixing.shape[-1]
    X = add_positions(torch.randn(batch_size, T, d_token, generator=generator))  # (B, T, d_token + T)
    return X, mixing @ X


def planted_relation(query_feature, key_features, rng, d_head=4, strength=1.5):
    """W_q and W_k, shape (d, d_head) each, of a head planted by hand on the role vectors:
    a query with `query_feature` looks for keys with `key_features` (names of ROLE_FEATURES).

    Small random entries, 0.1 times standard normal draws from `rng` (W_q's first), fill
    both matrices, as they would in a trained head; `strength` is added to column 0 of W_q
    in the query feature's row, and of W_k in each key feature's row.
    """
    d = len(ROLE_FEATURES)
    W_q = 0.1 * rng.standard_normal((d, d_head))  # (d, d_head)
    W_k = 0.1 * rng.standard_normal((d, d_head))  # (d, d_head)
    W_q[ROLE_FEATURES.index(query_feature), 0] += strength
    for feature in key_features:
        W_k[ROLE_FEATURES.index(feature), 0] += strength
    return W_q, W_k


def train(model, make_batch, steps=300, lr=0.03, seed=0):
    """Fit `model` to fresh batches with Adam and the mean squared error.

    make_batch(generator) returns (inputs, targets); model(inputs) must have
    the targets' shape. The batches are drawn from a generator seeded with
    `seed`, so the same model and seed give the same losses. Returns the loss
    of every step, as a list of floats.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        X, Y = make_batch(generator)
        loss = torch.nn.functional.mse_loss(model(X), Y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# Chapter 2's trainings over seeds: each sweep's table (mha.experiments.seeds) is what the
# chapter and tests/test_claims_ch02.py read. Seed s gives both models torch.manual_seed(s)
# as their start and draws their batches with seed s, as the chapter does for s = 0.
CH2 = dict(T=10, d_token=8, d_embed=16, d_head=8, lr=0.03)


def _two_scorers(seed):
    """Chapter 2's symmetric attention and query-key head, each started from manual_seed(seed)."""
    d_model = CH2["d_token"] + CH2["T"]
    torch.manual_seed(seed)
    symmetric = mt.SymmetricAttention(d_model, d_embed=CH2["d_embed"])
    torch.manual_seed(seed)
    return symmetric, mt.HeadAttention(d_model, d_head=CH2["d_head"], values=False)


def _uniform_loss(X, Y):
    """The loss of uniform attention: every output is the average of its sequence's inputs."""
    return torch.nn.functional.mse_loss(X.mean(dim=-2, keepdim=True).expand_as(Y), Y).item()


def _on_the_sentence(model, scores, x_sentence):
    """Average weights on the previous token, itself and the next one; sums of raw scores."""
    T = CH2["T"]
    before, rows = torch.arange(T).roll(1), torch.arange(T)  # before[t] = t - 1 (wrapping)
    with torch.no_grad():
        _, A = model(x_sentence, return_weights=True)  # (T, T)
        Q, K = scores(x_sentence)  # (T, width) each
        S = Q @ K.T / K.shape[-1] ** 0.5  # (T, T)
    return {"on_previous": A[rows, before].mean(), "on_previous_min": A[rows, before].min(),
            "on_itself": A.diagonal().mean(),
            "on_next": A[before, rows].mean(), "scores_to_previous": S[rows, before].sum(),
            "scores_to_itself": S.diagonal().sum()}


@seeds.sweep("ch02_previous_token", seeds=range(10), tolerance=0.01, held_out=(100, 101))
def previous_token_sweep(seed):
    """Chapter 2's experiment on one seed: both models trained 300 steps on the previous-token task.

    The row holds, for `symmetric` and `query_key`: `_first` and `_last` (the first and last
    training losses), `_losses` (the mean loss of every 10 steps), and on the chapter's sentence
    with positions the average weight `_on_previous` (its smallest: `_on_previous_min`),
    `_on_itself` and `_on_next`, and the sums of the scores `_scores_to_previous` and
    `_scores_to_itself`. `uniform` is the loss of uniform attention on the first batch.
    """
    make_batch = partial(previous_token_batch, 64, CH2["T"], CH2["d_token"])
    X, Y = make_batch(torch.Generator().manual_seed(seed))  # the first batch that training draws
    row = {"uniform": _uniform_loss(X, Y)}
    x_sentence = add_positions(torch.tensor(sentence_vectors()[1], dtype=torch.float32))  # (T, d_model)
    symmetric, query_key = _two_scorers(seed)
    for name, model, scores in (("symmetric", symmetric, lambda x: (symmetric.W(x),) * 2),
                                ("query_key", query_key, lambda x: (query_key.W_q(x), query_key.W_k(x)))):
        losses = train(model, make_batch, steps=300, lr=CH2["lr"], seed=seed)
        row |= {f"{name}_first": losses[0], f"{name}_last": losses[-1],
                f"{name}_losses": np.reshape(losses, (-1, 10)).mean(axis=1)}
        row |= {f"{name}_{key}": float(value) for key, value in _on_the_sentence(model, scores, x_sentence).items()}
    return row


def relation_matrices(T):
    """Chapter 2's exercise tasks as (T, T) mixing matrices: the next token, every position of
    the same parity (itself included) and both neighbours (itself excluded), wrapping around."""
    later = torch.roll(torch.eye(T), shifts=-1, dims=0)  # row t has its 1 in column t + 1
    parity = (torch.arange(T)[:, None] - torch.arange(T)[None, :]) % 2 == 0  # (T, T)
    return {"next_token": later, "same_parity": parity.float() / parity.sum(dim=-1, keepdim=True),
            "both_neighbours": (later + later.T) / 2}


@seeds.sweep("ch02_relations", seeds=range(10), tolerance=0.01, held_out=(100, 101))
def relations_sweep(seed):
    """Chapter 2's exercise on one seed: both models trained 200 steps (batches of 32) per task.

    For each task of `relation_matrices`, the row holds `uniform_<task>` (the loss of uniform
    attention on 32 sequences drawn with seed 99) and `symmetric_<task>`, `query_key_<task>`
    (the mean of the last 10 training losses).
    """
    T, row = CH2["T"], {}
    for task, mixing in relation_matrices(T).items():
        make_batch = partial(relation_batch, mixing, 32, CH2["d_token"])
        X, Y = make_batch(torch.Generator().manual_seed(99))
        row[f"uniform_{task}"] = _uniform_loss(X, Y)
        for name, model in zip(("symmetric", "query_key"), _two_scorers(seed)):
            losses = train(model, make_batch, steps=200, lr=CH2["lr"], seed=seed)
            row[f"{name}_{task}"] = float(np.mean(losses[-10:]))
    return row
