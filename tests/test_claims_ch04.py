"""Chapter 4's claims over draws: every sentence about its random entries or the noise holds beyond them.

The chapter draws everything from one generator, `rng = np.random.default_rng(0)`, in a fixed
order: the one head of both relations, heads 0 and 1 with their W_V and W_O, then the
exercise's head 2 with its W_V and W_O. `chapter_heads(seed, noise_seed)` draws the same in the
same order from seed `seed`, on the word vectors of noise draw `noise_seed`; (0, 0) is the
chapter. Every claim is checked on ten seeds times ten draws of the noise, and again on a
hundred held-out draws (seeds 100 to 109 times noise draws 100 to 109) that no sentence was
written from: a claim about every draw must hold there too.
"""

import itertools

import numpy as np
import pytest

import mha.numpy as mnp
from mha.experiments import tasks

WORDS = tasks.SENTENCE
I, AM, GOING, DEPOSIT, MONEY, BANK = (WORDS.index(w) for w in ("I", "am", "going", "deposit", "money", "bank"))
D, D_HEAD = 8, 4
DRAWS = list(itertools.product(range(10), range(10)))  # (seed of the generator, seed of the noise)
HELD_OUT = list(itertools.product(range(100, 110), range(100, 110)))  # draws no sentence was written from
QUERY_WORDS = {0: ("deposit",), 1: ("am", "going", "deposit"), 2: ("deposit",)}  # who has the query feature


def chapter_heads(seed, noise_seed):
    rng = np.random.default_rng(seed)
    X = tasks.sentence_vectors(noise_seed)[1]
    both = tasks.planted_relation("action", ["subject", "place"], rng)
    head_0 = tasks.planted_relation("action", ["place"], rng)
    head_1 = tasks.planted_relation("verb", ["subject"], rng)
    heads = [(*head_0, rng.standard_normal((D, D_HEAD)) / np.sqrt(D)),
             (*head_1, rng.standard_normal((D, D_HEAD)) / np.sqrt(D))]
    W_o = rng.standard_normal((2 * D_HEAD, D)) / np.sqrt(2 * D_HEAD)
    head_2 = tasks.planted_relation("action", ["object"], rng)
    heads_3 = heads + [(*head_2, rng.standard_normal((D, D_HEAD)) / np.sqrt(D))]
    W_o_3 = rng.standard_normal((3 * D_HEAD, D)) / np.sqrt(3 * D_HEAD)
    return dict(X=X, both=both, heads=heads, W_o=W_o, heads_3=heads_3, W_o_3=W_o_3)


@pytest.fixture(scope="module")
def draws():
    return {draw: chapter_heads(*draw) for draw in DRAWS}


@pytest.fixture(scope="module")
def held_out():
    return {draw: chapter_heads(*draw) for draw in HELD_OUT}


def test_the_library_plants_what_the_chapters_helper_planted():
    rng, mine = np.random.default_rng(0), tasks.planted_relation("action", ["place"], np.random.default_rng(0))
    W_q = 0.1 * rng.standard_normal((D, D_HEAD))
    W_k = 0.1 * rng.standard_normal((D, D_HEAD))
    W_q[tasks.ROLE_FEATURES.index("action"), 0] += 1.5
    W_k[tasks.ROLE_FEATURES.index("place"), 0] += 1.5
    assert np.array_equal(mine[0], W_q) and np.array_equal(mine[1], W_k)


def test_one_head_shares_deposit_between_i_and_bank(draws, held_out):
    """"The split belongs to this draw ... other draws move it, at times far to one side. But on
    every draw the two take most of the row between them" (more than half: 0.77 at least on the
    hundred draws, 0.64 on the held-out ones)."""
    shares = []
    for draw, h in {**draws, **held_out}.items():
        _, A = mnp.head_attention(h["X"], *h["both"])
        shares.append((A[DEPOSIT, I], A[DEPOSIT, BANK]))
        assert A[DEPOSIT, I] + A[DEPOSIT, BANK] > 0.55, draw
    assert [round(s, 2) for s in shares[0]] == [0.31, 0.61]
    assert max(max(s) for s in shares) > 0.85 and min(min(s) for s in shares) < 0.15


def test_each_head_gives_its_own_target_most_of_the_row(draws, held_out):
    """"In head 0, "deposit" gives almost all its weight to "bank"; in head 1, almost all to "I".
    On other draws ... each head still gives its own target the largest weight of the row, and on
    nearly every draw more than half of it" (the held-out draw (101, 101) gives 0.49: above half on
    every draw here but one, by 0.1 or more on nineteen in twenty); and the exercise's head 2 finds "money"."""
    own = []
    for draw, h in {**draws, **held_out}.items():
        _, A = mnp.multihead_attention_loop(h["X"], h["heads_3"], h["W_o_3"])
        for head, target in ((0, BANK), (1, I), (2, MONEY)):
            row = A[head, DEPOSIT]
            assert row.argmax() == target and row[target] - np.delete(row, target).max() > 0.2, (draw, head)
            assert draw in held_out or row[target] > 0.5, (draw, head)
            own.append(row[target])
    assert np.mean(np.array(own) > 0.5) > 0.98 and np.percentile(own, 5) > 0.6
    _, A = mnp.multihead_attention_loop(draws[0, 0]["X"], draws[0, 0]["heads"], draws[0, 0]["W_o"])
    assert A[0, DEPOSIT, BANK] > 0.95 and A[1, DEPOSIT, I] > 0.95


