"""Score chapter 14's two shipped models on the whole test text under every protocol, and store the table.

    .venv/bin/python -m tools.data.score_protocols              # write src/mha/text/trained/scoring.json
    python3 -m tools.data.score_protocols --device cuda          # the same on a GPU (stride 1 is slow on a CPU)

A model of context T reads the test text in windows of T tokens, `stride` apart, and scores each token
once, from at least T - stride tokens before it (`mha.text.training.text_nats`). The shipped figure uses
stride T / 2; stride 1 predicts every token after the first window from the T tokens before it, the
longest context the model trained on, and is the best protocol. Stride 1 costs T forward passes per token:
about 20 minutes for the BPE model on one CPU core, a few seconds on a GPU. So the table is stored, with
the nats of the first 128 targets under stride 1 (`prefix_nats`), which a test re-derives on a CPU.

    .venv/bin/python -m tools.data.score_protocols --nucleus     # write src/mha/text/trained/nucleus.json

stores the answers of the Experiment on the nucleus (ex-ch14-nucleus) over the whole test text: the
character model's logits at its 199 936 positions, in float64 (about a minute on one core).
"""

import argparse
import json
import sys
import time

import torch

from mha.experiments import writing
from mha.text import bits_per_character, load_splits
from mha.text.training import text_nats

STRIDES = (256, 128, 64, 32, 16, 8, 4, 2, 1)


def measure(run, device, strides=STRIDES):
    """{"context", "rows": [{"stride", "min_context", "test_bpc", "tokens_scored"}], "prefix_nats"} of one model."""
    model, config, _, tokenizer = writing.stored_model(run)
    model = model.to(device).eval()
    text = load_splits()["test"]
    ids = torch.as_tensor(tokenizer.encode(text))
    characters = writing.scored_characters(tokenizer, ids, text)
    rows = []
    for stride in strides:
        start = time.perf_counter()
        nats, scored = text_nats(model, ids, config.context, stride=stride, batch_size=256)
        rows.append({"stride": stride, "min_context": config.context - stride + 1,
                     "test_bpc": round(bits_per_character(nats, characters), 5), "tokens_scored": scored})
        print(run, rows[-1], f"{time.perf_counter() - start:.0f} s", flush=True)
    prefix, _ = text_nats(model, ids[:writing.PREFIX_TARGETS + 1 + config.context], config.context, stride=1)
    return {"context": config.context, "characters_scored": characters, "rows": rows, "prefix_nats": prefix}


def nucleus(device):
    """nucleus_summary of the float64 character model on the whole test text, and on each fifth of it."""
    model, _, _, tokenizer = writing.stored_model("char", dtype=torch.float64)
    logits, before, came_next = writing.nucleus_positions(model.to(device), tokenizer, load_splits()["test"])
    n = len(came_next)
    fifths = [writing.nucleus_summary(logits[i * n // 5:(i + 1) * n // 5], before[i * n // 5:(i + 1) * n // 5],
                                      came_next[i * n // 5:(i + 1) * n // 5]) for i in range(5)]
    return {"whole": writing.nucleus_summary(logits, before, came_next), "fifths": fifths}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(writing.TRAINED / "scoring.json"))
    parser.add_argument("--nucleus", action="store_true", help="store nucleus.json instead (the Experiment's answers)")
    args = parser.parse_args(argv)
    if args.nucleus:
        (writing.TRAINED / "nucleus.json").write_text(json.dumps(nucleus(args.device)) + "\n")
        print("wrote", writing.TRAINED / "nucleus.json")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 sums as on a CPU, to about 1e-6
    torch.backends.cudnn.allow_tf32 = False
    table = {"description": "Bits per character of the test text under windows of T tokens, stride apart "
                            "(tools/data/score_protocols.py)", "device": args.device,
             "runs": {run: measure(run, args.device) for run in ("char", "bpe")}}
    with open(args.out, "w") as f:
        f.write(json.dumps(table, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
