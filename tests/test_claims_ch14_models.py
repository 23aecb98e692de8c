"""Chapter 14's sentences about "this model", its two shipped models (src/mha/text/trained/char and bpe),
asserted on the stored files and on the weights (CONTRIBUTING.md, "Claims hold beyond the case tried"): the
curves, the table of bits per character, the heads, and the Experiment on the nucleus (ex-ch14-nucleus).
The general claims hold on every one of the 5 seeds of the smaller run that tools/data/train_lm.py --preset
seeds trained and stored (seeds.json): it beats gzip and no stronger compressor, and grows no induction head.
(The stored figures, the samples and the tiny run: tests/test_claims_ch14.py.)
"""

import math

import numpy as np
import pytest
import torch

import mha.numpy as mnp
from mha.experiments import writing
from mha.text import baselines, load_splits

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def splits():
    return load_splits()


@pytest.fixture(scope="module")
def char():
    """(model in float64, config, run record, tokenizer) of the shipped character model."""
    return writing.stored_model("char", dtype=torch.float64)


@pytest.fixture(scope="module")
def bpe():
    return writing.stored_model("bpe")


@pytest.fixture(scope="module")
def references():
    """{name: bits per character} of the stored table of references."""
    return {row["name"]: row["bpc"] for row in baselines.stored_table()["rows"]}


@pytest.fixture(scope="module")
def seeds_table():
    return writing.stored_seeds()


COMPRESSORS = ("gzip", "bzip2", "xz", "zstd")


# The Experiment on the nucleus (ex-ch14-nucleus): this model, on the first 4096 characters of the test text -----


def test_the_nucleus_of_this_model_is_as_the_solution_says(char, splits):
    model, _, _, tokenizer = char
    text = splits["test"][:16 * 256 + 1]
    ids = torch.as_tensor(tokenizer.encode(text))
    with torch.no_grad():
        logits = model(ids[:-1].reshape(16, 256)).reshape(-1, tokenizer.vocab_size).numpy()  # (4096, V)
    kept = np.isfinite(mnp.filter_logits(logits, top_p=0.9))  # (4096, V)
    sizes = kept.sum(axis=-1)
    assert np.median(sizes) == 4 and sizes.max() == 49 and 0.24 < np.mean(sizes == 1) < 0.27  # "a quarter"
    before = np.array(list(text[:-1]))
    space, name = before == " ", np.char.isalnum(before) | (before == "_")
    other = ~(space | name | (before == "\n"))
    assert (np.median(sizes[space]), np.median(sizes[name]), np.median(sizes[other])) == (17, 4, 2)
    top_5 = np.sort(mnp.softmax(logits), axis=-1)[:, -5:].sum(axis=-1)
    assert round(100 * np.mean(top_5 < 0.9)) == 41 and round(100 * np.mean(sizes < 5)) == 53
    assert round(100 * kept[np.arange(4096), ids[1:].numpy()].mean()) == 90


# This character model: its curve and its heads ----------------------------------------------------------------


def curve_gaps(record):
    """{validation step: validation loss minus the mean training loss of the 100 steps before it}, and the curve."""
    curve = record["curve"]
    train_losses = np.array([point["train_loss"] for point in curve])
    return {p["step"]: p["val_loss"] - train_losses[p["step"] - 100:p["step"]].mean()
            for p in curve if p["val_loss"] is not None}


def test_this_character_models_curves_part_after_step_400(char):
    """"The two losses run together for the first 400 steps; ... at the end the validation loss is 0.19 nats above";
    the validation loss hardly moved in the last 200 steps."""
    gaps = curve_gaps(char[2])
    assert abs(gaps[400]) < 0.05 and 0.15 < gaps[1600] < 0.25
    checked = [p["val_loss"] for p in char[2]["curve"] if p["val_loss"] is not None]
    assert abs(checked[-3] - checked[-1]) < 0.01


@pytest.fixture(scope="module")
def char_heads(char, splits):
    """(induction summary, previous-token scores (n_layers, h)) of the character model on the repeated snippets."""
    from mha.experiments.induction import previous_token_scores
    model, _, _, tokenizer = char
    summary = writing.induction_summary(model, tokenizer, splits["test"])
    batch = writing.repeated_snippets(tokenizer.encode(splits["test"]))
    with torch.no_grad():
        _, weights = model(batch, return_weights=True)
    return summary, previous_token_scores(weights.numpy(), writing.REPEAT_LENGTH)


def test_this_character_model_has_no_induction_head_and_does_not_use_the_repeat(char, char_heads):
    summary, previous = char_heads
    L = writing.REPEAT_LENGTH
    evenly = np.mean([1 / (t + 1) for t in range(L, 2 * L)])
    assert summary["best_score"] < 0.05 and summary["best_score"] < 2 * evenly  # "hardly above" a head that spreads
    assert summary["repeat_loss"] > summary["first_copy_loss"] - 0.02  # the repeat costs as much as the first copy
    stored = char[2]["results"]
    assert np.abs(np.array(summary["induction_scores"]) - np.array(stored["induction_scores"])).max() < 1e-3


