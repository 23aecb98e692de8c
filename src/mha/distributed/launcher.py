"""Run a function in several processes, each one rank of a `torch.distributed` process group.

    launch(fn, world_size, *args, timeout=60.0, port=None, backend=None) -> [fn's result in rank 0, 1, ...]

What it does:
- starts `world_size` new Python processes (subprocess, running `rank_process.main()`; never
  multiprocessing, whose resource tracker outlives the call); each joins a process group
  (`init_process_group` with MASTER_ADDR 127.0.0.1, the port, its rank, `world_size` and
  `timeout`), runs `fn(rank, world_size, *args)` and sends its result back pickled;
- the backend: "nccl" when every rank has a GPU of its own and the course computes on CUDA
  (mha.torch.default_device(); MHA_DEVICE=cpu says otherwise), rank r on cuda:r (`rank_device()`
  says which), else "gloo", which runs on any CPU;
- `fn` travels by name, so it must be importable: a lambda, a function of a notebook cell
  (`__main__`) or one defined inside another function is refused with a TypeError before any
  process starts. Define it in a module, e.g. the library;
- the children see the caller's environment, with PYTHONPATH set to the caller's `sys.path` (what
  imports here imports there) and OMP_NUM_THREADS = cores // world_size unless already set;
- what the ranks print, warn or log (from C++ too) goes to one log file per rank, never to the
  caller's output; an error shows the last lines of the failing rank's log;
- `port=None` picks a free port; a port given that is in use raises PortInUseError before any
  process starts.

Failures, each one exception in the caller, with every process of the call gone and its
temporary files removed (also after a KeyboardInterrupt):
- a rank raises: the others are killed at once (the caller looks every 50 ms) and the rank's own
  exception is raised, same type and message, with a note naming the rank and the rank's
  traceback as its `__cause__`; an exception that cannot be rebuilt here becomes a RankError;
- a rank ends without a result (killed, os._exit, a crash): RankError with its exit code;
- the call takes longer than `timeout` seconds (say, a rank never reaches a collective that the
  others wait in): LaunchTimeout, naming the ranks that had not finished and whether each had
  joined the process group.

The parts of this call, one module each: this one is the caller's side (checking the arguments,
starting the ranks, watching them, stopping them); `mha.distributed.rank_process` is the rank's
side (joining the group, running fn, writing its result; `rank_device`); and
`mha.distributed.launch_errors` holds the exceptions and how a failed rank is reported.

Why not `torch.distributed.elastic`, which starts processes, redirects their logs and writes error
files (`start_processes`, `@record`)? Each part would change what the caller sees:
- process start: `PContext.start()` installs its own handlers of SIGINT, SIGTERM, SIGHUP and SIGQUIT
  in the caller's main thread, so that an interrupt (a notebook's stop button) raises its
  SignalException instead of KeyboardInterrupt, and they stay installed after the call;
- logs: a rank's stdout and stderr go to two files, so the tail in an error can no longer show
  them interleaved as they were written; the children inherit the caller's stdin;
- error files: `@record` writes JSON holding the message and the traceback as text, dated in
  whole seconds, so the caller could not raise the rank's own exception (its type, its fields),
  nor tell which of two ranks that failed in the same second failed first;
- stopping: `close()` sends SIGTERM by default and waits up to 30 s before SIGKILL, where this
  call kills the ranks' process groups at once;
- results: a string entrypoint (a new Python, as here) hands no return value back at all; a
  function entrypoint would start the ranks with multiprocessing, refused above.
So this module keeps its own `subprocess.Popen` (stdout and stderr to one log per rank), its own
result file per rank (the exception pickled) and its own stop.
"""

import errno
import functools
import math
import numbers
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from mha.distributed.launch_errors import (
    LaunchTimeout, PortInUseError, RankError, RemoteTraceback, failed_call_error, timeout_error,
)
from mha.distributed.rank_process import job_path, joined_path, log_path, rank_device, result_path
from mha.torch.devices import default_device

BACKENDS = (None, "gloo", "nccl")
POLL_SECONDS = 0.05  # how often the caller looks at the ranks
FAILURE_GRACE_SECONDS = 0.1  # after a first failure, time for its consequences to show, so the cause is named
LOG_TAIL_LINES = 20
# A rank's process runs rank_process.main() (not `python -m mha.distributed.rank_process`, which would
# run that module a second time, as __main__, beside the copy that the package mha.distributed imports).
RANK_ENTRY = "from mha.distributed.rank_process import main; main()"

# What callers import from here: launch, and the names its errors and its ranks use.
__all__ = ["LaunchTimeout", "PortInUseError", "RankError", "RemoteTraceback", "launch", "rank_device"]


