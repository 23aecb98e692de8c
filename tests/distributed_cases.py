"""What the tests of mha.distributed's schemes share: every scheme's cases, one launch per world size
running all of them, and the check that a case equals one process on every rank
(tests/test_distributed_tensor.py, test_distributed_ulysses.py, test_distributed_ring.py).

A launch starts Python and torch in every rank (seconds on 2 cores), so the three files share two
launches (P = 2 and 4), not six. Within a process the results are kept in memory; the pytest-xdist
workers of one run ($PYTEST_XDIST_TESTRUNUID) share them through a file per world size in a folder of
the run's own, taking turns through a lock, so the first worker to ask launches and the others read.
"""

import fcntl
import functools
import os
import pickle
import tempfile
from pathlib import Path

from mha.distributed import launch
from mha.distributed.equivalence import full_case, run_cases

TOLERANCE = {"float32": 1e-5, "float64": 1e-12}  # relative, of the output and of every gradient
WORLD_SIZES = (2, 4)
LAUNCH_TIMEOUT = 600  # seconds for every case of every scheme in one launch, on a loaded 2-core machine

# (name, case) by scheme. Tensor: MultiHeadAttention, GroupedQueryAttention (RoPE; key/value heads split,
# one per rank, and replicated when P > h_kv), the encoder block, today's decoder block, with causal and
# padding masks, and against PyTorch's parallelize_module.
CASES = {
    "tensor": [
        ("mha", dict(scheme="tensor", module="mha", seed=1)),
        ("mha causal, padded", dict(scheme="tensor", module="mha", seed=2, causal=True, padding=True)),
        ("mha float64, padded", dict(scheme="tensor", module="mha", seed=3, padding=True, dtype="float64")),
        ("gqa h=8 h_kv=4 causal, padded", dict(scheme="tensor", module="gqa", seed=4, n_heads=8, n_kv_heads=4,
                                               causal=True, padding=True)),
        ("gqa h=8 h_kv=2 padded", dict(scheme="tensor", module="gqa", seed=5, n_heads=8, n_kv_heads=2,
                                       padding=True)),
        ("gqa h=4 h_kv=1 causal", dict(scheme="tensor", module="gqa", seed=6, n_heads=4, n_kv_heads=1,
                                       causal=True)),
        ("encoder block causal, padded", dict(scheme="tensor", module="encoder", seed=7, causal=True,
                                              padding=True)),
        ("llama block padded", dict(scheme="tensor", module="lm", seed=8, n_heads=8, n_kv_heads=2, padding=True)),
        ("ours = parallelize_module: mha causal, padded", dict(scheme="tensor_vs_torch", module="mha", seed=9,
                                                               causal=True, padding=True)),
        ("ours = parallelize_module: gqa h_kv=4", dict(scheme="tensor_vs_torch", module="gqa", seed=10,
                                                       n_heads=8, n_kv_heads=4, padding=True)),
        ("ours = parallelize_module: encoder block", dict(scheme="tensor_vs_torch", module="encoder", seed=11,
                                                          causal=True, padding=True)),
        ("parallelize_module = one process", dict(scheme="torch_tensor", module="mha", seed=12, padding=True)),
        # QK-norm per head (Qwen3, Gemma 3): one weight on every rank, applied to its own heads (#39)
        ("gqa qk-norm per head h=8 h_kv=2 float64", dict(scheme="tensor", module="gqa", seed=13, n_heads=8,
                                                         n_kv_heads=2, qk_norm="head", causal=True, padding=True,
                                                         dtype="float64")),
        ("qwen3 block (qk-norm per head) float64", dict(scheme="tensor", module="lm", seed=14, n_heads=8,
                                                        n_kv_heads=4, qk_norm="head", padding=True, dtype="float64")),
        ("parallelize_module = one process: gqa qk-norm float64", dict(scheme="torch_tensor", module="gqa", seed=15,
                                                                       n_heads=8, n_kv_heads=4, qk_norm="head",
                                                                       padding=True, dtype="float64")),
        ("3 SGD steps = one process: qwen3 block float64", dict(scheme="tensor_training", module="lm", seed=16,
                                                                n_heads=8, n_kv_heads=2, qk_norm="head",
                                                                padding=True, dtype="float64")),
        ("3 SGD steps = one process: llama block float64", dict(scheme="tensor_training", module="lm", seed=17,
                                                                n_heads=8, n_kv_heads=2, padding=True,
                                                                dtype="float64")),
        ("3 SGD steps, parallelize_module = one process: gqa qk-norm float64",
         dict(scheme="torch_tensor_training", module="gqa", seed=18, n_heads=8, n_kv_heads=4, qk_norm="head",
              causal=True, dtype="float64")),
    ],
    "ulysses": [
        ("mha", dict(scheme="ulysses", module="mha", seed=31)),
        ("mha causal, padded", dict(scheme="ulysses", module="mha", seed=32, causal=True, padding=True)),
        ("gqa with RoPE h=8 h_kv=4, causal, padded", dict(scheme="ulysses", module="gqa", seed=33, n_heads=8,
                                                          n_kv_heads=4, causal=True, padding=True)),
        ("gqa h_kv=2 < P=4 (repeated), padded", dict(scheme="ulysses", module="gqa", seed=34, n_heads=8,
                                                     n_kv_heads=2, padding=True)),
        ("gqa h_kv=1 (multi-query), causal", dict(scheme="ulysses", module="gqa", seed=36, n_heads=8,
                                                  n_kv_heads=1, causal=True)),
        ("float64 causal, padded", dict(scheme="ulysses", module="mha", seed=35, causal=True, padding=True,
                                        dtype="float64")),
    ],
    "ring": [
        ("zigzag causal, padded", dict(scheme="ring", module="mha", seed=21, causal=True, padding=True)),
        ("contiguous causal, padded", dict(scheme="ring", module="mha", seed=22, causal=True, padding=True,
                                           layout="contiguous")),
        ("zigzag, not causal", dict(scheme="ring", module="mha", seed=23, padding=True)),
        ("contiguous, not causal", dict(scheme="ring", module="mha", seed=24, layout="contiguous")),
        ("gqa with RoPE, zigzag causal, padded", dict(scheme="ring", module="gqa", seed=25, n_heads=8,
                                                      n_kv_heads=2, causal=True, padding=True, seq_len=32)),
        ("gqa with RoPE, contiguous causal", dict(scheme="ring", module="gqa", seed=26, causal=True,
                                                  layout="contiguous")),
        ("float64 zigzag causal, padded", dict(scheme="ring", module="mha", seed=27, causal=True, padding=True,
                                               dtype="float64")),
        ("padding longer than a chunk", dict(scheme="ring", module="mha", seed=28, causal=True, padding=True,
                                             pad=9, seq_len=32)),
    ],
}
EVERY_CASE = [case for scheme in CASES for _, case in CASES[scheme]]  # the order of one launch's results


