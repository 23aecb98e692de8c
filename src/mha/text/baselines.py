"""What a language model of the corpus must beat, in bits per character of the test text.

- Compressors at their strongest documented settings, from Python's own modules and the pinned
  `zstandard` package (so the figures do not depend on the machine's command-line tools): gzip level 9,
  bzip2 level 9; xz preset 9 | PRESET_EXTREME (`-9e`, a 64 MiB dictionary, more than the whole corpus)
  with the literal and position options that xz's manual suggests for text, the best of lc = 2, 3, 4 and
  pb = 0, 1, 2 (lp = 0; `--lzma2=preset=9e,lc=4,pb=0` and its neighbours); zstd level 22 (`--ultra -22`)
  with a window over the whole input and long-distance matching (`--long`). Each is measured on the test
  text alone, and given the training text first: size(train + test) - size(train), the fair match for a
  model that learned from the training text. One more row given the training text: zstd with a
  dictionary trained on the training files (`zstd --train`, its default size of 112 640 bytes).
- Counting models fitted on the training text: uniform, unigram and bigram, add-one smoothed.

Sizes count every byte the compressor writes (headers included; a trained dictionary, like the training
text, is not counted); texts are encoded as UTF-8 and the bits are divided by the number of characters.
`tools/data/corpus_baselines.py` stores the whole table in `data/baselines.json`, since xz's settings,
zstd at its strongest and the dictionary take minutes on 4.3 M characters.
"""

import bz2
import gzip
import json
import lzma
import math
import zlib

import numpy as np

from .corpus import DATA
from .tokenizer import CharTokenizer, _require_str

METHODS = ("gzip", "bzip2", "xz", "zstd")
STORED_TABLE = DATA / "baselines.json"
ZSTD_LEVEL = 22
XZ_SETTINGS = tuple({"lc": lc, "lp": 0, "pb": pb} for lc in (2, 3, 4) for pb in (0, 1, 2))
XZ_TEXT = {"lc": 4, "lp": 0, "pb": 0}  # xz's manual, for text: --lzma2=preset=9e,lc=4,pb=0
ZSTD_DICTIONARY_SIZE = 112_640  # zstd --train's default (--maxdict)


def _zstd_compress(data, dictionary=None):
    """zstd at level 22, its window large enough to reach back over all of `data`, with long-distance matching."""
    import zstandard

    window_log = max(zstandard.WINDOWLOG_MIN, math.ceil(math.log2(max(len(data), 2))))
    params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, source_size=len(data),
                                                            window_log=window_log, enable_ldm=True)
    return zstandard.ZstdCompressor(compression_params=params, dict_data=dictionary).compress(data)


def _xz_compress(data, setting=None):
    """xz -9e with the lc, lp, pb of `setting` (default XZ_TEXT)."""
    lzma2 = {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, **(setting or XZ_TEXT)}
    return lzma.compress(data, format=lzma.FORMAT_XZ, filters=[lzma2])


_COMPRESSORS = {
    "gzip": lambda data, setting=None: gzip.compress(data, compresslevel=9, mtime=0),
    "bzip2": lambda data, setting=None: bz2.compress(data, compresslevel=9),
    "xz": _xz_compress,
    "zstd": lambda data, setting=None: _zstd_compress(data),
}


def compressed_bits(text, method, setting=None):
    """The size in bits of `text` (UTF-8) compressed by `method`, one of METHODS, at its strongest
    (for xz, `setting` picks lc, lp, pb: one of XZ_SETTINGS; default XZ_TEXT)."""
    _require_str(text)
    if method not in _COMPRESSORS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return 8 * len(_COMPRESSORS[method](text.encode("utf-8"), setting))


def zstd_dictionary(train_files):
    """A zstd dictionary of ZSTD_DICTIONARY_SIZE bytes trained on the training files (a list of texts)."""
    import zstandard

    return zstandard.train_dictionary(ZSTD_DICTIONARY_SIZE, [text.encode("utf-8") for text in train_files],
                                      level=ZSTD_LEVEL, threads=1)


def zstd_dictionary_bits(test, dictionary):
    """The size in bits of `test` compressed by zstd at level 22 with a trained dictionary."""
    return 8 * len(_zstd_compress(test.encode("utf-8"), dictionary))


def compressor_bpc(test, method, train=None):
    """Bits per character of `test` under a compressor; given `train`, the extra bits that `test` costs.

    Alone: compressed_bits(test) / len(test). With train:
    (compressed_bits(train + test) - compressed_bits(train)) / len(test).
    """
    _require_str(test, "test")
    if not test:
        raise ValueError("test must not be empty")
    if train is None:
        return compressed_bits(test, method) / len(test)
    _require_str(train, "train")
    extra = compressed_bits(train + test, method) - compressed_bits(train, method)
    return extra / len(test)