def test_this_character_model_has_previous_token_heads_in_blocks_1_and_4(char_heads):
    """"Head 3 of block 1 puts 0.60 of its weight on the character just before, and head 3 of block 4 puts 0.70"."""
    _, previous = char_heads
    assert np.argmax(previous[0]) == 3 and round(previous[0, 3], 2) == 0.60
    assert np.unravel_index(np.argmax(previous), previous.shape) == (3, 3) and round(previous[3, 3], 2) == 0.70


def test_the_best_induction_head_of_this_model_follows_the_open_parenthesis(char, char_heads):
    """On range(1, ndays + 1) written twice: inside each pair of parentheses most characters put most of their
    weight on the opening parenthesis, and the head never looks at the character after the earlier copy."""
    model, _, _, tokenizer = char
    block, head = char_heads[0]["best_head"]
    snippet = "range(1, ndays + 1)"
    shown = snippet + snippet
    with torch.no_grad():
        _, weights = model(torch.as_tensor(tokenizer.encode(shown)), return_weights=True)
    a = weights[block, head].numpy()  # (T, T)
    L = len(snippet)
    for opening in (snippet.index("("), L + snippet.index("(")):
        inside = range(opening + 1, opening + snippet.index(")") - snippet.index("("))
        assert sum(a[t, opening] > 0.5 for t in inside) > len(inside) / 2
    repeat = np.arange(L, 2 * L)
    assert a[repeat, repeat - L + 1].mean() < 0.1


# The table of bits per character, and the BPE model ---------------------------------------------------------


def test_this_bpe_model_tops_the_table_and_ties_with_xz_after_the_training_text(bpe, references):
    """"This BPE model is the best of the table ... beats even xz given the whole training text, but by less than a
    thousandth of a bit per character"."""
    bpc = bpe[2]["results"]["test_bpc"]
    assert bpc < min(references.values())
    assert 0 < references["xz (after train)"] - bpc < 1e-3


def test_this_character_model_beats_every_compressor_alone_and_bzip2_after_but_not_xz_or_zstd(char, references):
    bpc = char[2]["results"]["test_bpc"]
    for method in COMPRESSORS:
        assert bpc < references[f"{method} (test alone)"], method
    for name in ("uniform", "unigram (add-one)", "bigram (add-one)", "gzip (after train)", "bzip2 (after train)"):
        assert bpc < references[name], name
    assert references["xz (after train)"] < references["zstd (after train)"] < bpc
    assert round(bpc, 4) == 1.7045 and round(references["bzip2 (after train)"], 2) == 1.77


def test_this_bpe_models_curves_part_early_and_far(bpe):
    """"0.37 nats per token apart at step 400, 0.84 at the end"; the character model read its text three times, the
    BPE model more than six."""
    gaps = curve_gaps(bpe[2])
    assert round(gaps[400], 2) == 0.37 and round(gaps[1200], 2) == 0.84


def test_the_bpe_model_copies_a_little(bpe):
    """"Its best head scores 0.06, and the repeat costs it 0.28 nats per token less than the first copy"."""
    results = bpe[2]["results"]
    assert round(results["best_score"], 2) == 0.06
    assert round(results["first_copy_loss"] - results["repeat_loss"], 2) == 0.28


def test_the_models_read_their_training_text_three_and_more_than_six_times(char, bpe, splits):
    for (_, config, _, tokenizer), low, high in ((char, 2.95, 3.15), (bpe, 6.0, 6.5)):
        passes = config.steps * config.batch_size * config.context / len(tokenizer.encode(splits["train"]))
        assert low < passes < high, passes


# The general claims, over the 5 seeds of the smaller run ----------------------------------------------------


def test_on_every_seed_the_smaller_run_beats_gzip_and_no_other_compressor(seeds_table, references):
    """"On every seed it beats gzip, even gzip given the training text, and loses to the three other compressors,
    even on the test text alone"."""
    bpc = np.array([row["test_bpc"] for row in seeds_table["rows"]])
    assert np.all(bpc < references["gzip (after train)"]) and np.all(bpc < references["gzip (test alone)"])
    for method in ("bzip2", "xz", "zstd"):
        assert np.all(bpc > references[f"{method} (test alone)"]), method


def test_on_no_seed_does_an_induction_head_appear_or_the_repeat_get_cheaper(seeds_table):
    """"The best induction score stays below 0.02 on every seed, and the repeat costs as much as the first copy"
    (within 0.01 bits per character)."""
    rows = seeds_table["rows"]
    assert all(row["best_score"] < 0.02 for row in rows)
    assert all(abs(row["first_copy_loss"] - row["repeat_loss"]) / math.log(2) < 0.01 for row in rows)
