"""What the tests of mha.distributed's schemes share: one launch per world size running every case,
and the check that a case equals one process on every rank (tests/test_distributed_*.py)."""

from mha.distributed import launch
from mha.distributed.equivalence import full_case, run_cases

TOLERANCE = {"float32": 1e-5, "float64": 1e-12}  # relative, of the output and of every gradient
WORLD_SIZES = (2, 4)


def launch_cases(cases, world_sizes=WORLD_SIZES):
    """{P: [per case: [per rank: result]]} for cases [(name, case)]: one launch per world size."""
    out = {}
    for world_size in world_sizes:
        by_rank = launch(run_cases, world_size, [case for _, case in cases], timeout=240)
        out[world_size] = [[by_rank[rank][i] for rank in range(world_size)] for i in range(len(cases))]
    return out


def assert_equal_to_one_process(results, case):
    """Every rank's output and gradients (input and parameters) within the case's dtype's tolerance."""
    case = full_case(case)
    for rank, result in enumerate(results):
        errors = result["errors"]
        assert len(errors) > 3  # the output, x's gradient, and the parameters'
        worst = max(errors, key=errors.get)
        assert errors[worst] < TOLERANCE[case["dtype"]], (rank, worst, errors[worst])
