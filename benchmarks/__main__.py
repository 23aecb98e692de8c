"""Run every CPU benchmark: `python -m benchmarks [--tiny] [--save DIR] [--only a,b]`."""

import argparse
import sys
import time

from benchmarks import (
    decoding, distributed, generation, latent_decode, linear_decode, memory, real_model, speed, sweeps, training,
)
from benchmarks.harness import machine

MODULES = (speed, sweeps, memory, generation, decoding, training, distributed, real_model, latent_decode, linear_decode)
NAMES = [*speed.TABLES, *sweeps.TABLES, "memory", *generation.TABLES, *decoding.TABLES, *training.TABLES,
         *distributed.TABLES, *real_model.TABLES, *latent_decode.TABLES, *linear_decode.TABLES]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a quick check that all runs")
    parser.add_argument("--save", metavar="DIR", help="write each table as DIR/<name>.csv and .json")
    parser.add_argument("--only", metavar="NAMES", help=f"comma-separated, from: {', '.join(NAMES)}")
    args = parser.parse_args(argv)
    only = None if args.only is None else set(args.only.split(","))
    if only and not only <= set(NAMES):
        parser.error(f"unknown tables {sorted(only - set(NAMES))}; choose from {', '.join(NAMES)}")
    info = machine()
    print("machine:", ", ".join(f"{k} {v}" for k, v in info.items()), end="\n\n", flush=True)
    tables = []
    for module in MODULES:
        start = time.perf_counter()
        made = module.run(tiny=args.tiny, only=only)
        for table in made:
            print(table.text(), end="\n\n", flush=True)
            if args.save:
                table.save(args.save, info)
        if made and not args.tiny:
            print(f"({module.__name__}: {time.perf_counter() - start:.0f} s)\n", flush=True)
        tables += made
    return tables


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