def test_a_head_reading_one_chunk_leaves_deposit_spread_over_the_sentence(draws):
    """"Either way "deposit" spreads its weight over the sentence"."""
    for draw, h in draws.items():
        W_q, W_k, _ = h["heads"][0]
        for chunk in range(2):
            keep = np.arange(D) // (D // 2) == chunk
            _, A = mnp.head_attention(h["X"], W_q * keep[:, None], W_k * keep[:, None])
            assert A[DEPOSIT].max() < 0.3, (draw, chunk)


def test_only_the_words_with_the_query_feature_have_sharp_rows(draws, held_out):
    """"'am', half a verb, just above 0.5 in this draw (below it on many other draws)"; "in this draw
    its largest weight is at most 0.26"; "Over a hundred other draws, nine such rows in ten stay
    below 0.2; a rare one ... reaches 0.5"."""
    others, am = [], []
    for draw, h in draws.items():
        _, A = mnp.multihead_attention_loop(h["X"], h["heads_3"], h["W_o_3"])
        top = A.max(axis=-1)  # (h, T)
        am.append(top[1, AM])
        for head, words in QUERY_WORDS.items():
            rows = [j for j, w in enumerate(WORDS) if w not in words]
            others += list(top[head, rows])
            if draw == (0, 0):
                sharp = [w for w, m in zip(WORDS, top[head]) if m > 0.5]
                assert sharp == list(words) and top[head, rows].max() <= 0.26, head
    assert 0.5 < am[0] < 0.55 and sum(a < 0.5 for a in am) > 10
    assert np.percentile(others, 90) < 0.2 and max(others) < 0.6
    held = []
    for h in held_out.values():  # "nine such rows in ten stay below 0.2; a rare one reaches 0.5"
        top = mnp.multihead_attention_loop(h["X"], h["heads_3"], h["W_o_3"])[1].max(axis=-1)  # (h, T)
        held += [m for head, words in QUERY_WORDS.items() for w, m in zip(WORDS, top[head]) if w not in words]
    assert np.percentile(held, 90) < 0.2 and max(held) < 0.6


def test_the_word_vectors_are_about_as_long_as_a_layer_norm_makes_them():
    """"lengths between 1.4 and 3 (other draws of the noise stay between 0.8 and 3.7)"."""
    assert round(np.linalg.norm(tasks.sentence_vectors()[1], axis=1).min(), 1) == 1.4
    lengths = np.array([np.linalg.norm(tasks.sentence_vectors(s)[1], axis=1) for s in range(500)])
    assert lengths.min() > 0.8 and lengths.max() < 3.7


def untrained_heads(sigma, seeds):
    """The exercise's two averages, largest weight in a row and distance between two heads, as the
    chapter computes them (one generator per seed)."""
    X = tasks.sentence_vectors()[1]
    sharpness, distances = [], []
    for seed in seeds:
        gen = np.random.default_rng(seed)
        heads = [tuple(sigma * gen.standard_normal((D, 2)) / np.sqrt(D) for _ in range(3)) for _ in range(4)]
        _, maps = mnp.multihead_attention_loop(X, heads, np.eye(8))
        sharpness.append(maps.max(axis=-1).mean())
        distances += [0.5 * np.abs(maps[a] - maps[b]).sum(axis=-1).mean() for a in range(4) for b in range(a + 1, 4)]
    return np.mean(sharpness), np.mean(distances)


def untrained_maps(sigma, n, seed):
    """The weights of n draws of four random heads of width 2 at once: (n, 4, T, T)."""
    X = tasks.sentence_vectors()[1]
    W_q, W_k = sigma * np.random.default_rng(seed).standard_normal((2, n, 4, D, 2)) / np.sqrt(D)
    scores = (X @ W_q) @ np.swapaxes(X @ W_k, -1, -2) / np.sqrt(2)  # (n, 4, T, T)
    return mnp.softmax(scores)


def averages(maps):
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    apart = np.mean([0.5 * np.abs(maps[:, a] - maps[:, b]).sum(-1).mean() for a, b in pairs])
    return maps.max(axis=-1).mean(), apart


def test_the_batched_draw_is_the_chapters_computation():
    gen = np.random.default_rng(0)
    heads = [tuple(gen.standard_normal((D, 2)) / np.sqrt(D) for _ in range(3)) for _ in range(4)]
    _, chapter = mnp.multihead_attention_loop(tasks.sentence_vectors()[1], heads, np.eye(8))
    X = tasks.sentence_vectors()[1]
    mine = mnp.softmax(np.stack([(X @ q) @ (X @ k).T / np.sqrt(2) for q, k, _ in heads]))
    np.testing.assert_allclose(mine, chapter, atol=1e-12)


@pytest.mark.parametrize("sigma, sharp, apart", [(0.25, 0.11, 0.02), (1, 0.21, 0.28), (4, 0.79, 0.84), (8, 0.94, 0.87)])
def test_untrained_heads_over_other_sets_of_200_seeds(sigma, sharp, apart):
    """The exercise's numbers, from seeds 0 to 199 (checked here on seeds 0 to 19 as the chapter
    draws them, then on five other sets of 200 draws); "Averages over 200 seeds move by about a
    hundredth from one set of seeds to another"."""
    assert np.all(np.abs(np.subtract(untrained_heads(sigma, range(20)), (sharp, apart))) < 0.05)
    for seed in range(5):
        measured = averages(untrained_maps(sigma, 200, 1000 + seed))
        assert np.all(np.abs(np.subtract(measured, (sharp, apart))) < 0.02), (seed, measured)


def test_averages_over_5_seeds_move_by_several_hundredths():
    """"over 5 seeds they would move by several hundredths"."""
    maps = untrained_maps(1, 100, 7)
    blocks = np.array([averages(maps[first:first + 5]) for first in range(0, 100, 5)])
    assert np.all(blocks.max(axis=0) - blocks.min(axis=0) > 0.03)
