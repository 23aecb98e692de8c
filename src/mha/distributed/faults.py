"""Rank functions that work, fail or hang on purpose: what the launcher's tests launch.

Each is fn(rank, world_size, ...) for `mha.distributed.launch`, importable because it lives
here. Those that fail first write their process id into `directory` (a file `rank<r>.pid`), so
that a test can check afterwards that no process of the call is left.
"""

import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from mha.distributed.launcher import rank_device
from mha.distributed.tensor import tensor_parallel
from mha.torch.attention import MultiHeadAttention

FOREVER = 3600.0  # seconds: longer than any test waits


def report_pid(directory, rank):
    """Write this process's id into directory/rank<r>.pid (written whole, then renamed)."""
    path = Path(directory) / f"rank{rank}.pid"
    path.with_suffix(".partial").write_text(str(os.getpid()))
    os.replace(path.with_suffix(".partial"), path)


def summed_ranks(rank, world_size):
    """(rank, P, the all-reduced sum of rank + 1 over the ranks, a tensor made from the rank).
    The sum is P (P + 1) / 2; the tensor is arange(6) reshaped (2, 3), times rank + 1, float64."""
    value = torch.tensor([rank + 1.0], device=rank_device())
    dist.all_reduce(value)
    tensor = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1)  # (2, 3)
    return rank, world_size, value.item(), tensor


def noisy(rank, world_size):
    """Print, warn and write to the file descriptors directly, then join an all-reduce: none of it
    may reach the caller's output. Returns the rank."""
    print(f"rank {rank} prints to stdout")
    print(f"rank {rank} prints to stderr", file=sys.stderr)
    warnings.warn(f"rank {rank} warns", UserWarning)
    os.write(1, f"rank {rank} writes to fd 1\n".encode())
    os.write(2, f"rank {rank} writes to fd 2\n".encode())
    value = torch.ones(1, device=rank_device())
    dist.all_reduce(value)
    return rank


def raise_in_rank(rank, world_size, failing_rank, directory):
    """`failing_rank` prints a line and raises ValueError; the others wait in an all-reduce that
    never completes."""
    report_pid(directory, rank)
    if rank == failing_rank:
        print(f"rank {rank} is about to fail")
        raise ValueError(f"planned failure in rank {rank}")
    dist.all_reduce(torch.ones(1, device=rank_device()))
    return rank


def block_before_collective(rank, world_size, blocked_rank, directory):
    """`blocked_rank` sleeps before the all-reduce that the others already wait in: a rank that
    never joins the collective."""
    report_pid(directory, rank)
    if rank == blocked_rank:
        print(f"rank {rank} sleeps before the all-reduce")
        time.sleep(FOREVER)
    dist.all_reduce(torch.ones(1, device=rank_device()))
    return rank


def exit_without_result(rank, world_size, dying_rank, code, directory):
    """`dying_rank` ends its process at once with exit code `code` (no exception, no result);
    the others wait in an all-reduce."""
    report_pid(directory, rank)
    if rank == dying_rank:
        print(f"rank {rank} exits with code {code}", flush=True)
        os._exit(code)
    dist.all_reduce(torch.ones(1, device=rank_device()))
    return rank


class TwoPartError(Exception):
    """An exception that pickles but does not unpickle: its __init__ takes two arguments, its
    args hold one message (a common pattern, which pickle cannot undo)."""

    def __init__(self, what, why):
        super().__init__(f"{what} failed because {why}")


def raise_unrebuildable(rank, world_size):
    """Every rank raises TwoPartError, which the caller cannot rebuild from its pickle."""
    raise TwoPartError(f"rank {rank}", "it was told to")


def split_heads_over_ranks(rank, world_size, n_heads):
    """The query heads this rank holds in tensor_parallel(MultiHeadAttention) with h = n_heads:
    the library's own ValueError in every rank when P does not divide h."""
    module = MultiHeadAttention(2 * n_heads, n_heads)
    return list(tensor_parallel(module).heads)
