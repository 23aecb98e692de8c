"""mha.text: a real text corpus, its tokenizers, and the references a language model must beat.

- `corpus`: CPython 3.11.7's Lib/*.py (168 files, 4.7 M characters, PSF license), shipped as
  one archive; `load_files()`, `split_files()` (by file, families kept together) and
  `load_splits()` (test and validation texts of exactly 200 000 characters each).
- `tokenizer`: `CharTokenizer` (one id per character, id 0 unknown) and `BPETokenizer` /
  `train_bpe` (byte-level BPE with Hugging Face `tokenizers`); `bits_per_character`.
- `baselines`: compressors at their strongest settings (gzip, bzip2, xz, zstd), unigram,
  bigram and uniform models, in bits per character; the stored table `data/baselines.json`.

This package uses NumPy and the standard library (and `tokenizers`, `zstandard` where asked);
it imports neither face.
"""

from .corpus import TEST_CHARS, VALIDATION_CHARS, load_files, load_splits, split_files
from .tokenizer import BPETokenizer, CharTokenizer, bits_per_character, train_bpe

__all__ = [
    "TEST_CHARS", "VALIDATION_CHARS", "load_files", "load_splits", "split_files",
    "BPETokenizer", "CharTokenizer", "bits_per_character", "train_bpe",
]