def launch(fn, world_size, *args, timeout=60.0, port=None, backend=None):
    """Run fn(rank, world_size, *args) in `world_size` new processes, one per rank of a
    torch.distributed process group, and return their results as a list, by rank.

    fn: an importable function (defined at the top level of a module, not in a notebook cell);
    fn, args and the results must pickle. world_size: P >= 1. timeout: seconds for the whole
    call, also the process group's timeout. port: the rendezvous port, None for a free one.
    backend: None (NCCL when there is a GPU per rank, else gloo), "gloo" or "nccl".

    Raises the failing rank's own exception, RankError, LaunchTimeout or PortInUseError (see the
    module's docstring); TypeError or ValueError for bad arguments, before any process starts.
    """
    world_size = checked_world_size(world_size)
    timeout = checked_timeout(timeout)
    backend = chosen_backend(backend, world_size)
    check_importable(fn)
    job = pickled_job(fn, args, world_size, backend, timeout)
    port = free_port() if port is None else checked_free_port(port)
    directory = Path(tempfile.mkdtemp(prefix="mha-launch-"))
    ranks = []
    try:
        job_path(directory).write_bytes(job)
        deadline = time.monotonic() + timeout
        environment = child_environment(world_size, port)
        for rank in range(world_size):
            ranks.append(Rank.start(rank, world_size, directory, environment))
        return collect(ranks, deadline, timeout)
    finally:
        stop(ranks)
        shutil.rmtree(directory, ignore_errors=True)


# --- Checking the arguments, before any process starts ---

def checked_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(f"world_size must be an int (the number of ranks), got {type(world_size).__name__} "
                        f"{world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return int(world_size)


def checked_timeout(timeout):
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if not (math.isfinite(timeout) and 0 < timeout <= 1e8):
        raise ValueError(f"timeout must be a positive, finite number of seconds (at most 1e8), got {timeout}")
    return float(timeout)


def chosen_backend(backend, world_size):
    """The backend to use: the one asked for, or None -> NCCL when every rank has a GPU, else gloo."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be None, 'gloo' or 'nccl', got {type(backend).__name__} {backend!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be None, 'gloo' or 'nccl', got {backend!r}")
    if not dist.is_available():
        raise RuntimeError("this build of PyTorch has no torch.distributed: launch needs it")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:  # NCCL only where the course computes on CUDA: MHA_DEVICE=cpu keeps the ranks on CPUs
        on_cuda = default_device().type == "cuda"
        return "nccl" if on_cuda and gpus >= world_size and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and (gpus < world_size or not dist.is_nccl_available()):
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) "
                         f"visible{'' if dist.is_nccl_available() else ' and this PyTorch has no NCCL'}; "
                         f"use backend='gloo' (or None) to run on the CPU")
    return backend


def check_importable(fn):
    """Refuse a function that a new process cannot import by name: a lambda, one defined in
    __main__ (a notebook cell, the script being run) or inside another function."""
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(rank, world_size, *args), got {type(fn).__name__} {fn!r}")
    target = fn.func if isinstance(fn, functools.partial) else fn
    named = target if hasattr(target, "__qualname__") else type(target)
    module, qualname = getattr(named, "__module__", None), named.__qualname__
    if "<lambda>" in qualname:
        why = "is a lambda"
    elif module == "__main__":
        why = "was defined in __main__ (a notebook cell or the script being run)"
    elif "<locals>" in qualname:
        why = "was defined inside another function"
    else:
        return
    raise TypeError(f"fn={qualname} {why}, so the new processes cannot import it by name: define it at the "
                    f"top level of a module, e.g. the library (mha.distributed), and import it from there")


def pickled_job(fn, args, world_size, backend, timeout):
    """The job every rank reads, pickled here, so that what cannot travel fails in the caller."""
    job = dict(fn=fn, args=args, world_size=world_size, backend=backend, timeout=timeout)
    try:
        return pickle.dumps(job)
    except Exception as error:
        raise TypeError(f"fn and its arguments must pickle to reach the ranks, and these do not: "
                        f"{type(error).__name__}: {error}") from error


def free_port():
    """A port that no one listens on now (the system picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def checked_free_port(port):
    """The port, after checking that it is an int in 1..65535 that no one listens on.
    Binds it as PyTorch's store will (every address, SO_REUSEADDR), over IPv4 and IPv6."""
    if isinstance(port, bool) or not isinstance(port, numbers.Integral):
        raise TypeError(f"port must be an int or None, got {type(port).__name__} {port!r}")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535 (or None for a free one), got {port}")
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, int(port)))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PortInUseError(int(port)) from error
                raise OSError(error.errno, f"port={port} cannot be bound here ({error.strerror}): pass "
                                           f"another port, or port=None to let launch pick one") from error
    return int(port)


