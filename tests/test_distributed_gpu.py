"""On a machine with a GPU: one rank with NCCL runs every scheme on the GPU and equals one process.

The lent machines have one GPU, so this is a smoke test of the NCCL path at world_size = 1 (every
collective then moves nothing), not a test of several GPUs. Without CUDA it is skipped; the same
schemes are proven for P = 2 and 4 on the CPU (tests/test_distributed_*.py).
"""

import pytest
import torch

from mha.distributed import launch
from mha.distributed.equivalence import run_cases

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")

CASES = [
    dict(scheme="tensor", module="mha", seed=41, causal=True, padding=True),
    dict(scheme="tensor", module="lm", seed=42, padding=True),
    dict(scheme="tensor_vs_torch", module="encoder", seed=43, padding=True),
    dict(scheme="ulysses", module="gqa", seed=44, causal=True, padding=True),
    dict(scheme="ring", module="mha", seed=45, causal=True, padding=True),
    dict(scheme="ring", module="gqa", seed=46, layout="contiguous", causal=True),
]


def test_nccl_world_size_1_equals_one_process():
    (results,) = launch(run_cases, 1, CASES, backend="nccl", timeout=180)
    for case, result in zip(CASES, results):
        errors = result["errors"]
        worst = max(errors, key=errors.get)
        assert errors[worst] < 1e-5, (case, worst, errors[worst])
        assert all(v["elements"] >= 0 for v in result["traffic"]["payload"].values())
