"""The one registry of the checks, and the code that runs them.

A chapter module declares each check in three parts, side by side:

    @cases_for("softmax")                                # the inputs to try
    def softmax_cases(): ...

    @mistake("softmax", "normalise along `axis`")        # a classic wrong answer
    def softmax_wrong_axis(x, axis=-1): ...

    check_softmax = make_check("softmax")               # what the learner calls

`@cases_for` adds an entry to `CHECKS` (name -> `Check`); `@mistake` adds a
wrong implementation and its hint to that entry, so cases come first. A check
calls the learner's function exactly as `mha.numpy.<name>` is called, on every
case, and raises `CheckFailed` at the first wrong answer, with the hint of the
first catalogued mistake that gives the same answer.
"""

import copy
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import mha.numpy as mn
from mha.checks.compare import compare_result, describe_case, same_answer

OUT_AND_WEIGHTS = ("out", "weights")  # the structure of a result `(out, weights)`


class CheckFailed(AssertionError):
    """A learner's function gave a wrong answer (or none) on one of the check's inputs."""


@dataclass
class Case:
    """One input to try: a label for the messages, and the arguments."""
    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def call(self, fn):
        """fn(*args, **kwargs) on copies, so that no function can change the case for the next."""
        return fn(*copy.deepcopy(self.args), **copy.deepcopy(self.kwargs))


@dataclass(frozen=True)
class Mistake:
    """A wrong implementation with the signature of its `mha.numpy` twin."""
    name: str  # which function it imitates
    hint: str  # what the learner should read
    fn: Callable


@dataclass
class Check:
    """Everything about the check of `mha.numpy.<name>`."""
    name: str
    make_cases: Callable[[], list]  # returns the list of `Case`s, built afresh on each call
    returns: tuple | None = None  # the structure of a result: None for one array (see mha.checks.compare)
    mistakes: list = field(default_factory=list)


CHECKS = {}


def cases_for(name, returns=None):
    """Register the function that makes the cases of `check_<name>`; `returns` as in `Check`."""
    def register(make_cases):
        earlier = CHECKS.get(name)
        if earlier is not None and earlier.make_cases.__module__ != make_cases.__module__:
            raise ValueError(f"the cases of {name} are already registered in {earlier.make_cases.__module__}")
        CHECKS[name] = Check(name, make_cases, returns)
        return make_cases
    return register


def registered(name):
    """The `Check` registered for `name`."""
    try:
        return CHECKS[name]
    except KeyError:
        raise LookupError(f"no cases are registered for {name}: "
                          f"decorate a function with @cases_for({name!r}) first") from None


def mistake(name, hint):
    """Register a wrong implementation of `mha.numpy.<name>` and the hint for it."""
    def register(fn):
        registered(name).mistakes.append(Mistake(name, hint, fn))
        return fn
    return register


def all_mistakes():
    """Every catalogued mistake, check by check."""
    return [m for check in CHECKS.values() for m in check.mistakes]


def matching_hint(check, case, got):
    """The hint of the first catalogued mistake whose answer equals `got`, if any."""
    for m in check.mistakes:
        try:
            with np.errstate(all="ignore"):
                wrong = case.call(m.fn)
            if same_answer(wrong, got, check.returns):
                return m.hint
        except Exception:
            continue
    return None


def call_learner(name, fn, reference, case):
    """The learner's answer on `case`, or CheckFailed (NotImplementedError for a stub) saying why none."""
    try:
        with np.errstate(all="ignore"):
            return case.call(fn)
    except NotImplementedError:
        raise NotImplementedError(
            f"{name} is not written yet: write it in the cell above, then run this check again"
        ) from None
    except Exception as error:
        raise CheckFailed(
            f"{name} raised {type(error).__name__}: {error}\n"
            f"  on the case '{case.label}' ({describe_case(reference, case)})"
        ) from None


def run_check(name, fn):
    """Call `fn` on every case of the check and compare it with `mha.numpy.<name>`."""
    check = registered(name)
    cases = check.make_cases()
    if not callable(fn):
        raise CheckFailed(f"check_{name} needs a function, got {type(fn).__name__}")
    reference = getattr(mn, name)
    for case in cases:
        expected = case.call(reference)
        got = call_learner(name, fn, reference, case)
        problem = compare_result(expected, got, check.returns)
        if problem:
            hint = matching_hint(check, case, got)
            raise CheckFailed(
                f"{name} gives a wrong answer on the case '{case.label}'\n"
                f"  input: {describe_case(reference, case)}\n  {problem}"
                + (f"\n  hint: {hint}" if hint else "")
            )
    print(f"check_{name}: all {len(cases)} cases passed.")


def make_check(name):
    """The function `check_<name>(fn)` that a chapter exports; its cases must be registered."""
    registered(name)

    def check(fn):
        run_check(name, fn)
    check.__name__ = check.__qualname__ = f"check_{name}"
    check.__module__ = "mha.checks"  # where learners import it from
    check.__doc__ = (f"Check a learner's `{name}` against `mha.numpy.{name}`; "
                     f"raises CheckFailed with a hint on a wrong answer.")
    return check
