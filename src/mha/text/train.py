"""Train chapter 14's language models on the CPython standard library, from scratch.

    python -m mha.text.train --preset tiny              # 20 steps, a few seconds: into runs/tiny/
    python -m mha.text.train --preset char              # the character model's run: into runs/char/
    python -m mha.text.train --preset bpe               # the BPE model's run: into runs/bpe/
    python -m mha.text.train --preset seeds             # the smaller run, on seeds 0 .. 4: runs/seeds/seeds.json
    python -m mha.text.train --preset char --resume     # carry on from the last checkpoint
    torchrun --nproc_per_node 2 -m mha.text.train --preset char   # the same run, DistributedDataParallel

Each run writes its weights, tokenizer, loss curve and measured results into the folder `--out`
(default runs/<preset>/ under the current folder; the seeds run writes seeds.json there). It never
writes into the shipped models of src/mha/text/trained/ unless `--out` names that folder: the
maintainers retrain them with `--out src/mha/text/trained/char` (and bpe; `--out src/mha/text/trained`
for the seeds table). Checkpoints go to .cache/train_lm/<run>.pt every `checkpoint_every` steps.
Under torchrun each process computes its rows of the same global batch (gloo on CPUs, NCCL when
every process has a GPU); rank 0 alone prints, checkpoints and stores.

`--stop-at N` ends after step N (the schedule still aims at the full run), `--curve-out F`
writes the curve as JSON and stores nothing: the tests use both to retrain a run's first steps.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from mha.text import load_splits
from mha.experiments.writing import (
    RUNS, encode_splits, induction_summary, make_tokenizer, measure, seed_summary,
)
from mha.text.training import save_model, train

CHECKPOINTS = Path(".cache") / "train_lm"  # under the current folder


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(RUNS), required=True, help="which configuration to train")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4], help="seeds of the seeds run")
    parser.add_argument("--resume", action="store_true", help="resume from the run's checkpoint")
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this step (the schedule is unchanged)")
    parser.add_argument("--steps", type=int, default=None, help="override the run's number of steps")
    parser.add_argument("--curve-out", type=Path, default=None, help="write the loss curve here, and store nothing")
    parser.add_argument("--out", type=Path, default=None,
                        help="the folder the run writes (default runs/<preset>; the shipped models only if named)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="the checkpoint file (default .cache/train_lm)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--device", default=None, help="cpu or cuda:N (default: each process's GPU if any, else cpu)")
    arguments = parser.parse_args(argv)
    if arguments.checkpoint is not None and arguments.checkpoint.suffix != ".pt":
        parser.error(f"--checkpoint {arguments.checkpoint}: a checkpoint is a .pt file (a fresh run deletes it)")
    if arguments.out is None:
        arguments.out = Path("runs") / arguments.preset
    return arguments


def start_processes(device):
    """Join torchrun's process group when launched by it: NCCL when the processes compute on GPUs,
    else gloo. Returns (rank, world size, device): on GPUs, each process its own (LOCAL_RANK)."""
    if device is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return rank, world_size, device


def train_one(config, splits, arguments, name, device):
    """Train one configuration; returns (model, curve, tokenizer, seconds)."""
    tokenizer = make_tokenizer(config, splits["train"])
    ids = encode_splits(tokenizer, splits)
    checkpoint = arguments.checkpoint or CHECKPOINTS / f"{name}.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    if not arguments.resume and checkpoint.exists() and arguments.stop_at is None:
        checkpoint.unlink()  # a fresh run starts from scratch
    start = time.perf_counter()
    model, curve = train(config, ids["train"], ids["validation"], tokenizer.vocab_size,
                         checkpoint=None if arguments.curve_out else checkpoint, resume=arguments.resume,
                         stop_at=arguments.stop_at, progress=not arguments.quiet, device=device)
    model = model.cpu()  # measured and stored on the CPU
    seconds = time.perf_counter() - start
    return model, curve, tokenizer, ids, seconds


def main(argv=None):
    arguments = parse_arguments(argv)
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    rank, world_size, device = start_processes(arguments.device)
    splits = load_splits()
    configs = RUNS[arguments.preset]
    if arguments.preset != "seeds":
        configs = configs[:1]
    else:
        configs = [replace(configs[0], seed=seed) for seed in arguments.seeds]
    if arguments.steps is not None:
        configs = [replace(config, steps=arguments.steps) for config in configs]
    rows = []
    for config in configs:
        name = arguments.preset if arguments.preset != "seeds" else f"seeds-{config.seed}"
        model, curve, tokenizer, ids, seconds = train_one(config, splits, arguments, name, device)
        if rank != 0:
            continue
        if arguments.curve_out is not None:
            arguments.curve_out.write_text(json.dumps(curve) + "\n")
            continue
        results = measure(model, config, tokenizer, ids, splits)
        results.update(seconds=round(seconds), world_size=world_size, threads=torch.get_num_threads(),
                       torch=torch.__version__, **induction_summary(model, tokenizer, splits["test"]))
        print(json.dumps(results, indent=1), flush=True)
        if arguments.preset == "seeds":
            rows.append({"seed": config.seed, **results})
        elif arguments.stop_at is None:
            save_model(arguments.out, model, config, tokenizer, curve, results)
            print(f"stored the run in {arguments.out}", flush=True)
    if rows and rank == 0 and arguments.stop_at is None:
        arguments.out.mkdir(parents=True, exist_ok=True)
        (arguments.out / "seeds.json").write_text(json.dumps(seed_summary(configs[0], rows), indent=1) + "\n")
        print(f"stored the table in {arguments.out / 'seeds.json'}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
