"""Where a student's code runs: a worker process, walled off by the operating system.

    worker = Worker(folder, absent=("softmax", "log_softmax"), packages=(), limits=Limits())
    worker.run(cells, seconds)                      # the student's code
    worker.call("softmax", args, kwargs, seconds)   # one call: the reply, in plain data
    worker.close()

Each worker gets its own temporary folder holding the student edition of `mha`
(grading/student_edition.py) and the worker's two files, and runs there under
Debian's bubblewrap when it is installed: the whole system read-only; the project
(the full library, the grader), the folders of the submissions, of the grades and
of the manifest covered by empty folders; /tmp private; no network; its own process
tree, killed with the grader. The worker's environment is emptied: its path holds the
student edition, then the third-party packages, of which torch, scipy (unless the
exercise allows it) and the other packages that compute attention are hidden.

Without bubblewrap, the worker still runs in its own folder with that path and those
packages refused at import, and the grader says in its report that the isolation
is the folder's and the path's alone: a determined student could read the library.

Limits: the time of each request, the memory of the process (RLIMIT_DATA: RLIMIT_AS
would stop torch's own import elsewhere), and the whole process group killed at a limit.
"""

import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from grading import wire
from grading import student_edition

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BWRAP = shutil.which("bwrap")
# Packages that compute what the exercises ask for (softmax, attention, norms): never importable.
ALWAYS_HIDDEN = ("torch", "functorch", "torchgen", "jax", "jaxlib", "tensorflow", "keras", "sklearn",
                 "transformers", "tokenizers", "einops", "numba", "cupy", "mha_full")
MAYBE_HIDDEN = ("scipy",)  # hidden unless the exercise lists it in `packages`
STDERR = None if os.environ.get("MHA_GRADER_DEBUG") else subprocess.DEVNULL  # the worker's own errors
SANDBOX = Path("/tmp/sandbox")  # where the worker's folder appears inside bubblewrap (in its private /tmp)


@dataclass(frozen=True)
class Limits:
    """What one notebook may use: seconds per request, seconds in all, memory per worker."""
    cell_seconds: float = 60
    notebook_seconds: float = 300
    memory_bytes: int = 4 * 2**30


class LimitReached(Exception):
    """The worker ran past a limit and was killed; the message says which."""


def bubblewrap_works():
    """True when bubblewrap is installed and can make a sandbox here (it needs namespaces)."""
    if BWRAP is None:
        return False
    probe = subprocess.run([BWRAP, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "true"],
                           capture_output=True)
    return probe.returncode == 0


ISOLATION = "bubblewrap" if bubblewrap_works() else "folder and path only"


def hidden_packages(packages):
    """The packages that the worker of an exercise allowing `packages` goes without."""
    return tuple(p for p in ALWAYS_HIDDEN + MAYBE_HIDDEN if p not in packages)


def package_folders(names):
    """The folders (and single-file modules) of the installed packages `names`."""
    found = []
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for name in names:
            for candidate in (Path(site) / name, Path(site) / f"{name}.py"):
                if candidate.exists():
                    found.append(candidate)
    return found


def inside(path, folder):
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def bubblewrap_command(folder, hidden, covered):
    """bwrap's arguments: a read-only system, `covered` folders emptied, `hidden` packages emptied,
    Python's own folders bound again if a covered folder (or /tmp) held them, and `folder` at SANDBOX."""
    command = [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
               "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
               "--new-session"]
    for path in covered:
        command += ["--tmpfs", str(path)]
    python_folders = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["purelib"],
                                                 sysconfig.get_paths()["platlib"])}
    for path in sorted(python_folders):  # a virtual environment in the project, or in /tmp, stays visible
        if any(inside(path, c) for c in [*covered, "/tmp"]):
            command += ["--ro-bind", str(path), str(path)]
    for path in package_folders(hidden):
        command += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    return command + ["--bind", str(folder), str(SANDBOX), "--chdir", str(SANDBOX)]


def environment(home):
    """The worker's whole environment: no variable of the grader's survives."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
            "PYTHONPATH": str(home / "lib"), "PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


def descendants(pid):
    """The process ids below `pid`, depth first (Linux's /proc)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [p for child in map(int, children) for p in [child, *descendants(child)]]


def memory_status(pid):
    """{"VmRSS": bytes, "VmHWM": bytes} of process `pid`."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


class Worker:
    """One worker process for one exercise group of one notebook."""

    def __init__(self, folder, absent, packages, limits, covered=()):
        self.folder, self.limits = Path(folder), limits
        self.folder.mkdir(parents=True, exist_ok=True)
        student_edition.build(self.folder / "lib", absent, packages)
        for name in ("worker.py", "wire.py"):
            shutil.copy2(HERE / name, self.folder / name)
        hidden = hidden_packages(packages)
        if ISOLATION == "bubblewrap":
            home = SANDBOX
            command = bubblewrap_command(self.folder, hidden, covered) + [
                "--clearenv", *[a for k, v in environment(home).items() for a in ("--setenv", k, v)]]
            command += [sys.executable, "-u", str(home / "worker.py"), *hidden]
            env = None
        else:
            home = self.folder
            command, env = [sys.executable, "-u", str(home / "worker.py"), *hidden], environment(home)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=STDERR, cwd=self.folder, env=env,
                                        start_new_session=True, preexec_fn=self.limit_memory)
        self.requests, self.replies = self.process.stdin.fileno(), self.process.stdout.fileno()

    def limit_memory(self):
        resource.setrlimit(resource.RLIMIT_DATA, (self.limits.memory_bytes, self.limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def python_pid(self):
        """The host's process id of the worker's Python (below bubblewrap's two processes, if any)."""
        below = descendants(self.process.pid)
        return below[-1] if below else self.process.pid

    def ask(self, message, seconds):
        """Send a request; the reply, or LimitReached (the worker killed) after `seconds`."""
        try:
            wire.send(self.requests, message)
        except (BrokenPipeError, OSError):
            raise LimitReached(self.death()) from None
        deadline = time.monotonic() + seconds

        def wait(fd):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.kill()
                raise LimitReached(f"ran past {seconds:g} s")
        try:
            return wire.receive(self.replies, wait)
        except (EOFError, ValueError, OSError, KeyError):
            raise LimitReached(self.death()) from None

    def death(self):
        """Why the worker stopped answering."""
        self.kill()
        code = self.process.returncode
        if code is not None and code < 0 and -code in (signal.SIGKILL, signal.SIGSEGV):
            return (f"the worker was killed ({signal.Signals(-code).name}): it used more than "
                    f"{self.limits.memory_bytes / 2**30:g} GiB, or crashed")
        return "the worker ended (the code exited the process, or crashed)"

    def run(self, cells, seconds):
        """Run the student's cells: the errors, [cell index, "Type: message"]."""
        return self.ask({"op": "run", "cells": list(cells)}, seconds)["errors"]

    def call(self, function, args, kwargs, seconds, measure_memory=False):
        """(reply, peak bytes beyond the worker's size before the call, or None)."""
        message = {"op": "call", "function": function, "args": wire.tag(tuple(args)), "kwargs": wire.tag(dict(kwargs))}
        if not measure_memory:
            return self.ask(message, seconds), None
        pid = self.python_pid()
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
        before = memory_status(pid)["VmRSS"]
        reply = self.ask(message, seconds)
        return reply, memory_status(pid)["VmHWM"] - before

    def kill(self):
        """The worker's whole process group, at once."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()

    def close(self):
        if self.process.poll() is None:
            try:
                wire.send(self.requests, {"op": "exit"})
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()
        shutil.rmtree(self.folder, ignore_errors=True)
