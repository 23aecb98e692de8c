"""Chapter 15's run: every scheme of `mha.distributed` against one process, in one launch.

`chapter_run(rank, world_size)` is the function the chapter gives to `launch`: each rank runs
the cases of CHAPTER_CASES (mha.distributed.equivalence) and returns its errors, payload and
work. `summarise(results)` turns the ranks' answers into one row per case: the worst relative
error over ranks and tensors, the payload each rank handed (the same on every rank), the
formula's payload, and the chunk pairs each rank computed. `ring_all_reduce_steps` simulates
the ring all-reduce piece by piece, for the chapter's figure of it.
"""

import numpy as np

import mha.numpy as mnp
from mha.distributed.equivalence import full_case, run_cases

SIZE = dict(batch=2, seq_len=32, d_model=64, n_heads=8, n_kv_heads=8)  # d_head = 8
CHAPTER_CASES = {
    "tensor: attention": dict(scheme="tensor", module="mha", seed=0, causal=True, padding=True),
    "tensor: grouped, h_kv = 2": dict(scheme="tensor", module="gqa", seed=1, n_kv_heads=2, causal=True, padding=True),
    "tensor: encoder block": dict(scheme="tensor", module="encoder", seed=2, d_ff=128, causal=True, padding=True),
    "tensor: ours vs parallelize_module": dict(scheme="tensor_vs_torch", module="mha", seed=3, causal=True,
                                               padding=True),
    "ulysses": dict(scheme="ulysses", module="mha", seed=4, causal=True, padding=True),
    "ring: contiguous": dict(scheme="ring", module="mha", seed=5, causal=True, padding=True, layout="contiguous"),
    "ring: zigzag": dict(scheme="ring", module="mha", seed=5, causal=True, padding=True, layout="zigzag"),
}


def cases():
    """{name: full case}: CHAPTER_CASES at the chapter's size."""
    return {name: full_case({**SIZE, **case}) for name, case in CHAPTER_CASES.items()}


def chapter_run(rank, world_size):
    """This rank's results for every case: {name: {"errors": ..., "traffic": ...}}."""
    named = cases()
    return dict(zip(named, run_cases(rank, world_size, list(named.values()))))


def formula_payload(case, world_size):
    """mnp.payload_per_layer for a case's scheme and sizes: {"forward": {op: n}, "backward": {...}}."""
    scheme = "tensor" if case["scheme"].startswith("tensor") else case["scheme"]
    n_kv_heads = case["n_kv_heads"] if case["module"] == "gqa" else case["n_heads"]
    return mnp.payload_per_layer(scheme, world_size=world_size, batch=case["batch"], seq_len=case["seq_len"],
                                 d_model=case["d_model"], n_heads=case["n_heads"], n_kv_heads=n_kv_heads,
                                 d_head=case["d_model"] // case["n_heads"])


def handed(result, direction):
    """Elements a rank handed to collectives in one pass."""
    return sum(v["elements"] for k, v in result["traffic"]["payload"].items() if k.endswith(direction))


def summarise(results):
    """One row per case from the ranks' results (a list by rank of chapter_run's dicts)."""
    world_size = len(results)
    rows = []
    for name, case in cases().items():
        by_rank = [results[rank][name] for rank in range(world_size)]
        formula = formula_payload(case, world_size)
        blocks = 2 if case["module"] == "encoder" else 1  # the encoder block adds the feed-forward's all-reduce
        rows.append({
            "case": name,
            "worst error": max(max(r["errors"].values()) for r in by_rank),
            "tensors compared": len(by_rank[0]["errors"]),
            "forward payload": [handed(r, "forward") for r in by_rank],
            "backward payload": [handed(r, "backward") for r in by_rank],
            "formula forward": sum(formula["forward"].values()) * blocks,
            "formula backward": sum(formula["backward"].values()) * blocks,
            "chunk pairs": [r["traffic"]["work"].get("chunk_pairs/forward") for r in by_rank],
        })
    return rows


def ring_all_reduce_steps(partials):
    """The ring all-reduce of P arrays, step by step, as P ranks would run it [patarasuk2009bandwidth].

    Each rank cuts its array into P pieces. At step s = 0 .. 2P - 3, rank r sends its piece (r - s) % P
    to rank r + 1 (one piece of P per step). Reduce-scatter (s < P - 1): the receiver adds it to its
    own; afterwards rank r holds the whole sum of piece (r + 1) % P. All-gather (s >= P - 1): the
    piece sent is a whole sum, and the receiver keeps it. Returns a list of 2P - 1 states, the start
    first, each {"phase", "sent": [(rank, piece), ...] (what each rank sent to reach this state),
    "sums": sums[r][k] (the ranks whose piece k rank r's copy adds up, a sorted tuple), "pieces":
    pieces[r][k] (the arrays)}.
    """
    P = len(partials)
    pieces = [np.array_split(np.asarray(a, dtype=float).ravel(), P) for a in partials]
    sums = [[(r,) for _ in range(P)] for r in range(P)]
    states = [{"phase": "start", "sent": [], "sums": [list(row) for row in sums],
               "pieces": [[x.copy() for x in row] for row in pieces]}]
    for step in range(2 * (P - 1)):
        gather = step >= P - 1
        sent = [(r, (r - step) % P) for r in range(P)]
        moved = [(pieces[r][k].copy(), sums[r][k]) for r, k in sent]  # every rank sends before any receives
        for (r, k), (values, who) in zip(sent, moved):
            to = (r + 1) % P
            if gather:
                pieces[to][k], sums[to][k] = values, who
            else:
                pieces[to][k], sums[to][k] = pieces[to][k] + values, tuple(sorted(sums[to][k] + who))
        states.append({"phase": "all-gather" if gather else "reduce-scatter", "sent": sent,
                       "sums": [list(row) for row in sums], "pieces": [[x.copy() for x in row] for row in pieces]})
    return states
