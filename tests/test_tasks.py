"""mha.experiments.tasks: the toy sentence, the previous-token task and the training loop."""

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from mha.experiments import tasks

T, D_TOKEN = 10, 8
D = D_TOKEN + T  # token features plus a one-hot position code


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_batch(generator):
    return tasks.previous_token_batch(64, T, D_TOKEN, generator)


def trained(model, steps=300, seed=0):
    return tasks.train(model, make_batch, steps=steps, lr=0.03, seed=seed)


def test_sentence_features_match_the_table():
    words, X = tasks.sentence_features(scale=1.0)
    assert words == "I am going to deposit my money at the bank".split()
    assert X.shape == (10, len(tasks.FEATURES))
    np.testing.assert_array_equal(X[words.index("bank")], tasks.FEATURE_TABLE["bank"])
    _, X2 = tasks.sentence_features()
    np.testing.assert_array_equal(X2, 2.0 * X)
    assert len({tuple(row) for row in X}) == len(words), "two words share a vector"


def test_related_words_attend_to_each_other():
    words, X = tasks.sentence_features()
    _, weights = mn.self_attention(X, exclude_self=True)
    favourite = {w: words[int(np.argmax(row))] for w, row in zip(words, weights)}
    assert favourite["money"] == "bank" and favourite["bank"] == "money"
    assert favourite["my"] == "I" and favourite["I"] == "my"


def test_sentence_vectors_are_the_doubled_roles_with_a_little_noise():
    words, X = tasks.sentence_vectors()
    assert words == tasks.SENTENCE and words is not tasks.SENTENCE
    assert X.shape == (10, len(tasks.ROLE_FEATURES)) == (10, 8)
    roles = tasks.role_vectors(words)
    noise = X / tasks.EMBEDDING_SCALE - roles
    assert 0.05 < noise.std() < 0.2 and np.abs(noise).max() < 0.5
    assert len({tuple(row) for row in X}) == len(words), "two words share a vector"
    np.testing.assert_array_equal(tasks.sentence_vectors()[1], X)  # the same on every call


def test_word_vectors_give_a_word_the_same_vector_everywhere():
    _, X = tasks.sentence_vectors()
    question = tasks.word_vectors(["where", "is", "my", "money"])
    np.testing.assert_array_equal(question[2:], X[[5, 6]])
    assert not np.allclose(question[1], tasks.word_vectors(["am"])[0])  # same roles, own noise
    with pytest.raises(ValueError, match="no roles for"):
        tasks.word_vectors(["cat"])


def test_related_words_in_the_running_example_attend_to_each_other():
    words, X = tasks.sentence_vectors()
    _, weights = mn.self_attention(X)
    _, others = mn.self_attention(X, exclude_self=True)
    favourite = {w: words[int(np.argmax(row))] for w, row in zip(words, others)}
    assert favourite["money"] == "bank" and favourite["bank"] == "money"
    assert favourite["my"] == "I" and favourite["I"] == "my"
    assert favourite["going"] == "deposit" and favourite["deposit"] == "going"
    for w in ("I", "deposit", "money", "bank"):  # words with two roles keep the most for themselves
        assert words[int(np.argmax(weights[words.index(w)]))] == w


def test_add_positions_appends_one_hot_positions():
    tokens = torch.randn(3, 5, 4)
    X = tasks.add_positions(tokens)
    assert X.shape == (3, 5, 4 + 5)
    torch.testing.assert_close(X[..., :4], tokens, rtol=0, atol=0)
    for b in range(3):
        torch.testing.assert_close(X[b, :, 4:], torch.eye(5), rtol=0, atol=0)


