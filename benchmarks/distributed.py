"""Heads across devices (chapter 15): one training step of an attention layer split over P processes.

    python -m benchmarks.distributed          # full size: P = 1, 2, 4
    python -m benchmarks.distributed --tiny   # seconds: P = 1, 2 (what the tests run)

Table (a `harness.Table`):
  distributed_step  for P = 1, 2, 4 and each scheme of mha.distributed (tensor parallelism by
                    heads, Ulysses, ring attention with the zigzag and the contiguous split), the time
                    of one training step (forward and backward) of one causal MultiHeadAttention,
                    against the same module in one process; and what each rank hands to collectives
                    per step (elements and bytes, forward and backward, counted by
                    mha.distributed.count_payload), with the bytes that then go on the wire.

How it measures. mha.distributed.launch starts P processes (gloo on the CPU), one launch per P. Each
rank runs torch on one thread (torch.set_num_threads(1)) and builds the same module and inputs from
one seed. Before timing, every scheme's output and gradients are compared with the single-process
module's (output within 1e-5 of its largest entry, every gradient within 1e-4 of its layer's largest).
Then, round after round (the order alternating, the first `warmup` rounds thrown away), each
candidate runs once: the ranks meet at a dist.barrier(), and each rank times its own step. A
scheme's time is the slowest rank's median. The single-process module is timed in the same
processes, by rank 0 alone while the others wait at the barrier: that is the baseline, and a
scheme's ratio is the median over rounds of (the slowest rank's time) / (the baseline's time).

A 2-core machine measures the overhead of splitting (processes, gloo over loopback), not speed-up:
4 processes share 2 cores. On P real devices a perfect split would take 1/P of the baseline; here
the ratios say what the communication and the smaller pieces of work cost, not how fast P devices
would be.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

import mha.torch as mt
from benchmarks.harness import Table, ms, print_tables, run_tables
from mha.distributed import (
    RingAttention, UlyssesAttention, count_payload, gather_sequence, launch, split_sequence, tensor_parallel,
)

FULL = dict(world_sizes=(1, 2, 4), batch=2, seq_len=512, d_model=256, n_heads=8, rounds=21, warmup=2, seed=0,
            timeout=600.0)
TINY = dict(world_sizes=(1, 2), batch=2, seq_len=16, d_model=32, n_heads=4, rounds=3, warmup=1, seed=0,
            timeout=120.0)
OUTPUT_TOLERANCE = 1e-5  # of the largest |output|
GRADIENT_TOLERANCE = 1e-4  # of each layer's largest |gradient|
BYTES_PER_ELEMENT = 4  # float32
BASELINE = "one process"
# scheme -> (mnp.payload_per_layer's scheme, the layout of the sequence over ranks, the collective)
SCHEMES = {"tensor": ("tensor", None, "all_reduce"), "ulysses": ("ulysses", "contiguous", "all_to_all"),
           "ring zigzag": ("ring", "zigzag", "send"), "ring contiguous": ("ring", "contiguous", "send")}
WIRE_SHARE = "all-reduce 2(P-1)/P, all-to-all (P-1)/P, send 1"
OVERHEAD_NOTE = ("a 2-core machine measures the overhead of splitting (processes, gloo over loopback), not "
                 "speed-up: 4 processes share 2 cores")


# --- in each rank ------------------------------------------------------------------------------------

def build(size, device):
    """The single-process module (a causal MultiHeadAttention, default initialisation), x and the
    output's gradient g, both (B, T, d_model): the same on every rank (one seed)."""
    torch.manual_seed(size["seed"])
    module = mt.MultiHeadAttention(size["d_model"], size["n_heads"], device=device)
    generator = torch.Generator().manual_seed(size["seed"] + 1)
    shape = (size["batch"], size["seq_len"], size["d_model"])
    x = torch.randn(shape, generator=generator).to(device)  # (B, T, d_model)
    g = torch.randn(shape, generator=generator).to(device)  # (B, T, d_model)
    return module, x, g


