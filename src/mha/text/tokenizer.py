"""Tokenizers: characters, and byte-level BPE trained with Hugging Face `tokenizers`.

Both have the same face: `fit(text, ...)`, `encode(text) -> np.ndarray` of int64 ids,
`decode(ids) -> str`, `vocab_size`, `count_unknown(text)`, and `to_json()` / `from_json(s)`, so
that a trained model can store the tokenizer it was trained with.
"""

import json
import math

import numpy as np

UNKNOWN_CHARACTER = "\ufffd"  # what `CharTokenizer.decode` writes for the unknown id


def bits_per_character(total_nats, n_characters):
    """Bits per character of a text whose tokens cost `total_nats` in all: nats / n / ln 2."""
    if isinstance(total_nats, bool) or not isinstance(total_nats, (int, float, np.integer, np.floating)):
        raise TypeError(f"total_nats must be a number, got {type(total_nats).__name__}")
    if isinstance(n_characters, bool) or not isinstance(n_characters, (int, np.integer)):
        raise TypeError(f"n_characters must be an int, got {type(n_characters).__name__}")
    if n_characters <= 0:
        raise ValueError(f"n_characters must be positive, got {n_characters}")
    if not math.isfinite(total_nats) or total_nats < 0:
        raise ValueError(f"total_nats must be finite and >= 0, got {total_nats}")
    return float(total_nats) / int(n_characters) / math.log(2)


def _require_str(text, name="text"):
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")


def _code_points(text):
    """The Unicode code points of a text, as an array of shape (len(text),)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (n,)


def _as_ids(ids, vocab_size):
    """Token ids as a 1-D int64 array, each in [0, vocab_size)."""
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(f"ids must be a 1-D sequence, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"ids must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    bad = (array < 0) | (array >= vocab_size)
    if bad.any():
        raise ValueError(f"ids must lie in [0, {vocab_size}), got {int(array[bad][0])}")
    return array


class CharTokenizer:
    """One id per character. Id 0 is the unknown id; the training text's sorted characters are 1..n.

    `vocab_size` is n + 1. A character the training text never had is encoded as 0 (and counted
    by `count_unknown`), and decoded as U+FFFD. The round trip is exact on any text made of known
    characters.
    """

    UNKNOWN_ID = 0

    def __init__(self, characters):
        _require_str(characters, "characters")
        if list(characters) != sorted(set(characters)):
            raise ValueError("characters must be sorted and distinct")
        self.characters = characters
        self._code_points = _code_points(characters)  # (n,), sorted
        self._chars = np.array([UNKNOWN_CHARACTER, *characters])  # (n + 1,): id -> character

    @classmethod
    def fit(cls, text):
        """The tokenizer whose vocabulary is the sorted distinct characters of `text`."""
        _require_str(text)
        if not text:
            raise ValueError("cannot fit a tokenizer on an empty text")
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self):
        return len(self.characters) + 1

    def _lookup(self, text):
        """Each character's position in the vocabulary, and whether it is known: two (len(text),) arrays."""
        points = _code_points(text)
        where = np.searchsorted(self._code_points, points)
        where = np.minimum(where, len(self._code_points) - 1)
        return where, self._code_points[where] == points

    def encode(self, text):
        """The ids of the characters of `text`: an int64 array of shape (len(text),)."""
        _require_str(text)
        where, known = self._lookup(text)
        return np.where(known, where + 1, self.UNKNOWN_ID).astype(np.int64)

    def decode(self, ids):
        """The text of a sequence of ids (the unknown id becomes U+FFFD)."""
        return "".join(self._chars[_as_ids(ids, self.vocab_size)].tolist())

    def count_unknown(self, text):
        """How many characters of `text` the vocabulary lacks."""
        _require_str(text)
        return int((~self._lookup(text)[1]).sum())

    def to_json(self):
        return json.dumps({"type": "char", "characters": self.characters, "unknown_id": self.UNKNOWN_ID})

    @classmethod
    def from_json(cls, data):
        """The tokenizer that `to_json` wrote."""
        _require_str(data, "data")
        stored = json.loads(data)
        if stored.get("type") != "char":
            raise ValueError(f"expected a CharTokenizer's JSON (type 'char'), got type {stored.get('type')!r}")
        return cls(stored["characters"])

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def train_bpe(text, vocab_size, min_frequency=2):
    """A byte-level BPE tokenizer (Hugging Face `tokenizers`) trained on `text`.

    The pre-tokenizer and the decoder are ByteLevel (the 256 byte symbols are always in the
    vocabulary, so every text encodes and decodes exactly), no prefix space is added, and there
    are no special tokens. The trainer merges the most frequent pair until `vocab_size` tokens,
    keeping only pairs seen at least `min_frequency` times. Training is deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    _require_str(text)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet):
        raise ValueError(f"vocab_size must be at least {len(alphabet)} (the byte alphabet), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=alphabet, special_tokens=[])
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


class BPETokenizer:
    """A thin wrapper of a byte-level `tokenizers.Tokenizer` with CharTokenizer's face."""

    def __init__(self, tokenizer):
        from tokenizers import Tokenizer

        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer

    @classmethod
    def fit(cls, text, vocab_size, min_frequency=2):
        """Train a byte-level BPE on `text` (see `train_bpe`) and wrap it."""
        return cls(train_bpe(text, vocab_size, min_frequency=min_frequency))

    @property
    def vocab_size(self):
        return self.tokenizer.get_vocab_size()

    def encode(self, text):
        """The token ids of `text`: an int64 array of shape (number of tokens,)."""
        _require_str(text)
        return np.array(self.tokenizer.encode(text).ids, dtype=np.int64)

    def decode(self, ids):
        """The text of a sequence of token ids (exact for the ids of `encode`)."""
        return self.tokenizer.decode(_as_ids(ids, self.vocab_size).tolist(), skip_special_tokens=False)

    def count_unknown(self, text):
        """Always 0: byte-level BPE has a token for every byte."""
        _require_str(text)
        return 0

    def to_json(self):
        return self.tokenizer.to_str()

    @classmethod
    def from_json(cls, data):
        """The tokenizer that `to_json` wrote."""
        from tokenizers import Tokenizer

        _require_str(data, "data")
        return cls(Tokenizer.from_str(data))

    def __repr__(self):
        return f"BPETokenizer(vocab_size={self.vocab_size})"
