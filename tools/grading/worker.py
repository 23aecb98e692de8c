"""The worker: runs a student's code, and calls the student's functions when the grader asks.

    python worker.py [HIDDEN_PACKAGE ...]          (started by grading/sandbox.py, never by hand)

It holds no expected answer, no comparison and no report: it receives requests on its
stdin and answers on its stdout, in the format of wire.py, and knows nothing of what
the answers are for. What the student's code prints goes to /dev/null (its stdout and
stderr are moved there before any of it runs). Requests:

    {"op": "run", "cells": [code, ...]}              -> {"errors": [[cell, "Type: message"], ...]}
    {"op": "call", "function": name, "args": tagged, "kwargs": tagged}
        -> {"status": "returned", "result": tagged, "args": tagged, "kwargs": tagged}
           (the arguments as the function left them), or {"status": "missing" | "not written" |
           "raised" | "unsendable", "message": ...} (with "raised", "types": the exception's classes)

The packages named on the command line cannot be imported (inside bubblewrap they are
also hidden from the file system; this is the second lock, and the only one without it).
This file is copied into the sandbox beside wire.py and imports nothing of the grader.
"""

import importlib.abc
import os
import re
import sys

import numpy as np

import wire


MAGIC = re.compile(r"^\s*[%!]", re.M)


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
    """Answer requests until the grader says exit or closes the pipe."""
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


def main(hidden):
    sys.meta_path.insert(0, Hidden(hidden))
    requests, replies = os.dup(0), os.dup(1)  # the grader's pipes, kept on other descriptors
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)  # the student's prints, and anything read from stdin, go nowhere
    sys.stdin, sys.stdout, sys.stderr = (open(fd, mode, closefd=False) for fd, mode in ((0, "r"), (1, "w"), (2, "w")))
    serve(requests, replies)


if __name__ == "__main__":
    main(sys.argv[1:])
