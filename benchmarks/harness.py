"""Timing and tables shared by every benchmark.

Timing: the candidates of one comparison run one after the other in each round
(the order alternates from round to round), the first `warmup` rounds are thrown
away, and each candidate's time is the median over the rounds. The ratio of a
candidate to the baseline is the median of the per-round ratios: two runs that
sit side by side in time see the same background load, so their ratio is steadier
than a ratio of two medians on a shared, noisy machine.
"""

import csv
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path


def compare(candidates, baseline, rounds, warmup=2):
    """Time each callable in `candidates` (name -> fn) interleaved with the others.

    Returns {name: (median seconds, median ratio to `baseline`)}.
    """
    names = list(candidates)
    times = {name: [] for name in names}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        elapsed = {}
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            elapsed[name] = time.perf_counter() - start
        if r >= warmup:
            for name in names:
                times[name].append(elapsed[name])
    results = {}
    for name in names:
        ratios = [t / b for t, b in zip(times[name], times[baseline])]
        results[name] = (statistics.median(times[name]), statistics.median(ratios))
    return results


def machine():
    """Where the numbers came from: enough to tell two machines apart."""
    import numpy
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "date": date.today().isoformat(),
    }
    if os.environ.get("OPENBLAS_CORETYPE"):
        info["OPENBLAS_CORETYPE"] = os.environ["OPENBLAS_CORETYPE"]
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


@dataclass
class Table:
    """One benchmark's result: rows of named columns, printable and savable."""

    name: str  # file stem, e.g. "mha_vs_pytorch"
    title: str
    columns: list
    rows: list = field(default_factory=list)  # dicts keyed by column
    notes: str = ""
    settings: dict = field(default_factory=dict)

    def add(self, **row):
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise ValueError(f"row of table {self.name!r} lacks columns {missing}")
        self.rows.append(row)

    def text(self):
        cells = [[format_cell(row[c]) for c in self.columns] for row in self.rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c)
                  for i, c in enumerate(self.columns)]
        line = "  ".join("-" * w for w in widths)
        out = [self.title, line, "  ".join(c.ljust(w) for c, w in zip(self.columns, widths)), line]
        out += ["  ".join(v.rjust(w) if is_number(v) else v.ljust(w) for v, w in zip(r, widths))
                for r in cells]
        out.append(line)
        if self.settings:
            out.append("settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()))
        if self.notes:
            out.append(self.notes)
        return "\n".join(out)

    def save(self, directory, info=None):
        """Write <name>.csv (the rows) and <name>.json (rows, settings, notes, machine)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / f"{self.name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows({c: row[c] for c in self.columns} for row in self.rows)
        record = {"name": self.name, "title": self.title, "columns": self.columns, "rows": self.rows,
                  "settings": self.settings, "notes": self.notes, "machine": info or machine()}
        (directory / f"{self.name}.json").write_text(json.dumps(record, indent=1) + "\n")


def format_cell(value):
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def is_number(text):
    try:
        float(text.rstrip("x"))
        return True
    except ValueError:
        return False


def ms(seconds):
    """Milliseconds, rounded for a table."""
    return round(1e3 * seconds, 2)


def run_tables(tables, size, only=None):
    """Make every table of `tables` ({name: make(size)}), or only those named in `only`."""
    return [make(size) for name, make in tables.items() if only is None or name in only]


def print_tables(run):
    """What `python -m benchmarks.<module> [--tiny]` does: print the module's tables."""
    for table in run(tiny="--tiny" in sys.argv):
        print(table.text(), end="\n\n")
