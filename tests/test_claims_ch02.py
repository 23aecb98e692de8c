"""Chapter 2's claims over seeds: every sentence about the trained models holds on every stored seed.

The chapter trains seed 0 live and reads two stored sweeps of mha.experiments.tasks
(tools/data/seed_sweeps.py made them under generic kernels): `ch02_previous_token`, symmetric
attention and a query-key head trained on the previous-token task, and `ch02_relations`, the
exercise's three other tasks. One row of each is trained again here and must agree with the
stored one within the sweep's tolerance; the sentences are asserted on the stored rows and on
the sweeps' held-out seeds (`seeds.held_out_rows`, two per sweep, trained here: about 2 s).
The cheap random draws (the random W and R of the chapter and its exercises) are drawn afresh,
10 times each.
"""

import numpy as np
import pytest
import torch

import mha.numpy as mnp
from mha.experiments import seeds, tasks

SWEEP, RELATIONS = "ch02_previous_token", "ch02_relations"

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest


def column(key, name=SWEEP):
    """A value over the table's seeds, then over the sweep's held-out seeds (trained here, never
    stored): every sentence below holds on both."""
    return np.concatenate([seeds.column(name, key), seeds.held_out_column(name, key)])


def test_one_row_of_the_previous_token_sweep_is_rederived_within_the_tolerance():
    stored, fresh, gap = seeds.rederive("ch02_previous_token", 0)  # every seed costs the same: seed 0
    assert gap <= seeds.load(SWEEP)["tolerance"], f"seed 0 re-derived {gap:.4f} away: {stored} vs {fresh}"


def test_one_row_of_the_relations_sweep_is_rederived_within_the_tolerance():
    stored, fresh, gap = seeds.rederive("ch02_relations", 0)
    assert gap <= seeds.load(RELATIONS)["tolerance"], f"seed 0 re-derived {gap:.4f} away: {stored} vs {fresh}"


def test_ten_seeds_are_stored():
    """"the library has run the same experiment for ten seeds"."""
    assert len(seeds.load(SWEEP)["rows"]) == len(seeds.load(RELATIONS)["rows"]) == 10


def test_the_chapters_assert_holds_on_every_seed():
    """`assert losses["separate W_Q and W_K"][-1] < 0.01 < 0.3 < losses["symmetric (one W)"][-1]`."""
    assert column("query_key_last").max() < 0.01 and 0.3 < column("symmetric_last").min()


def test_symmetric_attention_ends_a_little_below_uniform_attention_and_stays_there():
    """"the symmetric model ends a little below uniform attention and stays there"; "symmetric
    attention stays near uniform attention" (the summary)."""
    uniform, last = column("uniform"), column("symmetric_last")
    assert np.all(last < uniform) and np.all(uniform - last < 0.1)
    late = column("symmetric_losses")[:, 10:]  # the mean loss of every 10 steps, after step 100
    assert np.all(late < uniform[:, None]) and np.all(late > 0.3)


def test_the_query_key_head_draws_a_clean_line_below_the_diagonal_on_every_seed():
    """"draws a clean line just below the diagonal: ... and "I", the first word, to "bank"": the
    smallest weight of a word on its predecessor, over the sentence's ten words."""
    assert column("query_key_on_previous_min").min() > 0.95


def test_symmetric_attention_spreads_its_weight_over_itself_and_both_neighbours():
    """"each word spreads its weight over itself and *both* neighbours", on every seed."""
    previous, itself, following = (column(f"symmetric_on_{k}") for k in ("previous", "itself", "next"))
    assert np.all(np.minimum(previous, following) > 0.15) and np.all(itself > 0.15)
    assert np.all(previous + itself + following > 0.6) and np.abs(previous - following).max() < 0.02


def test_the_sums_of_the_scores_on_every_seed():
    """The chapter's asserts: the symmetric sum to the predecessors never beats the sum to
    themselves (the inequality), and the query-key head's does."""
    assert np.all(column("symmetric_scores_to_previous") <= column("symmetric_scores_to_itself"))
    assert np.all(column("query_key_scores_to_previous") > column("query_key_scores_to_itself"))


def test_the_exercises_asserts_and_sentences_hold_on_every_seed():
    """`assert finals[1] < 0.01`; `assert (finals[0] < 0.01) == (relation == "same parity")`;
    "its loss stays far above zero"; "its loss ends closer to uniform attention than to zero"."""
    for task in ("next_token", "same_parity", "both_neighbours"):
        assert column(f"query_key_{task}", RELATIONS).max() < 0.01, task
        symmetric = column(f"symmetric_{task}", RELATIONS)
        assert np.all(symmetric < 0.01) if task == "same_parity" else np.all(symmetric > 0.01), task
    assert column("symmetric_next_token", RELATIONS).min() > 0.3
    closer_to_uniform = column("uniform_both_neighbours", RELATIONS) / 2
    assert np.all(column("symmetric_both_neighbours", RELATIONS) > closer_to_uniform)


def test_the_exercises_tasks_are_the_chapters_batches():
    """The helper with the chapter's matrix `previous` gives the previous-token batches exactly."""
    previous = torch.roll(torch.eye(10), shifts=1, dims=0)
    mine = tasks.relation_batch(previous, 64, 8, torch.Generator().manual_seed(0))
    chapter = tasks.previous_token_batch(64, 10, 8, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(mine, chapter))
    matrices = tasks.relation_matrices(10)
    assert torch.equal(matrices["next_token"], previous.T)
    assert torch.equal(matrices["both_neighbours"], (previous + previous.T) / 2)


def test_random_w_gives_symmetric_scores_and_only_its_size_changes_the_weights():
    """The scores are symmetric for every W; the exercise's assert that W R and reversed columns
    change nothing while 2 W changes a weight by more than 0.1, on 10 draws of W and R."""
    X = tasks.sentence_vectors()[1]
    for seed in range(10):
        W = np.random.default_rng(seed).standard_normal((8, 4)) / np.sqrt(8)
        E = X @ W
        assert np.array_equal(E @ E.T, (E @ E.T).T)
        R, _ = np.linalg.qr(np.random.default_rng(100 + seed).standard_normal((4, 4)))
        _, before = mnp.symmetric_attention(X, W)
        change = {name: np.abs(mnp.symmetric_attention(X, M)[1] - before).max()
                  for name, M in (("W R", W @ R), ("reversed", W[:, ::-1]), ("2 W", 2 * W))}
        assert change["W R"] < 1e-12 and change["reversed"] < 1e-12 < 0.1 < change["2 W"], seed
