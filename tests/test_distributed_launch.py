"""mha.distributed.launch: results come back by rank; every fault is one clear error in the caller,
within its timeout, with no process and no temporary file left behind.

A launch starts Python and torch in every rank (seconds on 2 cores), so this file launches only
8 times; the checks of bad arguments start no process (a test proves it by forbidding Popen).
Every test, through the fixture `no_leftovers`, checks that it leaves no child process of this
one (read from /proc) and no temporary file.
"""

import errno
import functools
import math
import os
import pickle
import socket
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest

from mha.distributed.tensor import query_heads
import torch

from mha.distributed import faults, launch_errors, launcher
from mha.distributed.launcher import LaunchTimeout, PortInUseError, RankError, RemoteTraceback, launch

PROC = Path("/proc")


def child_pids():
    """The ids of the processes whose parent is this process (field 4 of /proc/<pid>/stat)."""
    children = []
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while we looked
            continue
        state_and_ppid = text[text.rindex(")") + 2:].split()[:2]  # the name may hold spaces: skip past it
        if int(state_and_ppid[1]) == os.getpid():
            children.append(int(stat.parent.name))
    return children


def written_pids(directory):
    """The process ids that the ranks wrote (faults.report_pid), by rank."""
    return {int(p.stem.removeprefix("rank")): int(p.read_text()) for p in Path(directory).glob("rank*.pid")}


def assert_gone(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # signal 0: only asks whether the process exists (a zombie would)


@pytest.fixture(autouse=True)
def no_leftovers(tmp_path, monkeypatch):
    """Each test: launch's temporary files go to a directory of its own, empty afterwards, and
    no child process of this one is left."""
    temporary = tmp_path / "launch-tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    before = set(child_pids()) if PROC.is_dir() else set()
    yield
    assert list(temporary.iterdir()) == [], "launch left temporary files"
    if PROC.is_dir():
        assert set(child_pids()) - before == set(), "launch left child processes"


@pytest.fixture
def no_process_may_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"launch started a process: {args}")
    monkeypatch.setattr(launcher.subprocess, "Popen", refuse)


# --- Launches that work ---

def test_results_come_back_by_rank_with_the_all_reduced_sum_and_tensors_intact():
    results = launch(faults.summed_ranks, 2, timeout=60)
    assert [result[:3] for result in results] == [(0, 2, 3.0), (1, 2, 3.0)]  # 1 + 2 summed over the ranks
    for rank, (_, _, _, tensor) in enumerate(results):
        expected = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1)
        assert tensor.dtype == torch.float64 and tensor.shape == (2, 3)
        assert torch.equal(tensor, expected)


def test_what_ranks_print_and_warn_never_reaches_the_callers_output(capfd):
    with socket.socket() as probe:  # a port that is free, given by the user this time
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = launch(faults.noisy, 2, timeout=60, port=port, backend="gloo")
    assert results == [0, 1]
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert caught == []


# --- Faults: each one clear error, in time, with every process gone ---

def test_a_rank_that_raises_raises_its_own_exception_in_the_caller_quickly(tmp_path):
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        launch(faults.raise_in_rank, 2, 1, str(tmp_path), timeout=60)
    assert str(info.value) == "planned failure in rank 1"  # its own type and message; the rest in notes
    assert time.monotonic() - start < 30  # not the 60 s timeout: the others were stopped at once
    notes = "\n".join(info.value.__notes__)
    assert "raised in rank 1 of 2" in notes
    assert "rank 1 is about to fail" in notes  # the tail of the rank's output
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "raise_in_rank" in str(info.value.__cause__)
    assert "ValueError: planned failure in rank 1" in str(info.value.__cause__)
    pids = written_pids(tmp_path)
    assert 1 in pids
    assert_gone(pids.values())


