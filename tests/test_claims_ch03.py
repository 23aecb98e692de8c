"""Chapter 3's claims over draws: every sentence about its random entries or the noise holds beyond them.

The chapter plants a head by hand: 0.1 times standard normal entries (the chapter's generator,
seed 0, or seed 5 in the strength exercise), plus a planted entry; the word vectors carry one
draw of noise (`tasks.sentence_vectors(noise_seed)`). Here every claim is checked on ten seeds
of the small entries times ten draws of the noise (a hundred draws), and a sentence about "this
draw" on the draw shown. `tasks.planted_relation` draws exactly what the chapter's cells draw.
A sentence about every draw is checked again on a hundred held-out draws (seeds 100 to 109 times
noise draws 100 to 109) that no sentence was written from; a range the chapter gives for "the
hundred draws we tried" is checked on those, and more loosely on the held-out ones.
"""

import itertools

import numpy as np
import pytest

import mha.numpy as mnp
from mha.experiments import tasks

WORDS = tasks.SENTENCE
I, AM, GOING, DEPOSIT, MONEY, BANK = (WORDS.index(w) for w in ("I", "am", "going", "deposit", "money", "bank"))
D_HEAD = 4
DRAWS = list(itertools.product(range(10), range(10)))  # (seed of the small entries, seed of the noise)
HELD_OUT = list(itertools.product(range(100, 110), range(100, 110)))  # draws no sentence was written from
COLUMN = {name: i for i, name in enumerate(tasks.ROLE_FEATURES)}


def planted_head(seed, noise_seed, strength=1.5):
    """The chapter's verb-looks-for-subject head, its W_v and X, for one draw (0, 0: the chapter's)."""
    rng = np.random.default_rng(seed)
    W_q, W_k = tasks.planted_relation("verb", ["subject"], rng, strength=strength)
    rng.standard_normal((D_HEAD, D_HEAD))  # the chapter's R comes next from the same generator
    W_v = rng.standard_normal((8, D_HEAD)) / np.sqrt(8)
    return W_q, W_k, W_v, tasks.sentence_vectors(noise_seed)[1]


def test_the_library_plants_the_chapters_head():
    rng = np.random.default_rng(0)
    W_q = 0.1 * rng.standard_normal((8, D_HEAD))
    W_k = 0.1 * rng.standard_normal((8, D_HEAD))
    W_q[COLUMN["verb"], 0] += 1.5
    W_k[COLUMN["subject"], 0] += 1.5
    mine = planted_head(0, 0)
    assert np.array_equal(mine[0], W_q) and np.array_equal(mine[1], W_k)


def test_the_scores_of_the_planted_head_are_far_from_symmetric_on_every_draw():
    """The chapter's `assert asymmetry > 1`; the two scores a shared matrix would tie "are now far
    apart"; the largest entry of M is the planted one, (verb, subject)."""
    for seed, noise in DRAWS + HELD_OUT:
        W_q, W_k, _, X = planted_head(seed, noise)
        S = X @ W_q @ (X @ W_k).T / np.sqrt(D_HEAD)
        assert np.abs(S - S.T).max() > 1 and S[DEPOSIT, I] - S[I, DEPOSIT] > 1.5, (seed, noise)
        M = W_q @ W_k.T / np.sqrt(D_HEAD)
        assert np.unravel_index(np.abs(M).argmax(), M.shape) == (COLUMN["verb"], COLUMN["subject"])


def test_the_verbs_look_for_i_and_i_does_not_look_back_on_every_draw():
    """"The verbs "going" and "deposit" give "I" their largest weight (0.84 and 0.73), and so does
    "am" (0.37)"; "In each of a hundred draws ... the three verbs give "I" their largest weight,
    and "I" gives each of its verbs less than 0.15" (and on the held-out draws too)."""
    for seed, noise in DRAWS + HELD_OUT:
        W_q, W_k, W_v, X = planted_head(seed, noise)
        _, A = mnp.head_attention(X, W_q, W_k, W_v)
        assert all(A[verb].argmax() == I for verb in (AM, GOING, DEPOSIT)), (seed, noise)
        assert max(A[I, GOING], A[I, DEPOSIT]) < 0.15, (seed, noise)
    W_q, W_k, W_v, X = planted_head(0, 0)
    _, A = mnp.head_attention(X, W_q, W_k, W_v)
    assert [round(A[w, I], 2) for w in (GOING, DEPOSIT, AM)] == [0.84, 0.73, 0.37]