def child_environment(world_size, port):
    """The ranks' environment: the caller's, plus the rendezvous, the caller's sys.path as
    PYTHONPATH, and a share of the cores for each rank unless OMP_NUM_THREADS is set."""
    environment = dict(os.environ)
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path if isinstance(p, str)]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                       LOCAL_WORLD_SIZE=str(world_size))
    environment.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // world_size)))
    environment.setdefault("PYTHONUNBUFFERED", "1")  # a log's last lines are there even if the rank is killed
    environment.setdefault("PYTHONFAULTHANDLER", "1")  # a crash writes its Python traceback into the log
    return environment


def cpu_count():
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# --- The ranks, seen from the caller ---

class Rank:
    """One rank's process, its files in the call's directory, and its outcome once known:
    ("ok", result), ("error", record) or ("died", exit code)."""

    def __init__(self, rank, world_size, directory, process):
        self.rank, self.world_size, self.directory, self.process = rank, world_size, directory, process
        self.outcome, self.failed_at, self.running_at = None, None, time.time()

    @classmethod
    def start(cls, rank, world_size, directory, environment):
        environment = dict(environment, RANK=str(rank), LOCAL_RANK=str(rank))
        command = [sys.executable, "-c", RANK_ENTRY, str(directory), str(rank)]
        with open(log_path(directory, rank), "wb") as log:  # the child's fds 1 and 2 (dup2 by Popen)
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=environment, start_new_session=True)
        return cls(rank, world_size, directory, process)

    def look(self):
        """Update the outcome: the result file once written, or death without one."""
        if self.outcome is not None:
            return
        now = time.time()
        code = exit_code(self.process)  # before looking for the file: a rank writes it, then exits
        result = result_path(self.directory, self.rank)
        if result.exists():
            self.outcome = read_outcome(result.read_bytes())
        elif code is not None:
            self.outcome = ("died", code)
        else:
            self.running_at = now
        if self.failed:
            # An exception says when it was raised; a death happened after the last look that saw the
            # process run. Dated so, a death counts as the cause of the errors it provokes elsewhere.
            kind, detail = self.outcome
            self.failed_at = detail["time"] if kind == "error" else self.running_at

    @property
    def failed(self):
        return self.outcome is not None and self.outcome[0] != "ok"

    @property
    def exited(self):
        return exit_code(self.process) is not None

    @property
    def joined(self):
        return joined_path(self.directory, self.rank).exists()

    def log_tail(self, lines=LOG_TAIL_LINES):
        try:
            text = log_path(self.directory, self.rank).read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def describe_log(self, lines=LOG_TAIL_LINES):
        tail = self.log_tail(lines)
        if not tail:
            return ""
        return f"last lines of rank {self.rank}'s output:\n" + "\n".join("    " + line for line in tail.splitlines())


def collect(ranks, deadline, timeout):
    """Wait for every rank's result (looking every POLL_SECONDS), or the first failure, or the deadline."""
    while True:
        for rank in ranks:
            rank.look()
        if any(rank.failed for rank in ranks):
            pause(FAILURE_GRACE_SECONDS)
            for rank in ranks:
                rank.look()
            raise failed_call_error(ranks)
        finished = all(rank.outcome is not None for rank in ranks)
        if finished and (all(rank.exited for rank in ranks) or time.monotonic() >= deadline):
            return [rank.outcome[1] for rank in ranks]  # a rank slow to exit after its result is stopped
        if time.monotonic() >= deadline:
            raise timeout_error(ranks, timeout)
        pause(POLL_SECONDS)


def pause(seconds):
    """Sleep between two looks at the ranks (a function of its own, so that a test can interrupt it)."""
    time.sleep(seconds)


def read_outcome(data):
    """("ok", result) or ("error", record) from a rank's result file, or ("unreadable", why)
    for a result that does not unpickle here (its class is not importable here, say)."""
    try:
        return pickle.loads(data)
    except Exception as why:
        return ("unreadable", f"{type(why).__name__}: {why}")


def exit_code(process):
    """The exit code of a rank's process (negative: the signal that killed it), None while it runs.
    Looks without reaping it, so that its process group stays its own until `stop` kills it."""
    if process.returncode is not None or not hasattr(os, "waitid"):
        return process.poll()
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return process.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def stop(ranks):
    """Kill every rank's process group (its children too) that is still there, then reap them all."""
    for rank in ranks:
        if rank.process.returncode is None:
            try:
                os.killpg(rank.process.pid, signal.SIGKILL)
            except (AttributeError, ProcessLookupError, PermissionError):
                rank.process.kill()
    for rank in ranks:
        rank.process.wait()
