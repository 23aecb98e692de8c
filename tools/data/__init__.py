"""Maintainers' data: the files that src/mha ships, rebuilt or retrained from scratch.

    make_corpus.py       the command: rebuild the text corpus (CPython's Lib/*.py) in src/mha/text/data/
    corpus_baselines.py  the command: the corpus's baselines (n-grams, compressors) in bits per character
    train_lm.py          the command: train chapter 14's language models (also under torchrun)
    train_induction.py   the command: retrain chapter 11's small Transformer, and its table over seeds
    seed_sweeps.py       the command: run the chapters' seed sweeps and store their tables

Run from the repository root: `python -m tools.data.seed_sweeps --help`.
"""