def strengths(seed, noise):
    """The strength exercise for one draw: the table of the chapter, one row per strength."""
    X, rows = tasks.sentence_vectors(noise)[1], {}
    for strength in (0, 0.25, 0.5, 1, 1.5, 2, 3):
        W_q, W_k = tasks.planted_relation("verb", ["subject"], np.random.default_rng(seed), strength=strength)
        _, A = mnp.head_attention(X, W_q, W_k)
        score = (X[DEPOSIT] @ W_q) @ (X[I] @ W_k) / np.sqrt(D_HEAD)
        rows[strength] = dict(score=score, A=A, query_of_I=(X[I] @ W_q)[0])
    return rows


def test_the_strength_exercise_on_the_draw_shown():
    """"1.80, 7.64 and 17.52 measured in this draw"; "(from 0.34 to 0.99 in this draw)"; "0.10,
    then 0.08 in this draw"; "at strength 3, "I" gives 0.28 of its weight to itself"."""
    rows = strengths(5, 0)
    assert [round(rows[s]["score"], 2) for s in (1, 2, 3)] == [1.80, 7.64, 17.52]
    assert [round(rows[s]["A"][DEPOSIT, I], 2) for s in (1, 2)] == [0.34, 0.99]
    assert [round(rows[s]["A"][I, DEPOSIT], 2) for s in (0, 3)] == [0.10, 0.08]
    assert round(rows[3]["A"][I, I], 2) == 0.28 and tasks.sentence_vectors()[1][I, COLUMN["verb"]] > 0


def test_the_strength_exercise_on_every_draw():
    """"Doubling a large strength multiplies the score by about 4" (3.3 to 5); "At strength 0 the
    row of "deposit" is almost flat, near 1/T = 0.1" (0.06 to 0.14); "by strength 3 the row is
    one-hot"; "going" follows; "The weight of "I" on "deposit" stays low, near that of a flat row
    ..., never near the one-hot row" (below 0.3, a median below 0.12); the share of "I" on itself at
    strength 3 "runs from almost nothing to most of the row: it grows with the strength when column
    0 of the query of "I" is positive, shrinks when it is negative, and hardly moves when it is near
    0" (held-out draws (103, 119), (121, 112) and (125, 110) have it within 0.02 of 0, the wrong
    way by less than 0.005): on the draws tried and the held-out ones."""
    on_itself, on_deposit = [], []
    for seed, noise in DRAWS + [(5, n) for n in range(10)] + HELD_OUT:
        rows = strengths(seed, noise)
        assert 3.3 < rows[3]["score"] / rows[1.5]["score"] < 5, (seed, noise)
        flat = rows[0]["A"][DEPOSIT]
        assert 0.06 < flat.min() and flat.max() < 0.14, (seed, noise)
        assert rows[3]["A"][DEPOSIT, I] > 0.99 and rows[3]["A"][GOING, I] > 0.99, (seed, noise)
        assert rows[1]["A"][DEPOSIT, I] < rows[2]["A"][DEPOSIT, I], (seed, noise)
        on_deposit.append(max(row["A"][I, DEPOSIT] for row in rows.values()))
        change, query = rows[3]["A"][I, I] - rows[0]["A"][I, I], rows[3]["query_of_I"]
        if abs(query) > 0.05:
            assert (change > 0) == (query > 0), (seed, noise)
        else:
            assert abs(change) < 0.05, (seed, noise)
        on_itself.append(rows[3]["A"][I, I])
    assert max(on_deposit) < 0.3 and np.median(on_deposit) < 0.12
    assert min(on_itself) < 0.05 and max(on_itself) > 0.5
    for seed, noise in ((103, 119), (121, 112), (125, 110)):  # near 0: the rule of signs says nothing
        rows = strengths(seed, noise)
        assert abs(rows[3]["query_of_I"]) < 0.02 and abs(rows[3]["A"][I, I] - rows[0]["A"][I, I]) < 0.005


