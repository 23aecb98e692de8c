"""Maintainers' data: the files that src/mha ships, rebuilt or retrained from scratch.

    make_corpus.py       the command: rebuild the text corpus (CPython's Lib/*.py) in src/mha/text/data/
    corpus_baselines.py  the command: the corpus's baselines (n-grams, compressors) in bits per character
    score_protocols.py   the command: chapter 14's models under every scoring stride, and the nucleus answers
    train_induction.py   the command: retrain chapter 11's small Transformer, and its table over seeds
    seed_sweeps.py       the command: run the chapters' seed sweeps and store their tables
    read_smollm2.py      the command: chapter 16's heads, knock-outs and bits per character of SmolLM2, stored

Run from the repository root: `python -m tools.data.seed_sweeps --help`.
"""
