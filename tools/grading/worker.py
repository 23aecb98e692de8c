"""The worker: runs a student's code, and calls the student's functions when the grader asks.

    python worker.py CONFIG_JSON          (started by grading/sandbox.py, never by hand)

It holds no expected answer, no comparison and no report. It is two processes:

- the relay, which alone holds the grader's two pipes (their descriptors are named in the
  config). It passes each request on, and each reply back only after reading it within the
  request's `reply_limit` of bytes; a longer reply ends the worker. The relay is not
  dumpable, so the student's code, though it runs as the same user, can neither open its
  descriptors through /proc nor read or write its memory;
- the runner, forked before any of the student's code runs, which closes the grader's pipes,
  sends what the student prints to /dev/null, and runs the student's cells and functions.

Before the fork, the worker (still only its own code) gives up what it must not keep: as
root, the capabilities in its bounding set and then root itself (`drop_to`: a uid and gid of
no one), a limit on the number of processes (`nproc`), and the seccomp filter of seccomp.py.
Its first message to the grader says what is left (uid, capabilities, seccomp), so that the
grader can refuse to send a case to a worker that could reach it. Requests:

    {"op": "run", "cells": [code, ...]}              -> {"errors": [[cell, "Type: message"], ...]}
    {"op": "call", "function": name, "args": tagged, "kwargs": tagged}
        -> {"status": "returned", "result": tagged, "args": tagged, "kwargs": tagged}
           (the arguments as the function left them), or {"status": "missing" | "not written" |
           "raised" | "unsendable", "message": ...} (with "raised", "types": the exception's classes)

The packages named in the config cannot be imported (inside bubblewrap they are also hidden
from the file system). This file is copied into the sandbox beside wire.py and seccomp.py.
"""

import importlib.abc
import json
import os
import re
import resource
import signal
import sys

import numpy as np

# worker.py runs as a script in the sandbox's folder, where sandbox.py copied these two beside it: the
# script's own folder is the first entry of its path (no tools package there, nor any edit of sys.path).
import seccomp
import wire

MAGIC = re.compile(r"^\s*[%!]", re.M)
PR_SET_DUMPABLE, PR_CAPBSET_DROP = 4, 24


class Hidden(importlib.abc.MetaPathFinder):
    """Refuses to import the packages that this exercise's worker goes without."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ImportError(f"{fullname.split('.')[0]} is not available while this exercise is graded")
        return None


class Shell:
    """What IPython's magics turn into (`get_ipython().run_line_magic(...)`): nothing is run."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def python_of(code):
    """A cell as Python: IPython's magics become calls on `get_ipython()` (IPython is imported only for
    a cell that has a line starting with % or !, to keep the worker's start short)."""
    if not MAGIC.search(code):
        return code
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return code
    return TransformerManager().transform_cell(code)


def run(namespace, cells):
    """Execute each cell in `namespace`; the errors, as [cell index, "Type: message"]."""
    errors = []
    for i, code in enumerate(cells):
        try:
            exec(compile(python_of(code), f"<cell {i}>", "exec"), namespace)
        except BaseException as error:  # noqa: BLE001 - a cell's error is the student's, reported
            if isinstance(error, (SystemExit, KeyboardInterrupt)):
                errors.append([i, f"{type(error).__name__}: the cell tried to stop the worker"])
            else:
                errors.append([i, f"{type(error).__name__}: {error}"])
    return errors


def call(namespace, request):
    """The reply to a call of the student's function on the arguments sent."""
    function = namespace.get(request["function"])
    if not callable(function):
        return {"status": "missing", "message": ""}
    args, kwargs = wire.untag(request["args"]), wire.untag(request["kwargs"])
    try:
        with np.errstate(all="ignore"):
            result = function(*args, **kwargs)
    except NotImplementedError as error:
        return {"status": "not written", "message": str(error)}
    except BaseException as error:  # noqa: BLE001 - sent to the grader, which decides
        return {"status": "raised", "message": f"{type(error).__name__}: {error}",
                "types": [kind.__name__ for kind in type(error).__mro__]}
    try:
        return {"status": "returned", "result": wire.tag(result), "args": wire.tag(args), "kwargs": wire.tag(kwargs)}
    except TypeError as error:
        return {"status": "unsendable", "message": str(error)}


