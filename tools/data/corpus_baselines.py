"""Measure what a language model of the corpus must beat, and store the table in the package.

    .venv/bin/python -m tools.data.corpus_baselines           # write src/mha/text/data/baselines.json
    .venv/bin/python -m tools.data.corpus_baselines --check   # recompute, compare with the stored table

Every row is on the test split of `mha.text.load_splits()` (200 000 characters), in bits per
character: uniform, unigram and bigram models of the training text, and gzip, bzip2, xz and
zstd at their strongest documented settings (mha.text.baselines), on the test text alone and after
the training text, and zstd with a dictionary trained on the training files. xz's nine settings
and the dictionary take about 6 minutes on one core, which is why the table is stored;
tests/test_text.py recomputes the cheap rows.
"""

import argparse
import json
import sys

from mha.text import TEST_CHARS, load_files, load_splits, split_files
from mha.text import baselines


def measure():
    """The table to store: library versions, sizes, and the rows of `baselines.reference_table`."""
    splits = load_splits()
    files = load_files()
    train_files = [files[name] for name in split_files()["train"]]
    return {"description": "Bits per character of mha.text's test split (tools/data/corpus_baselines.py).",
            "versions": baselines.library_versions(),
            "characters": {name: len(text) for name, text in splits.items()},
            "rows": baselines.reference_table(splits, train_files)}


def print_table(table):
    print(f"{'reference':<24} {'bits per character':>18}")
    for row in table["rows"]:
        print(f"{row['name']:<28} {row['bpc']:>18.4f}  {row.get('setting', '')}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored table")
    args = parser.parse_args(argv)
    table = measure()
    assert table["characters"]["test"] == TEST_CHARS
    print_table(table)
    if args.check:
        same = baselines.stored_table() == json.loads(json.dumps(table))
        print("identical to the stored table" if same else "DIFFERENT from the stored table")
        return 0 if same else 1
    baselines.STORED_TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {baselines.STORED_TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
