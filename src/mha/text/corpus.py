"""The corpus: CPython 3.11.7's standard library (Lib/*.py), split by file into train, validation, test.

The 168 files ship in one archive, `data/cpython-3.11.7-Lib.tar.xz`, with the PSF license beside
it (`data/SOURCE.md` says where they come from). `tools/data/make_corpus.py` rebuilds the archive.

The split is by file, never inside a file, so that no function is half in the training text and
half in the test text. Files that repeat each other's lines (a C module's pure-Python twin, the
audio-file readers, the path modules, the compressors) form a family, and a family stays in one
split: otherwise a model could "predict" the test text by remembering its twin.
"""

import functools
import hashlib
import tarfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
ARCHIVE = DATA / "cpython-3.11.7-Lib.tar.xz"
MEMBER_PREFIX = "Lib/"

TEST_CHARS = 200_000
VALIDATION_CHARS = 200_000
# A family larger than this goes to train: one big file would otherwise fill a held-out split
# alone (and most of it would be cut away).
MAX_HELD_OUT_FAMILY_CHARS = 60_000

# Files that share many lines, kept in one split. The first six were found by measuring (see
# `shared_line_pairs`: every pair sharing at least 8 non-trivial lines, and at least 12% of the
# smaller file's, is inside one family; tests/test_text.py re-measures it). The others are
# modules that stand for each other: `decimal` imports `_pydecimal` when the C version is
# missing, `io` re-exports what `_pyio` implements, the path modules build on `genericpath`,
# and the three `sre_*` files are the same three-line deprecation shim.
FAMILIES = (
    ("aifc.py", "chunk.py", "sunau.py", "wave.py"),
    ("_compression.py", "bz2.py", "gzip.py", "lzma.py"),
    ("cProfile.py", "profile.py"),
    ("_py_abc.py", "abc.py"),
    ("imghdr.py", "sndhdr.py"),
    ("_weakrefset.py", "weakref.py"),
    ("genericpath.py", "ntpath.py", "posixpath.py"),
    ("_pydecimal.py", "decimal.py"),
    ("_pyio.py", "io.py"),
    ("sre_compile.py", "sre_constants.py", "sre_parse.py"),
)

# What counts as a non-trivial line when files are compared: stripped, not a comment, and at
# least this long (shorter lines, such as `return None` or `else:`, are shared by every file).
MIN_LINE_CHARS = 20
FAMILY_MIN_SHARED_LINES = 8
FAMILY_MIN_SHARED_FRACTION = 0.12


@functools.cache
def load_files():
    """Every file of the corpus: {file name: text}, sorted by name (168 files, 4 698 280 characters)."""
    files = {}
    with tarfile.open(ARCHIVE, mode="r:xz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(MEMBER_PREFIX):
                raise ValueError(f"unexpected member {member.name!r} in {ARCHIVE.name}")
            data = tar.extractfile(member).read()
            files[member.name.removeprefix(MEMBER_PREFIX)] = data.decode("utf-8")
    return dict(sorted(files.items()))


def families():
    """Each file's family: {file name: tuple of the names in its family} (a lone file: itself)."""
    family_of = {name: (name,) for name in load_files()}
    for family in FAMILIES:
        for name in family:
            if name not in family_of:
                raise ValueError(f"family member {name!r} is not a file of the corpus")
            family_of[name] = family
    return family_of


def family_order_key(family):
    """A fixed pseudo-random rank for a family: the SHA-256 of its first name."""
    return hashlib.sha256(family[0].encode("utf-8")).hexdigest()


@functools.cache
def _split_files():
    files = load_files()
    units = sorted(set(families().values()), key=family_order_key)
    split = {"train": [], "validation": [], "test": []}
    held_out_chars = {"test": 0, "validation": 0}
    wanted = {"test": TEST_CHARS, "validation": VALIDATION_CHARS}
    for family in units:
        size = sum(len(files[name]) for name in family)
        target = "train"
        if size <= MAX_HELD_OUT_FAMILY_CHARS:
            target = next((s for s in ("test", "validation") if held_out_chars[s] < wanted[s]), "train")
        if target != "train":
            held_out_chars[target] += size
        split[target].extend(family)
    return {name: tuple(sorted(names)) for name, names in split.items()}


def split_files():
    """The files of each split, by name: {"train": [...], "validation": [...], "test": [...]}.

    Families (in the order of `family_order_key`) fill the test split until it holds at least
    TEST_CHARS characters, then the validation split until VALIDATION_CHARS; families larger
    than MAX_HELD_OUT_FAMILY_CHARS, and all the rest, go to train. Each list is sorted by name.
    """
    return {name: list(names) for name, names in _split_files().items()}


@functools.cache
def _load_splits():
    files, names = load_files(), _split_files()
    joined = {split: "".join(files[name] for name in names[split]) for split in names}
    for split, size in (("test", TEST_CHARS), ("validation", VALIDATION_CHARS)):
        if len(joined[split]) < size:
            raise ValueError(f"the {split} files hold {len(joined[split])} characters, fewer than {size}")
        joined[split] = joined[split][:size]
    return joined


def load_splits():
    """The three texts: {"train": str, "validation": str, "test": str}.

    Each is its split's files joined in name order (every file ends with a newline). The test
    text is cut to exactly TEST_CHARS characters and the validation text to VALIDATION_CHARS
    (the end of the last file is dropped, never moved to train); train is the rest, whole.
    """
    return dict(_load_splits())


def non_trivial_lines(text):
    """The set of a text's lines that say something: stripped, not comments, >= MIN_LINE_CHARS long."""
    stripped = (line.strip() for line in text.splitlines())
    return {line for line in stripped if len(line) >= MIN_LINE_CHARS and not line.startswith("#")}


def shared_line_pairs(min_shared=FAMILY_MIN_SHARED_LINES, min_fraction=FAMILY_MIN_SHARED_FRACTION):
    """Pairs of files that share many non-trivial lines: [(name_a, name_b, shared, fraction)].

    `fraction` is the number of shared lines over the smaller file's count of non-trivial lines;
    a pair is listed when shared >= min_shared and fraction >= min_fraction.
    """
    lines = {name: non_trivial_lines(text) for name, text in load_files().items()}
    names, pairs = sorted(lines), []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = len(lines[a] & lines[b])
            smaller = min(len(lines[a]), len(lines[b]))
            if shared >= min_shared and smaller and shared / smaller >= min_fraction:
                pairs.append((a, b, shared, shared / smaller))
    return pairs


def fraction_seen_in(text, reference_lines):
    """The fraction of `text`'s non-trivial lines that also occur in `reference_lines` (0 if none)."""
    lines = non_trivial_lines(text)
    return len(lines & reference_lines) / len(lines) if lines else 0.0
