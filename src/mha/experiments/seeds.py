"""Claims over seeds: one experiment run on many seeds, its table stored with the library.

A number that a chapter states about a trained model, a random draw or a sweep must hold
beyond the seed that was tried (CONTRIBUTING.md, "Claims hold beyond the case tried"). The
experiment behind it becomes a **sweep**: a function `seed -> {name: number or list of numbers}`,
registered with `@sweep`:

    @sweep("ch12_sharing", seeds=range(15), tolerance=0.02)
    def sharing_errors(seed):
        ...
        return {"partner_error_h_kv_4": 0.061, ...}

`tools/data/seed_sweeps.py` runs every seed of a sweep under generic kernels and one thread
(`GENERIC_KERNELS`), the same on every CPU, and writes `seed_tables/<name>.json`. Chapters read
the stored table (`column`, `spread`); a claims test asserts the chapter's sentence over every
seed of it, and re-derives one stored row (`rederive`), which must agree within the sweep's
`tolerance` on any machine: training amplifies rounding, so claims are compared, not digits.

A claim true on the table's seeds may still be false on the next one. Each sweep therefore names
`held_out` seeds, never stored: the claims test runs them here (`held_out_rows`) and asserts the
chapter's sentences on them too, so a claim holds beyond the seeds it was written from (its margin,
not its digits, must carry it there).
"""

import importlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TABLES = Path(__file__).with_name("seed_tables")
GENERIC_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}
MIN_SEEDS = 5
SWEEPS = {}  # name -> Sweep, filled by @sweep when a module is imported


@dataclass(frozen=True)
class Sweep:
    """One experiment over seeds: `run(seed)` returns a dict of numbers (or lists of numbers)."""
    name: str
    run: object
    seeds: tuple
    tolerance: float  # the largest difference a re-derived row may show on another machine
    module: str  # where `run` lives, so that a worker process can import it
    held_out: tuple = ()  # seeds never stored: the claims test runs them and asserts the claims on them


def sweep(name, *, seeds, tolerance, held_out=()):
    """Register `fn(seed) -> dict` as the sweep `name` over `seeds` (at least MIN_SEEDS of them), with
    `held_out` seeds (none of `seeds`) on which the claims test checks the chapter's sentences again."""
    seeds = tuple(int(s) for s in seeds)
    held_out = tuple(int(s) for s in held_out)
    if len(seeds) < MIN_SEEDS:
        raise ValueError(f"sweep {name!r} has {len(seeds)} seeds; a claim needs at least {MIN_SEEDS}")
    if not tolerance > 0:
        raise ValueError(f"sweep {name!r}: tolerance must be positive, got {tolerance!r}")
    if set(held_out) & set(seeds):
        raise ValueError(f"sweep {name!r}: held-out seeds {sorted(set(held_out) & set(seeds))} are in the table's seeds")

    def register(fn):
        if name in SWEEPS and SWEEPS[name].run.__qualname__ != fn.__qualname__:
            raise ValueError(f"two sweeps are named {name!r}: {SWEEPS[name].module} and {fn.__module__}")
        SWEEPS[name] = Sweep(name, fn, seeds, float(tolerance), fn.__module__, held_out)
        return fn
    return register


def get_sweep(name):
    """The registered sweep `name`; its module must have been imported."""
    if name not in SWEEPS:
        raise ValueError(f"no sweep named {name!r}; registered: {sorted(SWEEPS)} (import its module first)")
    return SWEEPS[name]


def run_row(name, seed, module=None):
    """One row of a sweep, `{"seed": seed, ...}`; values as plain floats (and lists of floats)."""
    if module is not None:
        importlib.import_module(module)  # a worker process registers the sweep by importing its module
    values = get_sweep(name).run(seed)
    return {"seed": int(seed), **{key: _plain(value) for key, value in values.items()}}


def _plain(value):
    array = np.asarray(value, dtype=float)
    return array.tolist() if array.ndim else float(array)


def table_path(name):
    return TABLES / f"{name}.json"


def load(name):
    """The stored table of a sweep: a dict with "rows" (one per seed) and how it was made."""
    path = table_path(name)
    if not path.exists():
        raise ValueError(f"no stored table for sweep {name!r} at {path}: run python -m tools.data.seed_sweeps {name}")
    return json.loads(path.read_text())


def save(name, rows, **notes):
    """Write a sweep's rows (sorted by seed) and notes to `seed_tables/<name>.json`."""
    TABLES.mkdir(exist_ok=True)
    about = {"name": name, "seeds": sorted(row["seed"] for row in rows), **notes}
    text = json.dumps({**about, "rows": sorted(rows, key=lambda row: row["seed"])}, indent=1, sort_keys=True)
    table_path(name).write_text(text + "\n")


def column(name, key):
    """One value over every stored seed: (n_seeds,) or (n_seeds, ...) for list values."""
    return np.array([row[key] for row in load(name)["rows"]], dtype=float)


def spread(name, key):
    """(median, smallest, largest) of a scalar value over every stored seed."""
    values = column(name, key)
    if values.ndim != 1:
        raise ValueError(f"spread needs a number per seed, but {name}[{key!r}] has shape {values.shape[1:]}")
    return float(statistics.median(values.tolist())), float(values.min()), float(values.max())


def rederive(name, seed=None):
    """Run one stored seed again here: returns (stored row, fresh row, largest difference)."""
    stored = load(name)["rows"]
    row = stored[0] if seed is None else next((r for r in stored if r["seed"] == seed), None)
    if row is None:
        raise ValueError(f"seed {seed} is not stored for sweep {name!r}; stored: {[r['seed'] for r in stored]}")
    fresh = run_row(name, row["seed"])
    if sorted(fresh) != sorted(row):
        raise ValueError(f"sweep {name!r} now returns {sorted(fresh)}, the table stores {sorted(row)}")
    gap = max(float(np.max(np.abs(np.subtract(fresh[k], row[k])))) for k in row if k != "seed")
    return row, fresh, gap


_HELD_OUT = {}  # name -> its held-out rows, computed once per process


def held_out_rows(name):
    """The rows of a sweep's held-out seeds, computed here once per process (never stored):
    [{"seed": s, ...}, ...]."""
    held_out = get_sweep(name).held_out
    if not held_out:
        raise ValueError(f"sweep {name!r} names no held-out seeds: give @sweep(..., held_out=(...))")
    if name not in _HELD_OUT:
        _HELD_OUT[name] = [run_row(name, seed) for seed in held_out]
    return [dict(row) for row in _HELD_OUT[name]]


def held_out_column(name, key):
    """One value over the held-out seeds, computed here: (n_held_out,) or (n_held_out, ...)."""
    return np.array([row[key] for row in held_out_rows(name)], dtype=float)