def test_add_positions_without_batch():
    X = tasks.add_positions(torch.zeros(2, 3))
    torch.testing.assert_close(X, torch.tensor([[0.0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]))


def test_targets_are_the_previous_tokens():
    X, Y = make_batch(torch.Generator().manual_seed(5))
    assert X.shape == Y.shape == (64, T, D)
    for t in range(1, T):
        torch.testing.assert_close(Y[:, t], X[:, t - 1], rtol=0, atol=0)
    torch.testing.assert_close(Y[:, 0], X[:, -1], rtol=0, atol=0)  # wraps around
    assert not torch.equal(Y, X)


def test_batches_follow_the_generator():
    X1, _ = make_batch(torch.Generator().manual_seed(1))
    X2, _ = make_batch(torch.Generator().manual_seed(1))
    X3, _ = make_batch(torch.Generator().manual_seed(2))
    assert torch.equal(X1, X2)
    assert not torch.equal(X1, X3)


def test_perfect_previous_token_attention_has_zero_loss():
    X, Y = make_batch(torch.Generator().manual_seed(0))
    shift = torch.roll(torch.eye(T), shifts=1, dims=0)  # row t has its 1 at t - 1
    torch.testing.assert_close(shift @ X, Y)


def test_train_is_deterministic_with_a_seed():
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        runs.append(trained(mt.HeadAttention(D, 8, values=False), steps=20))
    assert len(runs[0]) == 20
    assert runs[0] == runs[1]
    torch.manual_seed(0)
    other = trained(mt.HeadAttention(D, 8, values=False), steps=20, seed=1)
    assert other != runs[0]


def test_separate_query_and_key_learn_the_previous_token_but_symmetric_cannot():
    torch.manual_seed(0)
    qk = mt.HeadAttention(D, 8, values=False)
    torch.manual_seed(0)
    sym = mt.SymmetricAttention(D, 16)  # the same number of parameters, 288
    assert sum(p.numel() for p in qk.parameters()) == sum(p.numel() for p in sym.parameters())
    qk_losses, sym_losses = trained(qk), trained(sym)
    assert qk_losses[0] > 0.3 and sym_losses[0] > 0.3
    assert np.mean(qk_losses[-10:]) < 0.01
    assert np.mean(sym_losses[-10:]) > 0.3

    X, _ = make_batch(torch.Generator().manual_seed(123))
    previous = torch.arange(T).roll(1)  # previous[t] = t - 1, wrapping around
    for model, low, high in ((qk, 0.95, 1.0), (sym, 0.0, 0.5)):
        _, weights = model(X, return_weights=True)  # (B, T, T)
        on_previous = weights[:, torch.arange(T), previous].mean().item()
        assert low <= on_previous <= high


def test_symmetric_scores_cannot_favour_the_previous_token_on_average():
    """sum_t S[t, t-1] <= sum_t S[t, t] around the circle, for any W."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        E = rng.standard_normal((T, 4)) * rng.uniform(0.1, 3, size=(T, 1))  # X W, any norms
        S = E @ E.T
        assert np.trace(np.roll(S, 1, axis=1)) <= np.trace(S) + 1e-12


def test_role_vectors_put_each_role_in_its_column():
    X = tasks.role_vectors(["deposit", "my", "where"])
    column = {name: i for i, name in enumerate(tasks.ROLE_FEATURES)}
    assert X.shape == (3, len(tasks.ROLE_FEATURES)) == (3, 8)
    assert X[0, column["verb"]] == X[0, column["action"]] == 1.0 and X[0].sum() == 2.0
    assert X[1, column["person"]] == 1.0 and X[1, column["function"]] == 0.5 and X[1].sum() == 1.5
    assert X[2, column["place"]] == 1.0 and X[2, column["function"]] == 0.5 and X[2].sum() == 1.5
    assert set(tasks.SENTENCE) <= set(tasks.ROLES)
    assert all(set(roles) <= set(tasks.ROLE_FEATURES) for roles in tasks.ROLES.values())


def test_role_vectors_name_a_word_without_roles_and_refuse_a_string():
    with pytest.raises(ValueError, match=r"no roles for \['cat'\]; known words: I, am"):
        tasks.role_vectors(["I", "cat"])
    with pytest.raises(TypeError, match="split it first"):
        tasks.role_vectors("where is my money")
