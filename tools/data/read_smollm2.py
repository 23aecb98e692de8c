"""Read SmolLM2-135M-Instruct's heads and score its text, and store what is slow (chapter 16).

    .venv/bin/python -m tools.data.read_smollm2 heads knockouts   # the two sweeps' tables (seed_tables/)
    .venv/bin/python -m tools.data.read_smollm2 text               # ordinary-text losses of the knock-outs
    .venv/bin/python -m tools.data.read_smollm2 bpc                # bits per character of the test text

heads: chapter 11's previous-token and induction scores of all 270 heads on each draw of
"ch16_head_scores" (about 2 s a draw). knockouts: each draw of "ch16_knockouts" (the strongest
induction heads, read from the heads table, or as many random ones, switched off; about 10 s a
draw), so run it after heads. text: the loss on the fixed slice of ordinary text with every head on
and with the strongest induction heads off. bpc: the whole test text (200 000 characters, 54 149
tokens) in windows of 1024 tokens, 768 apart, so every token is predicted from at least 256 tokens
before it, the whole context of chapter 14's models (about 8 minutes on two idle cores with --bpc-threads 2,
6.5 s a window; a stopped run resumes from .cache/), and the nats of its first PREFIX_TARGETS tokens, which
tests/test_claims_ch16.py re-derives.

Like tools/data/seed_sweeps.py, it re-starts itself under PyTorch's generic kernels on one thread
(mha.experiments.seeds.GENERIC_KERNELS), loads the model once, and records the environment.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from mha.experiments import real_heads, seeds

STEPS = ("heads", "knockouts", "text", "bpc")
SWEEP_OF_STEP = {"heads": "ch16_head_scores", "knockouts": "ch16_knockouts"}
CONTEXT, STRIDE, PREFIX_TARGETS = 1024, 768, 256
CHECKPOINT = Path(".cache/read_smollm2_bpc_windows.json")  # each window's nats, for a resumed run


def environment():
    """What the stored numbers were computed with."""
    import transformers
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "cpu": cpu, "threads": torch.get_num_threads(),
            "kernels": " ".join(f"{k}={os.environ.get(k)}" for k in seeds.GENERIC_KERNELS)}


def store_sweep(name):
    """Every stored seed of a sweep, computed in this process (one model load), written as seed_sweeps does."""
    sweep, start = seeds.get_sweep(name), time.perf_counter()
    rows = []
    for seed in sweep.seeds:
        rows.append(seeds.run_row(name, seed))
        print(f"{name} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    kernels = " ".join(f"{k}={v}" for k, v in seeds.GENERIC_KERNELS.items())
    seeds.save(name, rows, tolerance=sweep.tolerance, module=sweep.module, function=sweep.run.__name__,
               kernels=kernels, torch=torch.__version__, seconds=round(time.perf_counter() - start, 1))


def text_losses():
    """The knock-outs' losses on ordinary text that do not depend on the draw."""
    model, _ = real_heads.load_model()
    strongest = real_heads.strongest_heads("induction")
    return {"tokens": real_heads.TEXT_TOKENS, "loss": real_heads.text_loss(model),
            "loss_induction_off": real_heads.text_loss(model, real_heads.heads_off(strongest)),
            "induction_heads": [list(pair) for pair in strongest]}


def bits_per_character(threads):
    """The test text's bits per character, and the nats of its first PREFIX_TARGETS tokens. Each window's
    nats go to CHECKPOINT as they come, so that a run stopped half way resumes where it was."""
    from mha.text import load_splits
    torch.set_num_threads(threads)
    model, tokenizer = real_heads.load_model()
    text, start = load_splits()["test"], time.perf_counter()
    done = {int(k): v for part in sorted(CHECKPOINT.parent.glob("read_smollm2_bpc_*.json"))
            for k, v in json.loads(part.read_text()).items()}  # windows scored before, by this or other runs

    def keep(window_start, nats, i, n_windows):
        done[window_start] = nats
        CHECKPOINT.write_text(json.dumps(done))
        print(f"window {i + 1}/{n_windows}: {time.perf_counter() - start:.0f} s", flush=True)

    bpc, nats, scored = real_heads.text_bits_per_character(text, CONTEXT, STRIDE, done, keep)
    ids = [real_heads.DOCUMENT_START, *tokenizer(text)["input_ids"][:PREFIX_TARGETS]]
    prefix, _ = real_heads.text_nats(model, ids, PREFIX_TARGETS, PREFIX_TARGETS)
    return {"context": CONTEXT, "stride": STRIDE, "characters": len(text), "tokens_scored": scored,
            "nats": nats, "bpc": bpc, "prefix_targets": PREFIX_TARGETS, "prefix_nats": prefix}


def update_readings(key, value):
    """Write one part of smollm2_readings.json, keeping the others."""
    path = real_heads.READINGS
    readings = json.loads(path.read_text()) if path.exists() else {}
    readings[key] = {**value, "environment": environment()}
    path.write_text(json.dumps(readings, indent=1, sort_keys=True) + "\n")
    print(f"wrote {key} to {path}", flush=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="+", choices=STEPS, help="what to compute and store, in this order")
    parser.add_argument("--bpc-threads", type=int, default=1, help="threads for bpc (the sweeps keep one)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    for step in args.steps:
        if step in SWEEP_OF_STEP:
            store_sweep(SWEEP_OF_STEP[step])
        else:
            update_readings(step, text_losses() if step == "text" else bits_per_character(args.bpc_threads))
    return 0


if __name__ == "__main__":
    if not all(os.environ.get(k) == v for k, v in seeds.GENERIC_KERNELS.items()):
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]],
                  {**os.environ, **seeds.GENERIC_KERNELS, "PYTHONHASHSEED": "0"})
    sys.exit(main(sys.argv[1:]))
