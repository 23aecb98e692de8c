"""Toy inputs and tiny training tasks for the early chapters.

- `sentence_vectors`: the running example of chapters 1 to 6, the words of
  SENTENCE and the one vector the course gives each of them (`word_vectors`).
- `role_vectors`: the words' roles (subject, verb, object, ...) as vectors, the
  noiseless core of `word_vectors`, for the heads planted by hand.
- `sentence_features`: an older table of hand-made features (no chapter uses it).
- `add_positions`, `previous_token_batch`: random sequences whose target is each
  token's predecessor, a relation that depends on order and is not symmetric.
- `train`: a small, seeded training loop (Adam, mean squared error).

Everything is seeded, so a chapter that calls these prints the same numbers on
every run.
"""

import numpy as np
import torch

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
WORD_NOISE = np.random.default_rng(0).standard_normal((len(ROLES), 8))  # a row per word


def word_vectors(words):
    """The course's vector of each word, shape (T, d) = (len(words), 8): EMBEDDING_SCALE
    times (its roles + EMBEDDING_NOISE * its row of WORD_NOISE). A word gets the same
    vector wherever it appears."""
    roles = role_vectors(words)  # (T, d); refuses unknown words
    noise = WORD_NOISE[[list(ROLES).index(w) for w in words]]  # (T, d): each word's own row
    return EMBEDDING_SCALE * (roles + EMBEDDING_NOISE * noise)


def sentence_vectors():
    """The running example: the words of SENTENCE and their vectors X, shape (10, 8)."""
    return list(SENTENCE), word_vectors(SENTENCE)


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