def test_a_rank_that_never_reaches_the_collective_ends_in_a_timeout(tmp_path):
    timeout = 10.0
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(faults.block_before_collective, 2, 1, str(tmp_path), timeout=timeout)
    assert time.monotonic() - start < timeout + 3
    pids = written_pids(tmp_path)
    assert sorted(pids) == [0, 1], "the machine took over 10 s to start 2 ranks: this test saw no blocked rank"
    message = str(info.value)
    assert message.startswith("ranks 0, 1 of 2 did not finish within 10 s (all had joined the process group)")
    assert "rank 1 sleeps before the all-reduce" in message  # the tail of the blocked rank's output
    assert (info.value.ranks, info.value.joined) == ([0, 1], [0, 1])
    assert isinstance(info.value, TimeoutError)
    assert_gone(pids.values())


def test_a_world_size_that_does_not_divide_the_heads_is_a_value_error_from_every_rank():
    with pytest.raises(ValueError, match=r"^n_heads=6 is not divisible by world_size=4") as info:
        launch(faults.split_heads_over_ranks, 4, 6, timeout=60)
    assert any(note.startswith("raised in rank ") and " of 4 " in note for note in info.value.__notes__)
    assert list(query_heads(6, 2, 1)) == [3, 4, 5]  # the library's split, where P divides h


def test_a_rank_that_dies_without_a_result_is_a_rank_error_with_its_exit_code(tmp_path):
    with pytest.raises(RankError, match=r"^rank 0 of 2 exited with code 3 without a result") as info:
        launch(faults.exit_without_result, 2, 0, 3, str(tmp_path), timeout=60)
    assert (info.value.rank, info.value.exit_code) == (0, 3)
    assert "rank 0 exits with code 3" in str(info.value)  # the tail of its output
    assert_gone(written_pids(tmp_path).values())


def test_an_exception_that_does_not_unpickle_becomes_a_rank_error_naming_it():
    with pytest.raises(RankError, match=r"^rank 0 of 1 raised TwoPartError: rank 0 failed because it was told to"
                       ) as info:
        launch(faults.raise_unrebuildable, 1, timeout=60)
    assert "raise_unrebuildable" in str(info.value.__cause__)


def test_a_keyboard_interrupt_in_the_caller_leaves_no_process(tmp_path, monkeypatch):
    def interrupt_once_both_ranks_run(seconds):
        if len(written_pids(tmp_path)) == 2:
            raise KeyboardInterrupt
        time.sleep(seconds)

    monkeypatch.setattr(launcher, "pause", interrupt_once_both_ranks_run)
    with pytest.raises(KeyboardInterrupt):
        launch(faults.block_before_collective, 2, 1, str(tmp_path), timeout=60)
    pids = written_pids(tmp_path)
    assert sorted(pids) == [0, 1]
    assert_gone(pids.values())


# --- Refused before any process starts ---