def serve(requests, replies):
    """The runner: answer requests until the relay says exit or closes the pipe."""
    namespace = {"__name__": "__main__", "get_ipython": Shell}
    while True:
        try:
            request = wire.receive(requests)
        except EOFError:
            return
        if request.get("op") == "exit":
            return
        if request.get("op") == "run":
            reply = {"errors": run(namespace, request["cells"])}
        else:
            reply = call(namespace, request)
        wire.send(replies, reply)


def prctl(option, value):
    """prctl(2) through ctypes; False where ctypes is missing or the call fails."""
    try:
        import ctypes
    except ImportError:
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0


def drop_root(uid, gid):
    """As root: empty the capability bounding set, then become `uid`/`gid` with no groups. Changing
    from uid 0 to another clears the permitted and effective capabilities too."""
    with open("/proc/sys/kernel/cap_last_cap") as last:
        for capability in range(int(last.read()) + 1):
            if not prctl(PR_CAPBSET_DROP, capability):
                raise PermissionError(f"could not drop capability {capability} from the bounding set")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def credentials(pid):
    """What the process `pid` holds: uids, capabilities, no_new_privs and seccomp mode, from /proc."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    uids = [int(u) for u in status["Uid"].split()]
    return {"uid": uids[0], "euid": uids[1], "saved_uid": uids[2], "fs_uid": uids[3],
            "cap_eff": int(status["CapEff"], 16), "cap_prm": int(status["CapPrm"], 16),
            "cap_bnd": int(status["CapBnd"], 16), "cap_amb": int(status.get("CapAmb", "0"), 16),
            "no_new_privs": int(status.get("NoNewPrivs", "0")), "seccomp": int(status.get("Seccomp", "0"))}


def relay(grader_in, grader_out, to_runner, from_runner, runner):
    """Pass requests on and replies back, each reply within the request's reply_limit of bytes."""
    while True:
        try:
            body = wire.receive_bytes(grader_in, wire.MAX_BYTES)
        except EOFError:
            break
        wire.send_bytes(to_runner, body)
        request = json.loads(body)
        if request.get("op") == "exit":
            break
        try:
            reply = wire.receive_bytes(from_runner, int(request.get("reply_limit", wire.MAX_REPLY)))
        except EOFError:  # the runner ended: say how, and stop
            _, status = os.waitpid(runner, 0)
            wire.send(grader_out, {"status": "ended", "code": os.waitstatus_to_exitcode(status)})
            return
        except ValueError as error:  # too long: the runner's stream can no longer be trusted
            wire.send(grader_out, {"status": "oversized", "message": str(error)})
            break
        wire.send_bytes(grader_out, reply)
    os.kill(runner, signal.SIGKILL)
    os.waitpid(runner, 0)


def start(config):
    """Give up what the student's code must not have, then fork: the relay returns, the runner serves."""
    if config.get("drop_to"):
        drop_root(*config["drop_to"])
    if config.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (config["nproc"], config["nproc"]))
    filtered = seccomp.install()
    if config.get("workdir"):
        os.makedirs(config["workdir"], exist_ok=True)
        os.chdir(config["workdir"])
    grader_in, grader_out = config["channel"]
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    runner = os.fork()
    if runner == 0:
        for fd in (grader_in, grader_out, requests_w, replies_r):
            os.close(fd)
        prctl(PR_SET_DUMPABLE, 1)  # the grader reads the runner's memory use from /proc
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(quiet, fd)  # the student's prints, and anything read from stdin, go nowhere
        sys.stdin, sys.stdout, sys.stderr = (open(fd, mode, closefd=False) for fd, mode in ((0, "r"), (1, "w"), (2, "w")))
        sys.meta_path.insert(0, Hidden(config.get("hidden", ())))
        serve(requests_r, replies_w)
        os._exit(0)
    os.close(requests_r)
    os.close(replies_w)
    prctl(PR_SET_DUMPABLE, 0)  # no /proc/<relay>/fd, mem or environ for the student's code
    hello = {"op": "hello", "runner_pid": runner, "seccomp_installed": filtered, **credentials(runner)}
    wire.send(grader_out, hello)
    relay(grader_in, grader_out, requests_w, replies_r, runner)


if __name__ == "__main__":
    start(json.loads(sys.argv[1]))