def test_a_narrow_head_of_width_one_points_at_two_ends_and_width_two_serves_all():
    """The exercise's assert (width 2 serves the three relations) on every draw of the noise;
    with width 1, "bank" finds "I" when its query is positive and itself when it is negative."""
    s = 3.0
    w_q, w_k = np.zeros((8, 1)), np.zeros((8, 1))
    w_q[COLUMN["verb"]], w_q[COLUMN["object"]] = s, -s
    w_k[COLUMN["subject"]], w_k[COLUMN["place"]] = s, -s
    W_q2, W_k2 = np.zeros((8, 2)), np.zeros((8, 2))
    W_q2[COLUMN["verb"], 0] = W_k2[COLUMN["subject"], 0] = s
    W_q2[COLUMN["object"], 1] = W_k2[COLUMN["place"], 1] = s
    W_q2[COLUMN["place"]] = W_k2[COLUMN["action"]] = -s
    looked_at_self = []
    for noise in range(50):
        X = tasks.sentence_vectors(noise)[1]
        _, one = mnp.head_attention(X, w_q, w_k)
        _, two = mnp.head_attention(X, W_q2, W_k2)
        assert [WORDS[two[q].argmax()] for q in (GOING, DEPOSIT, MONEY, BANK)] == ["I", "I", "bank", "deposit"]
        assert [WORDS[one[q].argmax()] for q in (GOING, DEPOSIT, MONEY)] == ["I", "I", "bank"], noise
        expected = "I" if (X[BANK] @ w_q)[0] > 0 else "bank"
        assert WORDS[one[BANK].argmax()] == expected, noise
        looked_at_self.append(expected == "bank")
        if noise == 0:
            assert expected == "I"
    assert 0 < sum(looked_at_self) < 50


def shares(alpha, n, seed, X):
    """r for n independent draws of W_Q and R (one generator, drawn at once): (n,)."""
    gen = np.random.default_rng(seed)
    W_q, R = gen.standard_normal((2, n, 8, D_HEAD)) / np.sqrt(8)  # (n, d, d_head) each
    S = (X @ W_q) @ np.swapaxes(X @ ((1 - alpha) * W_q + alpha * R), -1, -2) / np.sqrt(D_HEAD)  # (n, T, T)
    return np.linalg.norm(S - np.swapaxes(S, -1, -2), axis=(-2, -1)) / (2 * np.linalg.norm(S, axis=(-2, -1)))


@pytest.mark.parametrize("alpha, mean, low, high", [(0.1, 0.05, 0.03, 0.08), (0.25, 0.15, 0.08, 0.24),
                                                    (0.5, 0.38, 0.21, 0.57), (1, 0.62, 0.44, 0.78)])
def test_the_means_of_the_asymmetry_hold_for_other_sets_of_a_thousand_draws(alpha, mean, low, high):
    """"about 0.05 at alpha = 0.1, 0.15 at 0.25, 0.38 at 0.5", "the middle 90% runs from 0.21 to
    0.57 at alpha = 0.5", "For independent matrices the mean is 0.62"; "over 1000, by about one
    [hundredth]": ten other sets of a thousand draws (the chapter prints its own, seeds 0 to 999)."""
    X = tasks.sentence_vectors()[1]
    means = []
    for seed in range(10):
        r = shares(alpha, 1000, 100 + seed, X)
        means.append(r.mean())
        assert abs(r.mean() - mean) < 0.015
        assert np.all(np.abs(np.percentile(r, [5, 95]) - [low, high]) < 0.03)
    assert alpha != 1 or max(means) - min(means) < 0.02


def test_over_twenty_seeds_the_mean_still_moves_by_several_hundredths():
    """"Over 20 seeds, the mean at alpha = 1 still moves by several hundredths"."""
    r = shares(1, 1000, 7, tasks.sentence_vectors()[1]).reshape(50, 20).mean(axis=1)
    assert r.max() - r.min() > 0.05


def test_the_planted_head_is_near_one_over_root_two():
    """"The planted head gives 0.68, close to that value too (0.65 to 0.72 over the hundred draws
    we tried ...; other draws stray a little further)": the range on those hundred draws; on the
    held-out ones (0.62 to 0.72 here) within 0.1 of 1 / sqrt(2)."""
    values = []
    for seed, noise in DRAWS + HELD_OUT:
        W_q, W_k, _, X = planted_head(seed, noise)
        S = X @ W_q @ (X @ W_k).T / np.sqrt(D_HEAD)
        values.append(np.linalg.norm(S - S.T) / (2 * np.linalg.norm(S)))
    tried, held = values[:len(DRAWS)], values[len(DRAWS):]
    assert round(tried[0], 2) == 0.68 and round(min(tried), 2) == 0.65 and round(max(tried), 2) == 0.72
    assert np.abs(np.array(held) - 1 / np.sqrt(2)).max() < 0.1
