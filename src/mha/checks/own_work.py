"""A solution must be the learner's own: while it runs, the function it replaces, and every library function
that does the exercise's work (the check's `forbids`), is refused.

    with Refusing("softmax", reference("softmax"), learners_softmax, {"log_softmax": ...}) as guard:
        answer = learners_softmax(x)
    guard.caught   # None, or the module whose code called a refused function
    guard.refused  # which one ("softmax", "log_softmax", ...)

Inside, every Python function that starts is looked at (`sys.setprofile`). When it is one of
the refused library functions (`mha.numpy.<name>`, or its twin `mha.torch.<name>`, or a function of
another module of mha that a check forbids by its dotted name, `mha.text.bits_per_character`), however it
was imported, renamed or reloaded (the code is known by its file, line and name), and the
code that called it is not the library's own, the call raises `RefusedCall` and the
guard remembers it: a `try` in the solution cannot hide it. The library's calls to
itself go through, so a function that the exercise permits (`mnp.head_attention`, say)
keeps working even when it uses a refused one inside. Nothing is read from the solution's
source text. A refused function itself, handed to a check, is refused too (the check sees
that `watching` is False, and `refused` names it). (A profiler written in C, cProfile's,
cannot be chained: while one runs, the guard stands aside rather than break it.)
"""

import inspect
import sys
import types

LIBRARY = ("mha.numpy", "mha.torch")  # the modules whose calls to a refused function are the library's own


class RefusedCall(Exception):
    """Raised into a solution that calls a function it may not call."""


def module_of(frame):
    """The name of the module whose code runs in `frame` ("" if unknown)."""
    return "" if frame is None else frame.f_globals.get("__name__", "")


def in_the_library(module):
    """True for mha.numpy, mha.torch and their modules."""
    return any(module == face or module.startswith(face + ".") for face in LIBRARY)


def where(code):
    """Where a function's code was written: the same for a function and its reloaded copy."""
    return code.co_filename, code.co_firstlineno, code.co_name


class Refusing:
    """A context in which calls to the library's `<name>` (and to the `others`, {name: mha.numpy function}) from
    outside the library are refused."""

    def __init__(self, name, reference, solution=None, others=None):
        self.name = name
        functions = {name: reference, **(others or {})}
        self.written_at = {where(f.__code__): n for n, f in functions.items() if isinstance(f, types.FunctionType)}
        # A quick test on a code's name comes first, most calls are not refused ("mha.text.f" is the code of f).
        self.names = frozenset(n.rpartition(".")[2] for n in functions)
        self.caught = None  # the module that called a refused function, once refused
        self.refused = None  # the name of the refused function it called (or that was handed in)
        self.previous = None
        code = getattr(solution, "__code__", None)  # a refused function itself: refused by the check
        handed_in = None if code is None else self.refused_function(code)
        self.watching = handed_in is None
        if handed_in is not None:
            self.refused = handed_in

    def refused_function(self, code):
        """The name of the refused function whose code `code` is: of mha.numpy.<name>, or of mha.torch.<name>
        (looked up once torch is loaded); None for any other code."""
        if code.co_name not in self.names:
            return None
        found = self.written_at.get(where(code))
        if found is not None:
            return found
        twin = getattr(sys.modules.get("mha.torch"), code.co_name, None)
        if callable(twin):
            twin = inspect.unwrap(twin)  # a decorated twin (@torch.no_grad()): the function it wraps
        twin_code = getattr(twin, "__code__", None)
        if (twin_code is not None and in_the_library(getattr(twin, "__module__", "") or "")  # not the learner's
                and where(code) == where(twin_code)):
            return code.co_name
        return None

    def is_the_library_function(self, code):
        """True for the code of a refused function (see `refused_function`)."""
        return self.refused_function(code) is not None

    def watch(self, frame, event, arg):
        """The profile function: refuse a call of a refused function made by code outside the library."""
        if self.previous is not None:
            self.previous(frame, event, arg)
        if event != "call" or frame.f_code.co_name not in self.names:
            return
        refused = self.refused_function(frame.f_code)
        if refused is None:
            return
        caller = module_of(frame.f_back)
        if not in_the_library(caller):
            if self.caught is None:  # the first refusal is the one to report
                self.caught, self.refused = caller or "your code", refused
            raise RefusedCall(f"mha's {refused} is switched off while the check runs your {self.name}")

    def __enter__(self):
        self.previous = sys.getprofile()
        if self.watching and (self.previous is None or callable(self.previous)):  # cProfile is left alone
            sys.setprofile(self.watch)
        return self

    def __exit__(self, *exception):
        if sys.getprofile() is not self.previous:
            sys.setprofile(self.previous)
        return False