class Candidate:
    """One scheme on this rank: forward (this rank's x -> this rank's output), the module whose
    gradients a step clears, this rank's x and output gradient g, and the layout of the sequence
    (None: x whole on every rank)."""

    def __init__(self, forward, owner, x, g, layout=None):
        self.forward, self.owner, self.x, self.g, self.layout = forward, owner, x, g, layout

    def run(self):
        """One step: gradients cleared, forward of x (as a layer inside a network sees it: x needs a
        gradient too), backward of the loss sum(out * g). Returns (out, x with its gradient)."""
        self.owner.zero_grad(set_to_none=True)
        x = self.x.detach().requires_grad_(True)
        out = self.forward(x)
        out.backward(self.g)
        return out, x

    def step(self):
        self.run()


def candidates(module, x, g):
    """{name: Candidate}: the single-process module and every scheme, each on this rank's part."""
    found = {BASELINE: Candidate(lambda a: module(a, causal=True), module, x, g)}
    split = tensor_parallel(module)  # this rank's heads, copied out of `module`
    found["tensor"] = Candidate(lambda a: split(a, causal=True), split, x, g)
    for name, (_, layout, _) in SCHEMES.items():
        if layout is None:
            continue
        scheme = UlyssesAttention(module) if name == "ulysses" else RingAttention(module, layout)
        x_local, g_local = split_sequence(x, layout), split_sequence(g, layout)  # (B, T / P, d_model) each
        found[name] = Candidate(lambda a, s=scheme: s(a, causal=True), module, x_local, g_local, layout)
    return found


def whole_results(candidate):
    """One step of a scheme, gathered from the ranks (not counted: a check): the output and x's
    gradient (B, T, d_model) in position order, and {parameter name of the single module: gradient}."""
    out, x = candidate.run()
    if candidate.layout is None:  # tensor parallel: output and x whole; parameters split by heads
        return out.detach(), x.grad, candidate.owner.full_gradients()
    grads = {}
    for name, parameter in candidate.owner.named_parameters():  # whole on every rank, each its part
        grad = parameter.grad.clone()
        dist.all_reduce(grad)  # the sum of the ranks' parts
        grads[name] = grad
    layout = candidate.layout
    return gather_sequence(out.detach(), layout), gather_sequence(x.grad, layout), grads


def gap(ours, reference, scale=None):
    """max |ours - reference| / scale (max |reference| unless given)."""
    scale = reference.abs().max().item() if scale is None else scale
    return (ours - reference).abs().max().item() / (scale if scale > 0 else 1.0)


def gaps_to_one_process(found):
    """{scheme: (output gap, largest gradient gap)} against the single-process module: x's gradient
    against its largest entry, a parameter's against its layer's largest (weight and bias)."""
    out, x = found[BASELINE].run()
    reference = (out.detach(), x.grad, {n: p.grad.clone() for n, p in found[BASELINE].owner.named_parameters()})
    layer_largest = {}
    for name, grad in reference[2].items():
        layer = name.rpartition(".")[0]
        layer_largest[layer] = max(layer_largest.get(layer, 0.0), grad.abs().max().item())
    gaps = {}
    for name in SCHEMES:
        out, x_grad, grads = whole_results(found[name])
        if set(grads) != set(reference[2]):
            raise AssertionError(f"{name}: gradients of {sorted(grads)}, expected {sorted(reference[2])}")
        gradient_gaps = [gap(x_grad, reference[1])]
        gradient_gaps += [gap(grads[n], ref, layer_largest[n.rpartition(".")[0]]) for n, ref in reference[2].items()]
        gaps[name] = (gap(out, reference[0]), max(gradient_gaps))
    for candidate in found.values():
        candidate.owner.zero_grad(set_to_none=True)
    return gaps


def check_gaps(gaps, rank):
    for name, (output_gap, gradient_gap) in gaps.items():
        if not output_gap <= OUTPUT_TOLERANCE:
            raise AssertionError(f"{name}, rank {rank}: the output differs from one process by {output_gap:.2e} "
                                 f"of the largest (at most {OUTPUT_TOLERANCE:g})")
        if not gradient_gap <= GRADIENT_TOLERANCE:
            raise AssertionError(f"{name}, rank {rank}: a gradient differs from one process by {gradient_gap:.2e} "
                                 f"of its layer's largest (at most {GRADIENT_TOLERANCE:g})")


