"""Retrain the small Transformer that chapter 11 reads, and its table over seeds; store both in the package.

    .venv/bin/python -m tools.data.train_induction           # train, then write src/mha/experiments/induction_model.npz
    .venv/bin/python -m tools.data.train_induction --check   # train again, and compare with the stored weights
    .venv/bin/python -m tools.data.train_induction --seeds   # train every seed of the table, and write
                                                        # src/mha/experiments/seed_tables/ch11_knockouts.json

The training is seeded (the random start, every batch) and runs on one thread, under PyTorch's
generic kernels (this script re-starts itself with them, as tools/data/seed_sweeps.py does): it gives
the same weights bit for bit on every machine. The shipped model is seed 0 of the table
(`induction.knock_outs_over_seeds`), trained for the same SHIPPED_STEPS, so the table's first
row is what the chapter reads from the stored weights. Under another CPU's own kernels, training
amplifies rounding: the weights differ a little, the claims do not (tests/test_claims_ch11.py
asserts them on every row of the table). The chapter reads the stored weights in float64.
`--seeds` is the same as `tools/data/seed_sweeps.py ch11_knockouts`; `--jobs 2` runs two seeds at once.
"""

import argparse
import sys

import numpy as np
import torch

from mha.experiments import induction, seeds
from tools.data import seed_sweeps

SEED, STEPS = 0, induction.SHIPPED_STEPS
TABLE = "ch11_knockouts"


def train():
    config = induction.InductionConfig()
    with induction.one_thread():  # one thread: the same sums in the same order on every run
        model, losses = induction.train_induction(config, STEPS, seed=SEED)
    return model.numpy_params(), config, losses


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="retrain and compare with the stored weights")
    parser.add_argument("--seeds", action="store_true", help=f"train every seed and write the table {TABLE}")
    parser.add_argument("--jobs", type=int, default=1, help="with --seeds: processes, each on one thread")
    args = parser.parse_args(argv)
    if args.seeds:
        seed_sweeps.run_sweep(seeds.get_sweep(TABLE), args.jobs)
        return 0
    params, config, losses = train()
    if args.check:
        stored, _ = induction.load_params(induction.WEIGHTS, dtype=np.float32)
        gaps = [np.abs(params[k] - stored[k]).max() for k in ("embedding", "position_table", "W_out")]
        gaps += [np.abs(layer[k] - old[k]).max() for layer, old in zip(params["layers"], stored["layers"])
                 for k in layer if layer[k] is not None]
        print(f"largest difference from the stored weights: {max(gaps):.3g}")
        return 0 if max(gaps) == 0 else 1
    kernels = " ".join(f"{k}={v}" for k, v in seeds.GENERIC_KERNELS.items())
    induction.save_params(induction.WEIGHTS, params, config, seed=SEED, steps=STEPS, kernels=kernels,
                          final_loss=round(float(np.mean(losses[-100:])), 4), torch=torch.__version__)
    print(f"wrote {induction.WEIGHTS}")
    return 0


if __name__ == "__main__":
    if not seed_sweeps.generic_kernels_set():  # re-start with the kernels of the stored table
        seed_sweeps.restart_under_generic_kernels(__spec__.name)
    sys.exit(main(sys.argv[1:]))
