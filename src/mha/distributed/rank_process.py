"""What runs in each rank's process that `mha.distributed.launch` starts, and `rank_device`.

    python -c "from mha.distributed.rank_process import main; main()" DIRECTORY RANK

A rank reads the job (fn, its arguments, world_size, backend, timeout) from DIRECTORY/job.pkl,
joins the process group, touches rank<r>.joined, runs fn(rank, world_size, *args) and writes
rank<r>.result: ("ok", result), or ("error", record) with the exception pickled (when it pickles),
its type, message, formatted traceback and the time it was raised. Files are written whole, then
renamed, so the caller never reads half of one. The caller's side is `mha.distributed.launcher`.

A rank watches its caller, and ends itself if the caller dies; it ends without the interpreter's
teardown (seconds, once torch is imported), its result written and its streams flushed.
"""

import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

WATCH_PARENT_SECONDS = 0.5  # how often a rank checks that its caller still lives


def rank_device():
    """The device this rank computes on: cuda:rank under NCCL, else the CPU (also outside a
    process group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", dist.get_rank())
    return torch.device("cpu")


# --- The files of a call, in its directory: what a rank writes and its caller reads ---

def job_path(directory):
    return Path(directory) / "job.pkl"


def log_path(directory, rank):
    return Path(directory) / f"rank{rank}.log"


def result_path(directory, rank):
    return Path(directory) / f"rank{rank}.result"


def joined_path(directory, rank):
    return Path(directory) / f"rank{rank}.joined"


def write_atomically(path, data):
    """Write to a temporary name, then rename: the caller never reads half a file."""
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


# --- One rank ---

def run_rank(directory, rank):
    """Join the process group, run fn, write its result (or its exception) for the caller."""
    watch_parent()
    try:
        job = pickle.loads(job_path(directory).read_bytes())
        join_group(job, rank)
        joined_path(directory, rank).touch()
        result = job["fn"](rank, job["world_size"], *job["args"])
        data = pickled_result(result, rank)
    except BaseException as error:
        write_atomically(result_path(directory, rank), pickle.dumps(("error", error_record(error))))
        return 1
    write_atomically(result_path(directory, rank), data)
    try:
        leave_group()
    except Exception:  # the result is delivered; a peer that failed is the caller's news
        traceback.print_exc()
    return 0


def join_group(job, rank):
    if job["backend"] == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(job["backend"], init_method="env://", rank=rank, world_size=job["world_size"],
                            timeout=timedelta(seconds=job["timeout"]))


def leave_group():
    """Wait for the others (rank 0 holds the group's store), then leave."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def pickled_result(result, rank):
    try:
        return pickle.dumps(("ok", result))
    except Exception as error:
        raise TypeError(f"the result of fn in rank {rank}, of type {type(result).__name__}, cannot be pickled to "
                        f"send it back to the caller: {type(error).__name__}: {error}") from error


def error_record(error):
    """What the caller needs to raise this exception again: itself pickled (when it pickles),
    its type, message and formatted traceback, and when it was raised."""
    record = dict(type=type(error).__qualname__, message=str(error), time=time.time(), exception=None,
                  unpicklable=None, traceback="".join(traceback.format_exception(error)))
    try:
        record["exception"] = pickle.dumps(error)
    except Exception as why:
        record["unpicklable"] = f"it does not pickle: {type(why).__name__}: {why}"
    return record


def watch_parent():
    """End this rank if the caller dies (killed too hard to stop its ranks): no rank outlives it."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(WATCH_PARENT_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="watch-parent").start()


def exit_now(code):
    """End the process without the interpreter's teardown, which takes seconds once torch is
    imported: the result is written, and only the standard streams need flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    """A rank's process: python -c RANK_ENTRY DIRECTORY RANK (launcher.RANK_ENTRY)."""
    directory, rank = sys.argv[1:3]
    exit_now(run_rank(directory, int(rank)))


if __name__ == "__main__":
    main()