def uniform_bpc(vocab_size):
    """Bits per character when every one of `vocab_size` symbols is equally likely: log2(V)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    return math.log2(vocab_size)


def _ids(train, test):
    """Both texts as character ids over the training vocabulary plus unknown (id 0), and its size V."""
    _require_str(train, "train")
    _require_str(test, "test")
    if not train or not test:
        raise ValueError(f"train and test must not be empty, got {len(train)} and {len(test)} characters")
    tokenizer = CharTokenizer.fit(train)
    return tokenizer.encode(train), tokenizer.encode(test), tokenizer.vocab_size


def _unigram_log2_probs(train_ids, vocab_size):
    """log2 p(c) = log2((n_c + 1) / (N + V)) for each of the V ids: shape (V,)."""
    counts = np.bincount(train_ids, minlength=vocab_size)  # (V,)
    return np.log2(counts + 1.0) - np.log2(len(train_ids) + vocab_size)


def unigram_bpc(train, test):
    """Bits per character of `test` under add-one smoothed character frequencies of `train`.

    The V symbols are the training text's distinct characters plus one unknown, which stands for
    every character that the training text lacks. With n_c the count of c in the N training
    characters, p(c) = (n_c + 1) / (N + V), and the figure is -sum over test of log2 p(c) / len(test).
    """
    return unigram_bits(train, test) / len(test)


def unigram_bits(train, test):
    """The total bits of `test` under `unigram_bpc`'s model: -sum of log2 p(c)."""
    train_ids, test_ids, vocab_size = _ids(train, test)
    log2_p = _unigram_log2_probs(train_ids, vocab_size)
    return float(-log2_p[test_ids].sum())


def bigram_bpc(train, test):
    """Bits per character of `test` under an add-one smoothed bigram model of `train`.

    Over the same V symbols as `unigram_bpc`: with n_ab the number of times b follows a in train
    and n_a = sum over b of n_ab, p(b | a) = (n_ab + 1) / (n_a + V). The first test character,
    which has no predecessor, is scored by the unigram model.
    """
    return bigram_bits(train, test) / len(test)


def bigram_bits(train, test):
    """The total bits of `test` under `bigram_bpc`'s model: -sum of log2 p(b | a)."""
    train_ids, test_ids, vocab_size = _ids(train, test)
    pair_counts = np.bincount(train_ids[:-1] * vocab_size + train_ids[1:], minlength=vocab_size ** 2)
    pair_counts = pair_counts.reshape(vocab_size, vocab_size)  # (V previous, V next)
    log2_p = np.log2(pair_counts + 1.0) - np.log2(pair_counts.sum(axis=1, keepdims=True) + vocab_size)
    first = _unigram_log2_probs(train_ids, vocab_size)[test_ids[0]]
    rest = log2_p[test_ids[:-1], test_ids[1:]].sum()
    return float(-(first + rest))


def library_versions():
    """The versions of the compression libraries behind the figures (the bytes depend on them)."""
    import zstandard

    return {"zlib": zlib.ZLIB_RUNTIME_VERSION, "zstandard": zstandard.__version__,
            "zstd": ".".join(map(str, zstandard.ZSTD_VERSION))}


def reference_table(splits, train_files=None):
    """Every reference on splits["test"]: a list of {"name", "method", "train", "bits", "bpc"} (xz's rows add
    "setting", the best of XZ_SETTINGS). With `train_files` (the training split's texts, one per file), one
    more row: zstd with a dictionary trained on them.

    `bits` is the total (compressed size, or -log2 of the probability, for the whole test text),
    `bpc` is bits / len(test). "train" says whether the training text was given first; the uniform row
    takes only the size of the training text's alphabet from it, and says "alphabet".
    """
    if not isinstance(splits, dict) or not {"train", "test"} <= splits.keys():
        raise TypeError("splits must be a dict with 'train' and 'test' texts, as load_splits() returns")
    train, test = splits["train"], splits["test"]
    n = len(test)

    def row(name, method, given_train, bits, **more):
        return {"name": name, "method": method, "train": given_train, "bits": bits, "bpc": bits / n, **more}

    def best_xz(text, before=""):
        sizes = [(compressed_bits(before + text, "xz", s) - (compressed_bits(before, "xz", s) if before else 0), s)
                 for s in XZ_SETTINGS]
        bits, setting = min(sizes, key=lambda pair: pair[0])
        return bits, {"setting": setting}

    vocab_size = CharTokenizer.fit(train).vocab_size
    rows = [row("uniform", "uniform", "alphabet", n * math.log2(vocab_size)),
            row("unigram (add-one)", "unigram", True, unigram_bits(train, test)),
            row("bigram (add-one)", "bigram", True, bigram_bits(train, test))]
    for method in METHODS:
        if method == "xz":
            bits, more = best_xz(test)
            rows.append(row("xz (test alone)", method, False, bits, **more))
        else:
            rows.append(row(f"{method} (test alone)", method, False, compressed_bits(test, method)))
    for method in METHODS:
        if method == "xz":
            bits, more = best_xz(test, train)
            rows.append(row("xz (after train)", method, True, bits, **more))
        else:
            extra = compressed_bits(train + test, method) - compressed_bits(train, method)
            rows.append(row(f"{method} (after train)", method, True, extra))
    if train_files is not None:
        bits = zstd_dictionary_bits(test, zstd_dictionary(train_files))
        rows.append(row("zstd (dictionary of train)", "zstd", True, bits, dictionary_bytes=ZSTD_DICTIONARY_SIZE))
    return rows


def stored_table():
    """The table that tools/data/corpus_baselines.py stored: {"versions": ..., "rows": [...], ...}."""
    return json.loads(STORED_TABLE.read_text())
