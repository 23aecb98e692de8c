"""Run the chapters' seed sweeps and store their tables in src/mha/experiments/seed_tables/.

    .venv/bin/python -m tools.data.seed_sweeps --list             # every registered sweep
    .venv/bin/python -m tools.data.seed_sweeps ch12_sharing       # run one sweep, write its table
    .venv/bin/python -m tools.data.seed_sweeps --all --jobs 2     # every sweep, two processes

A sweep is registered in `mha.experiments` with `@seeds.sweep` (see mha/experiments/seeds.py).
Every row is computed under PyTorch's generic kernels with one thread (seeds.GENERIC_KERNELS):
this script re-starts itself with them, so the stored tables do not depend on the CPU that
made them. Tests re-derive a stored row on whatever machine they run and compare it within
the sweep's tolerance.
"""

import argparse
import importlib
import os
import pkgutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import mha.experiments
from mha.experiments import seeds


def import_every_experiment():
    """Import each module of mha.experiments, so that every @sweep is registered."""
    for info in pkgutil.iter_modules(mha.experiments.__path__):
        importlib.import_module(f"mha.experiments.{info.name}")


def generic_kernels_set():
    return all(os.environ.get(k) == v for k, v in seeds.GENERIC_KERNELS.items())


def restart_under_generic_kernels(module):
    """Run `python -m module` again with this process's arguments, under the generic kernels (never returns)."""
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], {**os.environ, **seeds.GENERIC_KERNELS})


def run_sweep(sweep, jobs):
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(seeds.run_row, [sweep.name] * len(sweep.seeds), sweep.seeds,
                             [sweep.module] * len(sweep.seeds)))
    seconds = time.perf_counter() - start
    import torch
    kernels = " ".join(f"{k}={v}" for k, v in seeds.GENERIC_KERNELS.items())
    seeds.save(sweep.name, rows, tolerance=sweep.tolerance, module=sweep.module, function=sweep.run.__name__,
               kernels=kernels, torch=torch.__version__, seconds=round(seconds, 1))
    print(f"{sweep.name}: {len(rows)} seeds in {seconds:.0f} s -> {seeds.table_path(sweep.name)}", flush=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="the sweeps to run")
    parser.add_argument("--all", action="store_true", help="run every registered sweep")
    parser.add_argument("--list", action="store_true", help="list the registered sweeps and exit")
    parser.add_argument("--jobs", type=int, default=1, help="processes, each on one thread (default 1)")
    args = parser.parse_args(argv)
    import_every_experiment()
    if args.list:
        for name, sweep in sorted(seeds.SWEEPS.items()):
            print(f"{name}: {len(sweep.seeds)} seeds, tolerance {sweep.tolerance}, {sweep.module}.{sweep.run.__name__}")
        return 0
    names = sorted(seeds.SWEEPS) if args.all else args.names
    if not names:
        parser.error("name a sweep, or use --all (--list shows them)")
    for name in names:
        run_sweep(seeds.get_sweep(name), args.jobs)
    return 0


if __name__ == "__main__":
    if not generic_kernels_set():  # re-start with the kernels every stored table is made under
        restart_under_generic_kernels(__spec__.name)
    sys.exit(main(sys.argv[1:]))
