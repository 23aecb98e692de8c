"""The benchmark tables of the last deliberate run, stored with the library.

`python -m benchmarks --save src/mha/benchmark_results` writes them (one JSON and
one CSV file per table); chapters 8, 12, 16, 17 and 18 read them with `load` and print them with `show`. Shipping them
inside the package lets the chapter run wherever `mha` is installed, Colab included,
and keeps its pages the same from one build to the next.
"""

import json
from importlib import resources


def names():
    """The stored tables, e.g. ["causal", "encoder_vs_pytorch", ...]."""
    return sorted(f.name[:-len(".json")] for f in resources.files(__name__).iterdir() if f.name.endswith(".json"))


def load(name):
    """One stored table as a dict: title, columns, rows, settings, notes and the machine."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a table name (str), got {type(name).__name__}")
    file = resources.files(__name__) / f"{name}.json"
    if not file.is_file():
        raise ValueError(f"no stored benchmark table named {name!r}; stored: {', '.join(names())}")
    return json.loads(file.read_text())


def show(record):
    """Print a stored table (a dict from `load`) as aligned columns, then its settings."""
    columns = record["columns"]
    text = [[str(row[c]) for c in columns] for row in record["rows"]]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(columns)]
    print(record["title"])
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for t in text:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))
    print("settings:", ", ".join(f"{k}={v}" for k, v in record["settings"].items()))