def payload_of(step):
    """{"forward"/"backward": {op: elements}} and the same in bytes, handed by this rank in one step."""
    with count_payload() as traffic:
        step()
    elements = {d: dict(traffic.by_pass(d)) for d in ("forward", "backward")}
    in_bytes = {d: {op: n for (op, p), n in traffic.bytes.items() if p == d} for d in ("forward", "backward")}
    return {"elements": elements, "bytes": in_bytes}


def timed_rounds(steps, rank, rounds, warmup):
    """{candidate: [seconds of each kept round]} on this rank. Every candidate starts after a barrier;
    the baseline runs in rank 0 only (the others wait at the next barrier)."""
    names = list(steps)
    times = {name: [] for name in names}
    for r in range(warmup + rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            dist.barrier()
            if name == BASELINE and rank != 0:
                continue
            start = time.perf_counter()
            steps[name]()
            elapsed = time.perf_counter() - start
            if r >= warmup:
                times[name].append(elapsed)
    dist.barrier()
    return times


def rank_steps(rank, world_size, size):
    """What each rank runs (a function for mha.distributed.launch): the checks, the payload of one
    step of each scheme, then the interleaved timed rounds. Returns {"gaps", "payload", "times"}."""
    torch.set_num_threads(1)
    found = candidates(*build(size, torch.device("cpu")))
    gaps = gaps_to_one_process(found)
    check_gaps(gaps, rank)
    steps = {name: candidate.step for name, candidate in found.items()}
    payload = {name: payload_of(step) for name, step in steps.items() if name != BASELINE}
    times = timed_rounds(steps, rank, size["rounds"], size["warmup"])
    return {"gaps": gaps, "payload": payload, "times": times, "threads": torch.get_num_threads()}


# --- in the caller -----------------------------------------------------------------------------------

COLUMNS = ["P", "scheme", "ms/step (slowest rank)", "fastest rank (ms)", "ratio to one process", "min", "max",
           "collective", "fwd (elements)", "bwd (elements)", "fwd (bytes)", "bwd (bytes)", "wire (bytes/step)",
           "output gap", "gradient gap"]


def per_round_ratios(by_rank, name):
    """(median, smallest, largest) over rounds of the slowest rank's time / rank 0's baseline time."""
    slowest = [max(times) for times in zip(*(result["times"][name] for result in by_rank))]
    ratios = [t / b for t, b in zip(slowest, by_rank[0]["times"][BASELINE])]
    return tuple(round(value, 3) for value in (statistics.median(ratios), min(ratios), max(ratios)))


def same_on_every_rank(by_rank, name):
    """The payload of `name`, which every rank must hand alike."""
    payloads = [result["payload"][name] for result in by_rank]
    if any(p != payloads[0] for p in payloads):
        raise AssertionError(f"{name}: the ranks handed different payloads: {payloads}")
    return payloads[0]


def add_rows(table, by_rank, world_size):
    import mha.numpy as mnp  # here, not at the top: every rank imports this module, and needs no NumPy face

    baseline = statistics.median(by_rank[0]["times"][BASELINE])
    table.add(**{"P": world_size, "scheme": BASELINE, "ms/step (slowest rank)": ms(baseline),
                 "fastest rank (ms)": ms(baseline), "ratio to one process": 1.0, "min": 1.0, "max": 1.0,
                 "collective": "", "fwd (elements)": 0, "bwd (elements)": 0, "fwd (bytes)": 0, "bwd (bytes)": 0,
                 "wire (bytes/step)": 0, "output gap": 0.0, "gradient gap": 0.0})
    for name, (_, _, op) in SCHEMES.items():
        medians = [statistics.median(result["times"][name]) for result in by_rank]
        ratio, low, high = per_round_ratios(by_rank, name)
        payload = same_on_every_rank(by_rank, name)
        elements, in_bytes = payload["elements"], payload["bytes"]
        unexpected = (set(elements["forward"]) | set(elements["backward"])) - {op}
        if unexpected:
            raise AssertionError(f"{name}: collectives other than {op}: {sorted(unexpected)}")
        wire = mnp.wire_bytes(elements, world_size, BYTES_PER_ELEMENT)
        table.add(**{"P": world_size, "scheme": name, "ms/step (slowest rank)": ms(max(medians)),
                     "fastest rank (ms)": ms(min(medians)), "ratio to one process": ratio, "min": low, "max": high,
                     "collective": op, "fwd (elements)": elements["forward"].get(op, 0),
                     "bwd (elements)": elements["backward"].get(op, 0), "fwd (bytes)": in_bytes["forward"].get(op, 0),
                     "bwd (bytes)": in_bytes["backward"].get(op, 0),
                     "wire (bytes/step)": round(sum(n for ops in wire.values() for n in ops.values())),
                     "output gap": float(f"{max(r['gaps'][name][0] for r in by_rank):.2g}"),
                     "gradient gap": float(f"{max(r['gaps'][name][1] for r in by_rank):.2g}")})


def distributed_table(size):
    """ms per training step of each scheme for each P, against one process, and the payload per rank."""
    d_head = size["d_model"] // size["n_heads"]
    table = Table("distributed_step", "One training step (forward + backward) of a causal MultiHeadAttention split "
                  "over P processes by mha.distributed, against one process", COLUMNS,
                  settings={"world sizes": list(size["world_sizes"]), "batch": size["batch"],
                            "seq_len": size["seq_len"], "d_model": size["d_model"], "n_heads": size["n_heads"],
                            "d_head": d_head, "causal": True, "dtype": "float32", "backend": "gloo",
                            "threads per rank": 1, "cores": cpu_cores(), "rounds": size["rounds"],
                            "warmup": size["warmup"], "seed": size["seed"]},
                  notes=f"{OVERHEAD_NOTE}. One launch of P processes (mha.distributed.launch, gloo) per P; torch on "
                        "one thread in every rank (torch.set_num_threads(1)). Module: "
                        "mha.torch.MultiHeadAttention(d_model, n_heads), default initialisation, float32, "
                        "causal=True; a step: gradients cleared, forward, backward of sum(out * g), x needing "
                        "its gradient as inside a network. Schemes: tensor = tensor_parallel(module) (h/P heads "
                        "per rank, x whole on every rank); ulysses = UlyssesAttention (T/P contiguous positions "
                        "per rank); ring zigzag and ring contiguous = RingAttention(module, layout) (T/P "
                        "positions per rank, 2 chunks). The single module, tensor and ulysses attend with "
                        "F.scaled_dot_product_attention; the ring computes its (query chunk, key chunk) pairs "
                        "explicitly, with its own backward: its P = 1 row is that cost alone. Before timing, each scheme's output (gap: max "
                        f"|difference| / max |output|, at most {OUTPUT_TOLERANCE:g}) and every gradient (gap: of "
                        f"its layer's largest, at most {GRADIENT_TOLERANCE:g}), gathered from the ranks, are "
                        "compared with the single-process module's (one step of the very objects timed). Timing: rounds "
                        "interleaved (the order alternating, the first `warmup` thrown away), every candidate "
                        "started after a dist.barrier(), each rank timing its own step; ms/step = the slowest "
                        "rank's median (fastest rank: the smallest median); one process = the same module "
                        "timed by rank 0 alone in the same processes while the others wait at the barrier; "
                        "ratio = the median over rounds of the slowest rank's time / the baseline's, with their "
                        "smallest and largest. Payload: what one rank hands to collectives in one step "
                        "(count_payload; every rank the same), in elements and bytes, forward and backward; "
                        f"wire = the bytes that leave the rank ({WIRE_SHARE} of the payload; 0 at P = 1). Not "
                        "in the step: the all-reduce of the weight gradients that Ulysses and the ring (whole "
                        "weights on every rank) need before an optimizer step, 4 d_model (d_model + 1) elements")
    for world_size in size["world_sizes"]:
        by_rank = launch(rank_steps, world_size, size, timeout=size["timeout"], backend="gloo")
        if any(result["threads"] != 1 for result in by_rank):
            raise AssertionError(f"a rank ran torch on {[r['threads'] for r in by_rank]} threads, not 1")
        add_rows(table, by_rank, world_size)
    return table


def cpu_cores():
    """The cores this process may use (the ranks share them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


TABLES = {"distributed_step": distributed_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    # launch sends rank_steps by name: import it from benchmarks.distributed, not from __main__
    from benchmarks.distributed import run as importable_run

    print_tables(importable_run)