def scheme_results(scheme):
    """{P: [per case of CASES[scheme]: [per rank: result]]}, from the shared launches."""
    start = sum(len(CASES[s]) for s in list(CASES)[:list(CASES).index(scheme)])
    return {world_size: launched(world_size)[start:start + len(CASES[scheme])] for world_size in WORLD_SIZES}


@functools.cache
def launched(world_size):
    """[per case of EVERY_CASE: [per rank: result]]: one launch of P = world_size in this run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return launch_every_case(world_size)
    folder = Path(tempfile.gettempdir()) / f"mha-distributed-{run}"
    folder.mkdir(exist_ok=True)
    with open(folder / f"P{world_size}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait here while one launches
        stored = folder / f"P{world_size}.pkl"
        if not stored.exists():  # a launch that failed stores nothing: the next worker to ask tries again
            results = launch_every_case(world_size)
            partial = stored.with_suffix(".partial")
            partial.write_bytes(pickle.dumps(results))
            os.replace(partial, stored)
        return pickle.loads(stored.read_bytes())


def launch_every_case(world_size):
    by_rank = launch(run_cases, world_size, EVERY_CASE, timeout=LAUNCH_TIMEOUT)
    return [[by_rank[rank][i] for rank in range(world_size)] for i in range(len(EVERY_CASE))]


def assert_equal_to_one_process(results, case):
    """Every rank's output and gradients (input and parameters) within the case's dtype's tolerance."""
    case = full_case(case)
    for rank, result in enumerate(results):
        errors = result["errors"]
        assert len(errors) > 3  # the output, x's gradient, and the parameters'
        worst = max(errors, key=errors.get)
        assert errors[worst] < TOLERANCE[case["dtype"]], (rank, worst, errors[worst])
