"""Where a student's code runs: a worker process, walled off by the operating system.

    worker = Worker(folder, absent=("softmax", "log_softmax"), packages=(), limits=Limits())
    worker.run(cells, seconds)                      # the student's code
    worker.call("softmax", args, kwargs, seconds)   # one call: the reply, in plain data
    worker.close()

Each worker gets its own temporary folder holding the student edition of `mha`
(grading/student_edition.py) and the worker's files, and runs under Debian's bubblewrap
when it works here: the whole system read-only; the project (the full library, the
grader), the folders of the submissions, of the grades and of the manifest covered by
empty read-only folders; its own /tmp, of a bounded size; no network; its own process
tree, killed with the grader. Who it is:

- the grader run as root (as on Gradescope): bubblewrap builds the sandbox as root, then the
  worker's own code, before any student code, empties its capability bounding set and
  becomes a user of its own (resources.worker_user: a uid no other process has);
- the grader run as a user: bubblewrap in a user namespace of its own, every capability
  dropped, no further user namespace.

Either way the worker installs a seccomp filter (seccomp.py: no mount, umount, unshare,
setns or ptrace), and its first message says its uid, capabilities and seccomp mode:
the grader sends no case to a worker that kept a capability or root (`Refused`). The
grader's pipes are held by the worker's relay process alone (worker.py). A reply is read
within a size bound given with each request, and its nesting and number of values are
checked before any Python object is built (wire.py).

Without bubblewrap, the worker still runs in its own folder with that path, those packages
refused at import, the seccomp filter and (as root) a user of its own; the grader says in
its report that the isolation is the folder's and the path's alone.

Limits (`Limits`): the time of each request, the memory of each process (RLIMIT_DATA) and,
where the machine offers a memory cgroup, of the whole worker with its children and its
/tmp; the size of a file; the number of processes. At a limit the whole worker is killed.
"""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.grading import resources, seccomp, student_edition, wire
from tools.grading.bubblewrap import SANDBOX, bubblewrap_command, bubblewrap_works, closed_to_others  # noqa: F401

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Packages that compute what the exercises ask for (softmax, attention, norms, a GGUF block's weights, the gated
# delta rule: fla and causal_conv1d, transformers' kernels for Qwen3-Next): never importable.
ALWAYS_HIDDEN = ("torch", "functorch", "torchgen", "jax", "jaxlib", "tensorflow", "keras", "sklearn",
                 "transformers", "tokenizers", "einops", "numba", "cupy", "gguf", "llama_cpp", "fla", "causal_conv1d",
                 "mha_full")
MAYBE_HIDDEN = ("scipy",)  # hidden unless the exercise lists it in `packages`
STDERR = None if os.environ.get("MHA_GRADER_DEBUG") else subprocess.DEVNULL  # the worker's own errors
WORKDIR = "/tmp/work"  # the student's current folder and home inside bubblewrap (in its private /tmp)
WORKER_FILES = ("worker.py", "wire.py", "seccomp.py")
START_SECONDS = 60  # for a worker to start and say who it is


@dataclass(frozen=True)
class Limits:
    """What one notebook may use: seconds per request, seconds in all, memory per worker, the size of
    a file and of the worker's /tmp, and the number of processes of a worker."""
    cell_seconds: float = 60
    notebook_seconds: float = 300
    memory_bytes: int = 4 * 2**30
    file_bytes: int = 64 * 2**20
    processes: int = 16


class LimitReached(Exception):
    """The worker ran past a limit and was killed; the message says which."""


class Refused(LimitReached):
    """The worker kept what it must not have (root, a capability): no case was sent to it."""


def hidden_packages(packages):
    """The packages that the worker of an exercise allowing `packages` goes without."""
    return tuple(p for p in ALWAYS_HIDDEN + MAYBE_HIDDEN if p not in packages)


ISOLATION = "bubblewrap" if bubblewrap_works() else "folder and path only"


def environment(home, library):
    """The worker's whole environment: no variable of the grader's survives."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
            "PYTHONPATH": str(library), "PYTHONHASHSEED": "0", "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


def problems_with(hello):
    """What the worker's first message shows it kept that it must not: [] when it may be sent cases."""
    if hello.get("op") != "hello":
        return ["it did not say who it is"]
    problems = []
    if os.geteuid() == 0 and 0 in (hello["uid"], hello["euid"], hello["saved_uid"], hello["fs_uid"]):
        problems.append(f"it runs as root (uid {hello['uid']})")
    held = {name: hello[name] for name in ("cap_eff", "cap_prm", "cap_amb") if hello[name]}
    if ISOLATION == "bubblewrap" and hello["cap_bnd"]:
        held["cap_bnd"] = hello["cap_bnd"]
    if held:
        problems.append("it holds capabilities (" + ", ".join(f"{k} {v:#x}" for k, v in held.items()) + ")")
    if seccomp.program() is not None and hello["seccomp"] != 2:
        problems.append(f"its seccomp filter is not on (mode {hello['seccomp']})")
    return problems


class Worker:
    """One worker process for one exercise group of one notebook."""

    def __init__(self, folder, absent, packages, limits, covered=()):
        self.folder, self.limits = Path(folder), limits
        self.folder.mkdir(parents=True, exist_ok=True)
        student_edition.build(self.folder / "lib", absent, packages)
        for name in WORKER_FILES:
            shutil.copy2(HERE / name, self.folder / name)
        self.user = resources.worker_user()
        self.group = resources.MemoryGroup.create(limits.memory_bytes, limits.processes)
        try:
            self.process = self.start(hidden_packages(packages), covered)
        except Refused:
            if self.group is not None:
                self.group.remove()
            raise
        self.hello = self.receive(START_SECONDS, wire.MAX_REPLY, "to start")
        problems = problems_with(self.hello)
        if problems:
            self.kill()
            raise Refused("the grader refused to grade in this worker: " + "; ".join(problems))
        self.runner = resources.runner_pid(self.process.pid, self.hello["runner_pid"])

    def start(self, hidden, covered):
        """The worker's process, given one end of each pipe (the relay's), everything else closed."""
        requests_r, self.requests = os.pipe()
        self.replies, replies_w = os.pipe()
        config = {"hidden": list(hidden), "channel": [requests_r, replies_w], "nproc": self.limits.processes}
        drop_here = None
        os.chmod(self.folder, 0o755)
        if ISOLATION == "bubblewrap":
            (self.folder / "tmp").mkdir(exist_ok=True)
            config |= {"workdir": WORKDIR, "drop_to": [self.user.uid, self.user.gid] if self.user else None}
            command = [*bubblewrap_command(self.folder, hidden, covered, self.limits), "--clearenv"]
            command += [a for k, v in environment(WORKDIR, SANDBOX / "lib").items() for a in ("--setenv", k, v)]
            worker, env = SANDBOX / "worker.py", None
        else:  # as root, the worker's user is taken in the child before exec
            config["workdir"], drop_here = str(self.folder / "work"), self.user
            command, worker, env = [], self.folder / "worker.py", environment(self.folder / "work", self.folder / "lib")
        for path in (self.folder / "tmp", self.folder / "work"):
            path.mkdir(exist_ok=True)
            if self.user:
                os.chown(path, self.user.uid, self.user.gid)
        if not self.limits.processes or (self.user is None and ISOLATION != "bubblewrap"):
            config["nproc"] = None  # as a user without a namespace, the limit would count all of the user's processes
        command += [sys.executable, "-u", str(worker), json.dumps(config)]
        preexec = resources.limiter(self.limits.memory_bytes, self.limits.file_bytes, self.group, drop_here)
        try:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=STDERR,
                                    cwd=self.folder, env=env, pass_fds=(requests_r, replies_w),
                                    start_new_session=True, preexec_fn=preexec)
        except PermissionError as error:  # as root without bubblewrap: the worker's user cannot run Python
            closed = closed_to_others(Path(sys.executable).resolve())
            raise Refused(f"the worker's user (uid {self.user.uid if self.user else os.getuid()}) cannot run "
                          f"{sys.executable} ({error.strerror}"
                          + (f": {closed} is closed to other users" if closed else "") + "). As root, grading runs "
                          "the students' code as a user of its own: install bubblewrap (make sandbox), or "
                          "install Python where every user may read it") from None
        finally:
            os.close(requests_r)
            os.close(replies_w)

    def receive(self, seconds, limit, what="answer"):
        """The next message within `seconds` and `limit` bytes; LimitReached (the worker killed) otherwise."""
        deadline = time.monotonic() + seconds

        def wait(fd):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.kill()
                raise LimitReached(f"ran past {seconds:g} s" + ("" if what == "answer" else f" {what}"))
        try:
            reply = wire.receive(self.replies, wait, limit=limit)
        except (EOFError, OSError, KeyError):
            raise LimitReached(self.death()) from None
        except ValueError as error:  # longer, deeper or larger than allowed: the notebook fails, not the grader
            self.kill()
            raise LimitReached(f"the worker's reply was refused: {error}") from None
        if reply.get("status") == "oversized":
            self.kill()
            raise LimitReached(f"the worker's reply was refused: {reply.get('message')}")
        if reply.get("status") == "ended":  # the relay's word: the runner of the student's code ended
            raise LimitReached(self.death(reply.get("code")))
        return reply

    def ask(self, message, seconds, reply_limit=wire.MAX_REPLY):
        """Send a request; the reply (at most `reply_limit` bytes), or LimitReached after `seconds`."""
        try:
            wire.send(self.requests, {**message, "reply_limit": int(reply_limit)})
        except (BrokenPipeError, OSError):
            raise LimitReached(self.death()) from None
        return self.receive(seconds, reply_limit)

    def death(self, code=None):
        """Why the worker stopped answering (`code`: the runner's exit code, as its relay saw it)."""
        try:
            self.process.wait(timeout=1)  # its own end, if it is ending
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        code = self.process.returncode if code is None else code
        if isinstance(code, int) and code < 0 and -code in (signal.SIGKILL, signal.SIGSEGV):
            return (f"the worker was killed ({signal.Signals(-code).name}): it used more than "
                    f"{self.limits.memory_bytes / 2**30:g} GiB, or crashed")
        return "the worker ended (the code exited the process, or crashed)"

    def run(self, cells, seconds):
        """Run the student's cells: the errors, [cell index, "Type: message"]."""
        return self.ask({"op": "run", "cells": list(cells)}, seconds)["errors"]

    def call(self, function, args, kwargs, seconds, measure_memory=False, reply_limit=wire.MAX_REPLY):
        """(reply, peak bytes beyond the worker's size before the call, or None). The peak is that of the
        runner and every process below it (and of the whole worker's cgroup, where there is one)."""
        message = {"op": "call", "function": function, "args": wire.tag(tuple(args)), "kwargs": wire.tag(dict(kwargs))}
        if not measure_memory:
            return self.ask(message, seconds, reply_limit), None
        before = resources.restart_peaks(resources.tree(self.runner))
        in_group = self.group is not None and self.group.reset_peak()
        group_before = self.group.usage() if in_group else 0
        reply = self.ask(message, seconds, reply_limit)
        peak = resources.peak_bytes(resources.tree(self.runner)) - before
        if in_group:
            peak = max(peak, self.group.peak() - group_before)
        return reply, peak

    def kill(self):
        """The worker's whole process group, its user's processes and its cgroup, at once."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        if self.user is not None:
            resources.kill_user(self.user.uid)
        if self.group is not None:
            self.group.remove()

    def close(self):
        if self.process.poll() is None:
            try:
                wire.send(self.requests, {"op": "exit"})
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (self.requests, self.replies):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)
