"""Run a function in several processes, each one rank of a `torch.distributed` process group.

    launch(fn, world_size, *args, timeout=60.0, port=None, backend=None) -> [fn's result in rank 0, 1, ...]

What it does:
- starts `world_size` new Python processes (subprocess, running this module's main(); never
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
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from mha.torch.devices import default_device

BACKENDS = (None, "gloo", "nccl")
POLL_SECONDS = 0.05  # how often the caller looks at the ranks
FAILURE_GRACE_SECONDS = 0.1  # after a first failure, time for its consequences to show, so the cause is named
LOG_TAIL_LINES = 20
WATCH_PARENT_SECONDS = 0.5  # how often a rank checks that its caller still lives
# A rank's process runs main() (not `python -m mha.distributed.launcher`, which would run this
# module a second time, as __main__, beside the copy that the package mha.distributed imports).
RANK_ENTRY = "from mha.distributed.launcher import main; main()"


class RankError(RuntimeError):
    """A rank failed and its own exception could not be raised here: it died without a result,
    or its exception (or its result) could not be unpickled. `rank` says which."""

    def __init__(self, message, rank=None, exit_code=None):
        super().__init__(message)
        self.rank, self.exit_code = rank, exit_code

    def __reduce__(self):  # pickle the keywords too (a launch inside a rank sends it on)
        return type(self), (self.args[0], self.rank, self.exit_code), self.__dict__


class LaunchTimeout(TimeoutError):
    """The ranks did not all finish within the timeout. `ranks`: those that had not finished;
    `joined`: those of them that had joined the process group."""

    def __init__(self, message, ranks=(), joined=()):
        super().__init__(message)
        self.ranks, self.joined = list(ranks), list(joined)

    def __reduce__(self):
        return type(self), (self.args[0], self.ranks, self.joined), self.__dict__


class PortInUseError(OSError, ValueError):
    """The port given to launch is already in use. An OSError (what binding it raises) and a
    ValueError (a bad argument)."""

    def __init__(self, port):
        super().__init__(errno.EADDRINUSE, f"port={port} is already in use on this machine: pass another "
                                           f"port, or port=None to let launch pick a free one")
        self.port = port

    def __reduce__(self):
        return type(self), (self.port,), self.__dict__


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a rank, as text: the `__cause__` of the exception
    re-raised in the caller (as concurrent.futures does for its worker processes)."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return self.text


def rank_device():
    """The device this rank computes on: cuda:rank under NCCL, else the CPU (also outside a
    process group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", dist.get_rank())
    return torch.device("cpu")


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
        (directory / "job.pkl").write_bytes(job)
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

    def error(self):
        """The exception that tells the caller how this failed rank failed."""
        kind, detail = self.outcome
        if kind == "died":
            return RankError(f"rank {self.rank} of {self.world_size} {how_it_ended(detail)} without a result"
                             + with_log(self.describe_log()), rank=self.rank, exit_code=detail)
        if kind == "unreadable":
            return RankError(f"rank {self.rank} of {self.world_size} returned a result that cannot be unpickled "
                             f"in the caller ({detail}): return objects that the caller can import, such as "
                             f"tensors, numbers or arrays", rank=self.rank)
        return rebuilt_exception(detail, self.rank, self.world_size, self.describe_log())


def collect(ranks, deadline, timeout):
    """Wait for every rank's result (looking every POLL_SECONDS), or the first failure, or the deadline."""
    while True:
        for rank in ranks:
            rank.look()
        if any(rank.failed for rank in ranks):
            pause(FAILURE_GRACE_SECONDS)
            for rank in ranks:
                rank.look()
            raise first_failure(ranks)
        finished = all(rank.outcome is not None for rank in ranks)
        if finished and (all(rank.exited for rank in ranks) or time.monotonic() >= deadline):
            return [rank.outcome[1] for rank in ranks]  # a rank slow to exit after its result is stopped
        if time.monotonic() >= deadline:
            raise timeout_error(ranks, timeout)
        pause(POLL_SECONDS)


def pause(seconds):
    """Sleep between two looks at the ranks (a function of its own, so that a test can interrupt it)."""
    time.sleep(seconds)


def first_failure(ranks):
    """The exception of the rank that failed first (its failure often makes the others fail),
    with a note naming the ranks that failed after it."""
    failed = sorted((rank for rank in ranks if rank.failed), key=lambda rank: (rank.failed_at, rank.rank))
    error = failed[0].error()
    if len(failed) > 1:
        later = "; ".join(f"rank {rank.rank}: {summary(rank.outcome)}" for rank in failed[1:])
        error.add_note(f"then other ranks failed too: {later}")
    return error


def summary(outcome):
    kind, detail = outcome
    if kind == "died":
        return how_it_ended(detail)
    if kind == "unreadable":
        return f"returned a result that cannot be unpickled ({detail})"
    return f"{detail['type']}: {detail['message']}".splitlines()[0][:200]


def timeout_error(ranks, timeout):
    unfinished = [rank.rank for rank in ranks if rank.outcome is None]
    joined = [rank.rank for rank in ranks if rank.outcome is None and rank.joined]
    finished = [rank.rank for rank in ranks if rank.outcome is not None]
    message = (f"{ranks_phrase(unfinished)} of {len(ranks)} did not finish within {timeout:g} s "
               f"({joined_phrase(unfinished, joined)})")
    if finished:
        message += f"; {ranks_phrase(finished)} finished"
    message += (". A rank that never reaches a collective the others wait in ends this way, and so does work "
                "longer than the timeout: pass a larger timeout= if the work needs it.")
    if not joined:
        message += " Starting a rank (Python and torch) takes a few seconds of it."
    logs = [rank.describe_log(lines=10) for rank in ranks if rank.outcome is None]
    return LaunchTimeout(message + with_log("\n".join(log for log in logs if log)), ranks=unfinished, joined=joined)


def ranks_phrase(ranks):
    """"rank 1", or "ranks 0, 2, 3"."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def joined_phrase(unfinished, joined):
    if len(unfinished) == 1:
        return "it had joined the process group" if joined else "it had not joined the process group"
    if len(joined) == len(unfinished):
        return "all had joined the process group"
    if not joined:
        return "none had joined the process group"
    missing = [rank for rank in unfinished if rank not in joined]
    return f"{ranks_phrase(joined)} had joined the process group, {ranks_phrase(missing)} had not"


def how_it_ended(code):
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def with_log(text):
    return "\n" + text if text else ""


def rebuilt_exception(record, rank, world_size, log):
    """The rank's own exception, as raised there, when it unpickles here; else a RankError."""
    where = f"raised in rank {rank} of {world_size} (launched by mha.distributed.launch; its traceback above)"
    try:
        error = pickle.loads(record["exception"]) if record["exception"] is not None else None
        if error is not None and not isinstance(error, Exception):  # e.g. SystemExit: never end the caller
            raise TypeError(f"{type(error).__name__} is not an Exception")
    except Exception as why:
        error = None
        reason = f"{type(why).__name__}: {why}"
    else:
        reason = record["unpicklable"]
    if error is None:
        error = RankError(f"rank {rank} of {world_size} raised {record['type']}: {record['message']} "
                          f"(the exception itself could not be rebuilt here: {reason})", rank=rank)
    else:
        error.add_note(where)
    if log:
        error.add_note(log)
    error.__cause__ = RemoteTraceback(f'\n"""\n{record["traceback"].rstrip()}\n"""')
    return error


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


def log_path(directory, rank):
    return Path(directory) / f"rank{rank}.log"


def result_path(directory, rank):
    return Path(directory) / f"rank{rank}.result"


def joined_path(directory, rank):
    return Path(directory) / f"rank{rank}.joined"


# --- A rank, in its own process (main) ---

def run_rank(directory, rank):
    """Join the process group, run fn, write its result (or its exception) for the caller."""
    watch_parent()
    try:
        job = pickle.loads((Path(directory) / "job.pkl").read_bytes())
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


def write_atomically(path, data):
    """Write to a temporary name, then rename: the caller never reads half a file."""
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


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
    """A rank's process: python -c RANK_ENTRY DIRECTORY RANK."""
    directory, rank = sys.argv[1:3]
    exit_now(run_rank(directory, int(rank)))


if __name__ == "__main__":
    main()