@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0"])
def test_a_port_in_use_is_refused_before_any_process_starts(address, no_process_may_start):
    with socket.socket() as holder:
        holder.bind((address, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port={port} is already in use") as info:
            launch(faults.summed_ranks, 2, port=port)
    assert isinstance(info.value, OSError) and isinstance(info.value, ValueError)
    assert (info.value.errno, info.value.port) == (errno.EADDRINUSE, port)


def make_local_function():
    def local_function(rank, world_size):
        return rank
    return local_function


def notebook_function():
    """A function as a notebook cell defines it: its module is __main__."""
    namespace = {"__name__": "__main__"}
    exec("def cell_function(rank, world_size):\n    return rank\n", namespace)
    return namespace["cell_function"]


@pytest.mark.parametrize("fn,why", [
    (lambda rank, world_size: rank, "is a lambda"),
    (functools.partial(lambda rank, world_size, x: x, x=1), "is a lambda"),
    (make_local_function(), "was defined inside another function"),
    (notebook_function(), r"was defined in __main__ \(a notebook cell"),
], ids=["lambda", "partial-of-lambda", "local", "notebook-cell"])
def test_a_function_that_cannot_be_imported_is_refused(fn, why, no_process_may_start):
    with pytest.raises(TypeError, match=why) as info:
        launch(fn, 2)
    assert "define it at the top level of a module, e.g. the library" in str(info.value)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(world_size=0), ValueError, "world_size must be at least 1, got 0"),
    (dict(world_size=-2), ValueError, "world_size must be at least 1, got -2"),
    (dict(world_size=2.0), TypeError, "world_size must be an int .*got float 2.0"),
    (dict(world_size=True), TypeError, "world_size must be an int .*got bool True"),
    (dict(world_size="2"), TypeError, "world_size must be an int .*got str '2'"),
    (dict(timeout=0), ValueError, "timeout must be a positive, finite number of seconds .*got 0"),
    (dict(timeout=-5.0), ValueError, "timeout must be a positive.*got -5.0"),
    (dict(timeout=math.inf), ValueError, "timeout must be a positive.*got inf"),
    (dict(timeout=math.nan), ValueError, "timeout must be a positive.*got nan"),
    (dict(timeout="10"), TypeError, "timeout must be a number of seconds, got str '10'"),
    (dict(timeout=None), TypeError, "timeout must be a number of seconds, got NoneType None"),
    (dict(port=0), ValueError, r"port must be in 1\.\.65535 .*got 0"),
    (dict(port=70000), ValueError, r"port must be in 1\.\.65535 .*got 70000"),
    (dict(port="29500"), TypeError, "port must be an int or None, got str '29500'"),
    (dict(port=1.5), TypeError, "port must be an int or None, got float 1.5"),
    (dict(backend="mpi"), ValueError, "backend must be None, 'gloo' or 'nccl', got 'mpi'"),
    (dict(backend=3), TypeError, "backend must be None, 'gloo' or 'nccl', got int 3"),
    (dict(fn=3), TypeError, r"fn must be a function fn\(rank, world_size, \*args\), got int 3"),
    (dict(args=(threading.Lock(),)), TypeError, "fn and its arguments must pickle"),
])
def test_bad_arguments_are_refused_naming_what_was_expected_and_given(kwargs, error, match, no_process_may_start):
    call = dict(fn=faults.summed_ranks, world_size=2, args=(), timeout=10.0, port=None, backend=None) | kwargs
    with pytest.raises(error, match=match):
        launch(call["fn"], call["world_size"], *call["args"], timeout=call["timeout"], port=call["port"],
               backend=call["backend"])


def test_nccl_without_a_gpu_per_rank_is_refused_naming_the_counts(no_process_may_start):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"backend='nccl' needs one GPU per rank: world_size={gpus + 1} but "
                                         f"{gpus} GPU"):
        launch(faults.summed_ranks, gpus + 1, backend="nccl")


# --- The small parts ---

@pytest.mark.parametrize("unfinished,joined,phrase", [
    ([1], [1], "it had joined the process group"),
    ([1], [], "it had not joined the process group"),
    ([0, 2, 3], [0, 2, 3], "all had joined the process group"),
    ([0, 2, 3], [], "none had joined the process group"),
    ([0, 2, 3], [0, 2], "ranks 0, 2 had joined the process group, rank 3 had not"),
])
def test_the_timeout_message_says_which_ranks_had_joined(unfinished, joined, phrase):
    assert launch_errors.joined_phrase(unfinished, joined) == phrase


@pytest.mark.parametrize("error", [PortInUseError(29500), RankError("rank 1 of 2 exited", rank=1, exit_code=3),
                                   LaunchTimeout("rank 0 of 2 did not finish", ranks=[0], joined=[])])
def test_the_launchers_exceptions_construct_and_survive_pickling(error):
    error.add_note("a note")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.__notes__) == (type(error), str(error), ["a note"])
    assert vars(copy) == vars(error)  # port, rank, exit_code, ranks, joined, notes


def test_rank_device_is_the_cpu_outside_a_process_group():
    assert launcher.rank_device() == torch.device("cpu")


def test_a_rank_sees_the_callers_sys_path_and_a_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    environment = launcher.child_environment(world_size=2, port=12345)
    assert environment["PYTHONPATH"].split(os.pathsep)[:1] == [os.path.abspath(launcher.sys.path[0] or ".")]
    assert environment["OMP_NUM_THREADS"] == str(max(1, launcher.cpu_count() // 2))
    assert (environment["MASTER_ADDR"], environment["MASTER_PORT"]) == ("127.0.0.1", "12345")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert launcher.child_environment(world_size=2, port=12345)["OMP_NUM_THREADS"] == "7"
