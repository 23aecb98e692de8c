"""What the tests of the benchmark scripts share (tests/test_benchmarks.py, test_benchmarks_generation.py,
test_benchmarks_training.py): where the stored tables are, and what a sane number and a sane ratio are."""

import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "src" / "mha" / "benchmark_results"


def positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_ratio_columns(row, ratio, low, high):
    """A median ratio of rounds lies between their smallest and largest, all positive."""
    assert positive(row[low]) and row[low] <= row[ratio] <= row[high], row
