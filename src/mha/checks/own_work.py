"""A solution must be the learner's own: while it runs, the function it replaces is refused.

    with Refusing("softmax", reference("softmax"), learners_softmax) as guard:
        answer = learners_softmax(x)
    guard.caught  # None, or the module whose code called the library's softmax

Inside, every Python function that starts is looked at (`sys.setprofile`). When it is
the library's `<name>` (`mha.numpy.<name>`, or its twin `mha.torch.<name>`), however it
was imported, renamed or reloaded (the code is known by its file, line and name), and the
code that called it is not the library's own, the call raises `RefusedCall` and the
guard remembers it: a `try` in the solution cannot hide it. The library's calls to
itself go through, so a function that the exercise permits (`mnp.head_attention`, say)
keeps working even when it uses `<name>` inside. Nothing is read from the solution's
source text. The library's function itself, handed to a check, is refused too (the
check sees that `watching` is False). (A profiler written in C,
cProfile's, cannot be chained: while one runs, the guard stands aside rather than
break it.)
"""

import sys

LIBRARY = ("mha.numpy", "mha.torch")  # the modules whose calls to <name> are the library's own


class RefusedCall(Exception):
    """Raised into a solution that calls the very function it should replace."""


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
    """A context in which calls to the library's `<name>` from outside the library are refused."""

    def __init__(self, name, reference, solution=None):
        self.name = name
        self.written_at = where(reference.__code__)
        self.caught = None  # the module that called the library's <name>, once refused
        self.previous = None
        code = getattr(solution, "__code__", None)  # the library's function itself: refused by the check
        self.watching = code is None or not self.is_the_library_function(code)

    def is_the_library_function(self, code):
        """True for the code of mha.numpy.<name>, or of mha.torch.<name> (looked up once torch is loaded)."""
        if where(code) == self.written_at:
            return True
        twin = getattr(sys.modules.get("mha.torch"), self.name, None)
        twin_code = getattr(twin, "__code__", None)
        return (twin_code is not None and in_the_library(twin.__module__)  # not the learner's, set in its place
                and where(code) == where(twin_code))

    def watch(self, frame, event, arg):
        """The profile function: refuse a call of <name> made by code outside the library."""
        if self.previous is not None:
            self.previous(frame, event, arg)
        if event != "call" or frame.f_code.co_name != self.name or not self.is_the_library_function(frame.f_code):
            return
        caller = module_of(frame.f_back)
        if not in_the_library(caller):
            self.caught = caller or "your code"
            raise RefusedCall(f"mha's {self.name} is switched off while the check runs your {self.name}")

    def __enter__(self):
        self.previous = sys.getprofile()
        if self.watching and (self.previous is None or callable(self.previous)):  # cProfile is left alone
            sys.setprofile(self.watch)
        return self

    def __exit__(self, *exception):
        if sys.getprofile() is not self.previous:
            sys.setprofile(self.previous)
        return False
