"""mha.text: the shipped corpus, its split by file, the tokenizers, and the reference figures."""

import bz2
import gzip
import hashlib
import json
import lzma
import math
import tarfile
from collections import Counter

import numpy as np
import pytest

from mha.text import (TEST_CHARS, VALIDATION_CHARS, BPETokenizer, CharTokenizer, bits_per_character,
                      load_files, load_splits, split_files, train_bpe)
from mha.text import baselines, corpus

ARCHIVE_SHA256 = "a779da3b6bd40a12b4c0772d5ffa96b8ada134e4c50f046f428ca94739aca541"
N_FILES, N_CHARACTERS = 168, 4_698_280
# The largest share of a held-out file's non-trivial lines that also occur in train. Measured:
# 11.1% (asynchat.py) for test, 13.9% (_bootsubprocess.py) for validation; a file beside its
# near-twin scores far more (wave.py: 72% of its lines are in aifc, sunau and chunk).
MAX_SHARED_WITH_TRAIN = 0.15


# The archive and the files.

def test_the_archive_is_the_stated_bytes_and_holds_exactly_the_168_files():
    data = corpus.ARCHIVE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == ARCHIVE_SHA256
    assert ARCHIVE_SHA256 in (corpus.DATA / "SOURCE.md").read_text()
    with tarfile.open(corpus.ARCHIVE, mode="r:xz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert len(names) == N_FILES and names == sorted(names)
    assert all(n.startswith("Lib/") and n.endswith(".py") and n.count("/") == 1 for n in names)
    assert {(m.isfile(), m.mode, m.uid, m.gid, m.mtime) for m in members} == {(True, 0o644, 0, 0, 1701648000)}


def test_the_license_ships_beside_the_archive():
    license_text = (corpus.DATA / "LICENSE.txt").read_text()
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in license_text
    assert "PSF License Agreement" in (corpus.DATA / "SOURCE.md").read_text()


def test_load_files_reads_every_file_sorted_and_is_cached():
    files = load_files()
    assert len(files) == N_FILES and list(files) == sorted(files)
    assert sum(map(len, files.values())) == N_CHARACTERS
    assert {"_pydecimal.py", "io.py", "ntpath.py", "this.py"} <= files.keys()
    assert files["keyword.py"].startswith('"""Keywords (from "Grammar/python.gram")')
    assert all(text.endswith("\n") for text in files.values())
    assert load_files() is files


# The split.

def test_splits_are_disjoint_cover_every_file_and_are_deterministic():
    split = split_files()
    names = [name for part in ("train", "validation", "test") for name in split[part]]
    assert sorted(names) == sorted(load_files()) and len(set(names)) == len(names)
    assert all(split[part] == sorted(split[part]) for part in split)
    assert split == split_files() and split is not split_files()  # a fresh copy, the same content
    assert len(split["test"]) == 15 and len(split["validation"]) == 8


def test_the_texts_have_the_stated_sizes_and_come_from_their_files():
    files, split, texts = load_files(), split_files(), load_splits()
    assert len(texts["test"]) == TEST_CHARS == 200_000
    assert len(texts["validation"]) == VALIDATION_CHARS == 200_000
    assert texts["train"] == "".join(files[name] for name in split["train"])
    assert len(texts["train"]) == 4_288_110
    for part in ("validation", "test"):
        whole = "".join(files[name] for name in split[part])
        assert whole.startswith(texts[part]) and len(whole) > len(texts[part])


def test_families_stay_in_one_split():
    split_of = {name: part for part, names in split_files().items() for name in names}
    for family in corpus.FAMILIES:
        assert len({split_of[name] for name in family}) == 1, family
    assert split_of["_pydecimal.py"] == split_of["decimal.py"]
    assert split_of["_pyio.py"] == split_of["io.py"]
    assert split_of["ntpath.py"] == split_of["posixpath.py"] == split_of["genericpath.py"]


def test_every_measured_near_duplicate_pair_is_inside_one_family():
    family_of = corpus.families()
    pairs = corpus.shared_line_pairs()
    assert len(pairs) == 13  # measured: aifc/sunau/wave/chunk, bz2/lzma/gzip/_compression, ...
    for a, b, shared, fraction in pairs:
        assert family_of[a] == family_of[b], (a, b, shared, fraction)


def test_held_out_files_share_few_lines_with_train():
    files, split = load_files(), split_files()
    train_lines = set().union(*(corpus.non_trivial_lines(files[name]) for name in split["train"]))
    shares = {name: corpus.fraction_seen_in(files[name], train_lines)
              for name in split["test"] + split["validation"]}
    assert max(shares.values()) <= MAX_SHARED_WITH_TRAIN, max(shares.items(), key=lambda kv: kv[1])
    assert corpus.fraction_seen_in(load_splits()["test"], train_lines) < 0.05  # measured 3.3%
    # The measure does see a near-twin: wave.py against the rest of its family.
    family = set().union(*(corpus.non_trivial_lines(files[n]) for n in ("aifc.py", "sunau.py", "chunk.py")))
    assert corpus.fraction_seen_in(files["wave.py"], family) > 0.5


# Tokenizers.

def test_char_tokenizer_round_trips_and_puts_unknown_at_zero():
    texts = load_splits()
    tokenizer = CharTokenizer.fit(texts["train"])
    assert tokenizer.vocab_size == len(set(texts["train"])) + 1 == 167
    assert tokenizer.UNKNOWN_ID == 0
    ids = tokenizer.encode(texts["test"])
    assert ids.dtype == np.int64 and ids.shape == (TEST_CHARS,)
    assert ids.min() >= 1 and ids.max() < tokenizer.vocab_size
    assert tokenizer.decode(ids) == texts["test"] and tokenizer.decode(list(ids)) == texts["test"]
    assert tokenizer.count_unknown(texts["test"]) == 0
    assert tokenizer.encode("\n")[0] == 1 + sorted(set(texts["train"])).index("\n")


def test_char_tokenizer_on_unknown_characters():
    tokenizer = CharTokenizer.fit("abca")
    assert tokenizer.characters == "abc" and tokenizer.vocab_size == 4
    assert tokenizer.encode("cabz€").tolist() == [3, 1, 2, 0, 0]
    assert tokenizer.count_unknown("cabz€") == 2 and tokenizer.count_unknown("") == 0
    assert tokenizer.decode([3, 0, 1]) == "c\ufffda"
    assert tokenizer.encode("").shape == (0,) and tokenizer.decode([]) == ""


def test_char_tokenizer_survives_json():
    tokenizer = CharTokenizer.fit("héllo, wörld 😀\n\t")
    again = CharTokenizer.from_json(tokenizer.to_json())
    assert again.characters == tokenizer.characters and again.vocab_size == tokenizer.vocab_size
    assert again.decode(tokenizer.encode("wörld 😀")) == "wörld 😀"


@pytest.fixture(scope="module")
def small_bpe():
    return train_bpe(load_splits()["train"][:400_000], vocab_size=600)


def test_bpe_is_byte_level_deterministic_and_round_trips(small_bpe):
    again = train_bpe(load_splits()["train"][:400_000], vocab_size=600)
    assert again.to_str() == small_bpe.to_str()
    wrapped = BPETokenizer(small_bpe)
    assert wrapped.vocab_size == 600
    test = load_splits()["test"]
    ids = wrapped.encode(test)
    assert ids.dtype == np.int64 and wrapped.decode(ids) == test
    assert len(test) / len(ids) > 1.8  # merges shorten the text (measured 2.1 characters per token)
    odd = "  tabs\tand\r\nCRLF, ünïcödé, 漢字, 😀 and trailing spaces   "
    assert wrapped.decode(wrapped.encode(odd)) == odd and wrapped.count_unknown(odd) == 0


def test_bpe_wrapper_survives_json(small_bpe):
    wrapped = BPETokenizer(small_bpe)
    again = BPETokenizer.from_json(wrapped.to_json())
    text = load_splits()["validation"][:5000]
    assert np.array_equal(again.encode(text), wrapped.encode(text))
    fitted = BPETokenizer.fit("abababab cdcdcd " * 50, vocab_size=260)
    assert fitted.vocab_size == 260 and fitted.decode(fitted.encode("abcd dcba")) == "abcd dcba"


# Bits per character, by hand.

def test_bits_per_character_converts_nats():
    assert bits_per_character(1000 * math.log(2), 1000) == pytest.approx(1.0, abs=1e-15)
    assert bits_per_character(0.0, 5) == 0.0
    assert bits_per_character(np.float32(3 * math.log(4)), 3) == pytest.approx(2.0, rel=1e-7)


def test_uniform_bpc_is_log2_of_the_vocabulary():
    assert baselines.uniform_bpc(2) == 1.0 and baselines.uniform_bpc(1) == 0.0
    assert baselines.uniform_bpc(256) == 8.0


def test_unigram_and_bigram_on_one_repeated_character():
    # V = 2 (a, unknown). Unigram: p(a) = (4 + 1) / (4 + 2). Bigram: n_aa = 3, p(a | a) = (3 + 1) / (3 + 2).
    assert baselines.unigram_bpc("aaaa", "aaa") == pytest.approx(-math.log2(5 / 6), abs=1e-15)
    expected = (-math.log2(5 / 6) - 2 * math.log2(4 / 5)) / 3
    assert baselines.bigram_bpc("aaaa", "aaa") == pytest.approx(expected, abs=1e-15)


def test_unigram_and_bigram_on_a_two_letter_alphabet():
    # train "aab": V = 3; p(a) = 3/6, p(b) = 2/6, p(unknown) = 1/6.
    assert baselines.unigram_bpc("aab", "abz") == pytest.approx((1 + math.log2(3) + math.log2(6)) / 3)
    # Bigram: n_aa = 1, n_ab = 1, n_a = 2: p(b | a) = (1 + 1) / (2 + 3); the first "a" by the unigram, 1/2.
    assert baselines.bigram_bpc("aab", "ab") == pytest.approx((1 - math.log2(2 / 5)) / 2)


def test_bigram_matches_counting_by_hand_on_a_random_text():
    rng = np.random.default_rng(0)
    train = "".join(rng.choice(list("abcde"), size=3000, p=[0.4, 0.3, 0.15, 0.1, 0.05]))
    test = "".join(rng.choice(list("abcdef"), size=500))
    vocab = sorted(set(train)) + ["?"]
    tokens = lambda text: [c if c in train else "?" for c in text]  # noqa: E731
    pairs, starts, units = Counter(zip(train, train[1:])), Counter(train[:-1]), Counter(train)
    t = tokens(test)
    bits = -math.log2((units[t[0]] + 1) / (len(train) + len(vocab)))
    bits -= sum(math.log2((pairs[a, b] + 1) / (starts[a] + len(vocab))) for a, b in zip(t, t[1:]))
    assert baselines.bigram_bpc(train, test) == pytest.approx(bits / len(test), rel=1e-12)


# Compressors.

def test_compressed_bits_are_the_sizes_of_real_streams():
    text = load_splits()["test"][:20_000]
    data = text.encode("utf-8")
    assert baselines.compressed_bits(text, "gzip") == 8 * len(gzip.compress(data, 9, mtime=0))
    assert gzip.decompress(gzip.compress(data, 9, mtime=0)) == data
    assert baselines.compressed_bits(text, "bzip2") == 8 * len(bz2.compress(data, 9))
    assert lzma.decompress(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) == data
    for method in baselines.METHODS:
        assert baselines.compressed_bits(text, method) == baselines.compressed_bits(text, method)
        assert baselines.compressor_bpc(text, method) < 3.0


def test_training_text_helps_only_a_compressor_that_can_reach_back_to_it():
    rng = np.random.default_rng(1)
    train = "".join(rng.choice(list("abcdefghijklmnop"), size=300_000))  # 4 bits per character
    test = train[:20_000]  # 300 000 characters back: beyond gzip's 32 KiB window
    assert baselines.compressor_bpc(test, "gzip", train) > 3.5
    for method in ("xz", "zstd"):
        assert baselines.compressor_bpc(test, method, train) < 0.05, method


# The stored table.

@pytest.fixture(scope="module")
def stored():
    return baselines.stored_table()


def same_libraries(stored):
    return stored["versions"] == baselines.library_versions()


def test_stored_table_has_every_row_and_the_sizes(stored):
    names = [row["name"] for row in stored["rows"]]
    expected = ["uniform", "unigram (add-one)", "bigram (add-one)"]
    expected += [f"{m} (test alone)" for m in baselines.METHODS] + [f"{m} (after train)" for m in baselines.METHODS]
    assert names == expected + ["zstd (dictionary of train)"]
    xz_rows = [row for row in stored["rows"] if row["method"] == "xz"]
    assert all(row["setting"] in baselines.XZ_SETTINGS for row in xz_rows)  # the best of xz's settings for text
    assert stored["characters"] == {name: len(text) for name, text in load_splits().items()}
    assert all(row["bpc"] == row["bits"] / TEST_CHARS for row in stored["rows"])


def test_stored_table_orders_the_references(stored):
    bpc = {row["name"]: row["bpc"] for row in stored["rows"]}
    assert bpc["uniform"] > bpc["unigram (add-one)"] > bpc["bigram (add-one)"] > bpc["gzip (test alone)"]
    for method in baselines.METHODS:
        assert bpc[f"{method} (after train)"] < bpc[f"{method} (test alone)"], method
    assert bpc["xz (after train)"] < 1.6 and bpc["gzip (after train)"] > 2.0  # measured 1.577, 2.115


def test_stored_table_equals_the_cheap_rows_recomputed(stored):
    texts = load_splits()
    train, test = texts["train"], texts["test"]
    rows = {row["name"]: row for row in stored["rows"]}
    assert rows["uniform"]["bpc"] == pytest.approx(math.log2(CharTokenizer.fit(train).vocab_size), rel=1e-15)
    assert rows["unigram (add-one)"]["bpc"] == baselines.unigram_bpc(train, test)
    assert rows["bigram (add-one)"]["bpc"] == baselines.bigram_bpc(train, test)
    recomputed = {f"{m} (test alone)": baselines.compressed_bits(test, m, rows[f"{m} (test alone)"].get("setting"))
                  for m in baselines.METHODS}
    recomputed["gzip (after train)"] = (baselines.compressed_bits(train + test, "gzip")
                                        - baselines.compressed_bits(train, "gzip"))
    for name, bits in recomputed.items():
        if same_libraries(stored):
            assert rows[name]["bits"] == bits, name  # compressors are deterministic for one version
        else:
            assert rows[name]["bits"] == pytest.approx(bits, rel=0.02), name


def test_the_stored_xz_row_alone_is_the_best_of_xzs_settings_for_text(stored):
    """The test text alone under each of XZ_SETTINGS (0.3 s each): the stored row is the smallest."""
    test = load_splits()["test"]
    row = {row["name"]: row for row in stored["rows"]}["xz (test alone)"]
    sizes = {tuple(sorted(s.items())): baselines.compressed_bits(test, "xz", s) for s in baselines.XZ_SETTINGS}
    assert min(sizes.values()) == sizes[tuple(sorted(row["setting"].items()))]
    if same_libraries(stored):
        assert row["bits"] == min(sizes.values())


# The issue's figures, on 200 000 characters of the standard library: gzip 1.91, bzip2 1.68, xz 1.70.
# Measured here: the test split gives 2.132, 1.912, 1.905 (its small files, e.g. token.py and
# opcode.py, are harder); the validation split 1.931, 1.719, 1.736; 200 000-character windows of the
# whole library range from 1.74 to 2.13 under gzip.
SCALE = {"gzip": 1.91, "bzip2": 1.68, "xz": 1.70}


@pytest.mark.parametrize("part,tolerance", [("test", 0.15), ("validation", 0.04)])
def test_compressors_alone_land_near_the_issues_scale(part, tolerance):
    text = load_splits()[part]
    for method, figure in SCALE.items():
        assert baselines.compressor_bpc(text, method) == pytest.approx(figure, rel=tolerance), method


# Bad input.

@pytest.mark.parametrize("call,error,words", [
    (lambda: CharTokenizer.fit(""), ValueError, "empty"),
    (lambda: CharTokenizer.fit(b"abc"), TypeError, "bytes"),
    (lambda: CharTokenizer("ba"), ValueError, "sorted"),
    (lambda: CharTokenizer.fit("ab").decode([3]), ValueError, "[0, 3), got 3"),
    (lambda: CharTokenizer.fit("ab").decode([-1]), ValueError, "got -1"),
    (lambda: CharTokenizer.fit("ab").decode([[1]]), ValueError, "1-D"),
    (lambda: CharTokenizer.fit("ab").decode([1.0]), TypeError, "float64"),
    (lambda: CharTokenizer.fit("ab").encode(None), TypeError, "NoneType"),
    (lambda: CharTokenizer.from_json(json.dumps({"type": "bpe"})), ValueError, "'bpe'"),
    (lambda: train_bpe("abc", 100), ValueError, "at least 256"),
    (lambda: train_bpe("abc", 300.0), TypeError, "float"),
    (lambda: BPETokenizer("not a tokenizer"), TypeError, "str"),
    (lambda: bits_per_character(1.0, 0), ValueError, "got 0"),
    (lambda: bits_per_character(-1.0, 10), ValueError, "got -1.0"),
    (lambda: bits_per_character(float("nan"), 10), ValueError, "nan"),
    (lambda: bits_per_character("1", 10), TypeError, "str"),
    (lambda: bits_per_character(1.0, 2.5), TypeError, "float"),
    (lambda: baselines.compressed_bits("abc", "lz4"), ValueError, "'lz4'"),
    (lambda: baselines.compressed_bits(b"abc", "gzip"), TypeError, "bytes"),
    (lambda: baselines.compressor_bpc("", "gzip"), ValueError, "empty"),
    (lambda: baselines.uniform_bpc(0), ValueError, "got 0"),
    (lambda: baselines.unigram_bpc("", "a"), ValueError, "0 and 1"),
    (lambda: baselines.reference_table("text"), TypeError, "load_splits"),
])
def test_bad_input_is_refused_with_a_clear_message(call, error, words):
    with pytest.raises(error) as raised:
        call()
    assert words in str(raised.value)
