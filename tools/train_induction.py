"""Retrain the small Transformer that chapter 11 reads, and store its weights in the package.

    .venv/bin/python tools/train_induction.py           # train, then write src/mha/experiments/induction_model.npz
    .venv/bin/python tools/train_induction.py --check   # train again, and compare with the stored weights

The training is seeded (the random start, every batch) and runs on one thread, so on one
machine it gives the same weights bit for bit, every time. Another CPU rounds differently,
and training amplifies rounding: its weights will differ a little, its heads will not (the
course's tests check the heads over several seeds). The chapter reads the stored weights,
in float64, so that its printed scores are the same on every machine.
"""

import argparse
import sys

import numpy as np
import torch

from mha.experiments import induction

SEED, STEPS = 0, 2000


def train():
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every run
    config = induction.InductionConfig()
    model, losses = induction.train_induction(config, STEPS, seed=SEED)
    return model.numpy_params(), config, losses


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="retrain and compare with the stored weights")
    args = parser.parse_args(argv)
    params, config, losses = train()
    if args.check:
        stored, _ = induction.load_params(induction.WEIGHTS, dtype=np.float32)
        gaps = [np.abs(params[k] - stored[k]).max() for k in ("embedding", "position_table", "W_out")]
        gaps += [np.abs(layer[k] - old[k]).max() for layer, old in zip(params["layers"], stored["layers"])
                 for k in layer if layer[k] is not None]
        print(f"largest difference from the stored weights: {max(gaps):.3g}")
        return 0 if max(gaps) == 0 else 1
    induction.save_params(induction.WEIGHTS, params, config, seed=SEED, steps=STEPS,
                          final_loss=round(float(np.mean(losses[-100:])), 4), torch=torch.__version__)
    print(f"wrote {induction.WEIGHTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
