"""The one registry of the checks, and the code that runs them.

A chapter module declares each check in four parts, side by side:

    @cases_for("softmax")                                # the named inputs to try, with their hints
    def softmax_cases(r): ...

    @random_cases_for("softmax")                         # inputs drawn afresh on every call
    def softmax_random_cases(r): ...

    @mistake("softmax", "normalise along `axis`")        # a classic wrong answer
    def softmax_wrong_axis(x, axis=-1): ...

    check_softmax = make_check("softmax")               # what the learner calls

`@cases_for` adds an entry to `CHECKS` (name -> `Check`); `@random_cases_for` and
`@mistake` add to that entry, so cases come first. A check calls the learner's
function exactly as `mha.numpy.<name>` is called, first on the named cases, then on
random ones, both drawn from the run's seed, fresh on each call (`seed=` repeats a draw:
the named cases keep their labels and traps, their values come from the seed), and raises
`CheckFailed` at the first wrong answer, with the hint of the first catalogued mistake that
gives the same answer, and the seed; once every answer is right, a function that leaves the route its exercise
asks for (`rules`, mha.checks.syntax) fails too. It compares with the reference kept in
`mha.checks.reference`, and refuses a solution that calls the very function it should
replace, or any library function that does the exercise's work (`forbids`,
`mha.checks.routes`), while it runs (`mha.checks.own_work`).
"""

import contextlib
import copy
import inspect
import re
import secrets
import tracemalloc
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mha.checks.compare import changed_arguments, compare_result, describe_case, flatten, same_answer
from mha.checks.inputs import named_generator
from mha.checks.own_work import Refusing
from mha.checks.reference import library_function, reference, untouched_library
from mha.checks.syntax import broken_rule_of

OUT_AND_WEIGHTS = ("out", "weights")  # the structure of a result `(out, weights)`


class CheckFailed(AssertionError):
    """A learner's function gave a wrong answer (or none) on one of the check's inputs."""


@dataclass
class Case:
    """One input to try: a label for the messages, and the arguments. `raises`: see below. `peak_bytes`, when set, is the
    most memory that one call may take beyond its inputs and its result (chunked attention: far less
    than a T x T array); the notebook's check measures it with tracemalloc, the grader from outside."""
    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    peak_bytes: int | None = None
    # The exception that the text requires on this case (say ValueError for an unknown name): the
    # learner's function must raise it (or a subclass); an answer, or another error, is wrong.
    raises: type | None = None
    # What a call that takes more than `peak_bytes` built, for the message (chunked attention: the scores; the
    # absorbed latent decode: every head's keys).
    too_much: str = "never build the whole T_q x T_k array of scores"

    def arguments(self):
        """Copies of (args, kwargs), so that no function can change the case for the next."""
        return copy.deepcopy((self.args, self.kwargs))

    def call(self, fn):
        """fn(*args, **kwargs) on copies of the arguments."""
        args, kwargs = self.arguments()
        return fn(*args, **kwargs)


@dataclass(frozen=True)
class Mistake:
    """A wrong implementation with the signature of its `mha.numpy` twin."""
    name: str  # which function it imitates
    hint: str  # what the learner should read
    fn: Callable
    # A mistake of the answer's dtype (say float16 where the text asks float32): its hint, not the general one,
    # answers a wrong dtype that its answer has too (see `dtype_hint`).
    dtype: bool = False


@dataclass
class Check:
    """Everything about the check of `mha.numpy.<name>`."""
    name: str
    make_cases: Callable  # make_cases(generator) returns the named `Case`s, their values drawn from the generator
    returns: tuple | None = None  # the structure of a result: None for one array (see mha.checks.compare)
    may_use: str = "NumPy"  # what the exercise lets a solution call, for the hint when it calls the reference
    make_random_cases: Callable | None = None  # make_random_cases(generator) returns more `Case`s
    mistakes: list = field(default_factory=list)
    # Other library functions that compute this exercise's result (its own name is always one): in
    # grading, the student edition of mha has them, in both faces, raise "this is the exercise". Names of
    # mha.numpy, or dotted names of another module of mha ("mha.text.bits_per_character"), which the notebook's
    # check refuses and the student edition lacks.
    forbids: tuple = ()
    # Third-party packages beside NumPy that a solution may import (say "scipy"): in grading the others
    # (torch, scipy, ...) are absent from the worker that runs this exercise.
    packages: tuple = ()
    # Whether the exercise's text promises float32 answers to float32 inputs ("float32 stays float32", "return
    # the table as dtype"); elsewhere a float64 answer to a float32 input is accepted. A float64 input must
    # always be answered in float64.
    float32_promised: bool = False
    # Whether the text promises a new array or copies ("return a new array", "as a copy"): the notebook's check
    # refuses an answer whose arrays share memory with the inputs (the grader cannot see memory across processes).
    fresh: bool = False
    # The route the exercise's text asks for, as rules on the learner's code (mha.checks.syntax.Rule): the notebook's
    # check and the grader both fail a function (or a learner's helper) that breaks one, once its answers are right.
    rules: tuple = ()

    def absent(self):
        """The names of mha.numpy that the student edition switches off for this exercise, sorted. (A dotted name of
        `forbids`, of another module of mha, is not switched off: the student edition has no module but mha.numpy's.)"""
        return tuple(sorted({self.name, *(name for name in self.forbids if "." not in name)}))

    def named_cases(self, seed):
        """The named cases of a run with `seed`: the same labels and traps on every run, values drawn from `seed`."""
        return self.make_cases(named_generator(seed))

    def cases(self, seed):
        """The named cases, then the random ones, drawn from `seed`."""
        return self.named_cases(seed) + self.make_random_cases(np.random.default_rng(seed))


CHECKS = {}


def cases_for(name, returns=None, may_use="NumPy", forbids=(), packages=(), float32_promised=False, fresh=False,
              rules=()):
    """Register the function that makes the named cases of `check_<name>` from a NumPy Generator; `returns`,
    `may_use`, `forbids`, `packages`, `float32_promised`, `fresh` and `rules` as in `Check`."""
    def register(make_cases):
        earlier = CHECKS.get(name)
        if earlier is not None and earlier.make_cases.__module__ != make_cases.__module__:
            raise ValueError(f"the cases of {name} are already registered in {earlier.make_cases.__module__}")
        CHECKS[name] = Check(name, make_cases, returns, may_use, forbids=tuple(forbids), packages=tuple(packages),
                             float32_promised=float32_promised, fresh=fresh, rules=tuple(rules))
        return make_cases
    return register


def registered(name):
    """The `Check` registered for `name`."""
    try:
        return CHECKS[name]
    except KeyError:
        raise LookupError(f"no cases are registered for {name}: "
                          f"decorate a function with @cases_for({name!r}) first") from None


def random_cases_for(name):
    """Register the function that draws random cases for `check_<name>` from a NumPy Generator."""
    def register(make_random_cases):
        registered(name).make_random_cases = make_random_cases
        return make_random_cases
    return register


def mistake(name, hint, dtype=False):
    """Register a wrong implementation of `mha.numpy.<name>` and the hint for it (`dtype`: see `Mistake`)."""
    def register(fn):
        registered(name).mistakes.append(Mistake(name, hint, fn, dtype))
        return fn
    return register


def all_mistakes():
    """Every catalogued mistake, check by check."""
    return [m for check in CHECKS.values() for m in check.mistakes]


def matching_hint(check, case, got):
    """The hint of the first catalogued mistake whose answer equals `got`, if any (a mistake that gives
    the right answer on this case says nothing about it, and is passed over)."""
    right = expected_answer(check.name, case)
    for m in check.mistakes:
        try:
            with np.errstate(all="ignore"):
                wrong = case.call(m.fn)
            if same_answer(wrong, got, check.returns) and not same_answer(wrong, right, check.returns):
                return m.hint
        except Exception:
            continue
    return None


def dtype_hint(check, case, got):
    """The hint of the first catalogued mistake of the dtype (`Mistake.dtype`) whose answer on `case` has the dtypes of
    `got`, if any: where the answer's dtype is wrong, its values are not what the hint is about."""
    try:
        dtypes = [np.asarray(a).dtype for a in flatten(got, check.returns)]
    except ValueError:
        return None
    for m in check.mistakes:
        try:
            with np.errstate(all="ignore"):
                wrong = flatten(case.call(m.fn), check.returns)
        except Exception:
            continue
        if m.dtype and [np.asarray(a).dtype for a in wrong] == dtypes:
            return m.hint
    return None


def fresh_seed():
    """A seed for the random cases of one call, from the operating system's randomness: no two calls
    can be told apart in advance, so no answer recorded in one call fits the next."""
    return secrets.randbits(32)


def seed_line(name, fn, seed):
    """How to draw the same random cases again (`fn`: the learner's function, or its name)."""
    shown = fn if isinstance(fn, str) else getattr(fn, "__name__", "")
    shown = shown if shown.isidentifier() else "fn"
    return f"  seed {seed} drew the random cases: reproduce with check_{name}({shown}, seed={seed})"


def call_learner(check, fn, case, seed):
    """(answer, args, kwargs, peak) of the learner's function on `case`: the arguments as the function
    left them, and the most memory it took (tracemalloc, only for a case with `peak_bytes`); or
    CheckFailed (NotImplementedError for a stub) saying why there is no answer."""
    args, kwargs = case.arguments()
    guard, failure = refusing(check, fn), None
    if not guard.watching:  # fn is mha's own function (or a forbidden one), handed in as it is
        raise CheckFailed(f"this is mha's own {guard.refused}, not yours{what_it_does(check, guard.refused)}: "
                          f"write it yourself, using only {check.may_use}\n{seed_line(check.name, fn, seed)}")
    with np.errstate(all="ignore"), guard, memory_watch(case) as peak:
        try:
            got = fn(*args, **kwargs)
        except Exception as error:
            failure = error
    if guard.caught:
        does = (", the function this exercise asks you to write" if guard.refused == check.name
                else what_it_does(check, guard.refused))
        raise CheckFailed(
            f"{check.name} calls mha's own {guard.refused}{does}: write it yourself, using only {check.may_use}\n"
            f"  on the case '{case.label}'\n{seed_line(check.name, fn, seed)}")
    if case.raises is not None and failure is None:
        raise CheckFailed(
            f"{check.name} returned an answer on the case '{case.label}', where it must raise "
            f"{case.raises.__name__} ({describe_case(reference(check.name), case)})\n{seed_line(check.name, fn, seed)}")
    if case.raises is not None and isinstance(failure, case.raises):
        return RAISED_AS_REQUIRED, args, kwargs, peak()
    if failure is None:
        return got, args, kwargs, peak()
    if isinstance(failure, NotImplementedError):
        raise NotImplementedError(
            f"{check.name} is not written yet: write it in the cell above, then run this check again") from None
    wanted = f" (it must raise {case.raises.__name__} here)" if case.raises is not None else ""
    raise CheckFailed(
        f"{check.name} raised {type(failure).__name__}: {failure}{wanted}\n"
        f"  on the case '{case.label}' ({describe_case(reference(check.name), case)})\n"
        f"{seed_line(check.name, fn, seed)}") from None


RAISED_AS_REQUIRED = object()  # the answer of a function that raised the exception its case requires


def refusing(check, fn):
    """The guard under which the learner's `fn` runs: the exercise's function and every one of `check.forbids` refused
    (those of mha.numpy in both faces)."""
    return Refusing(check.name, reference(check.name), fn, {name: library_function(name) for name in check.forbids})


def what_it_does(check, refused):
    """Why a forbidden function is refused, for the messages ("" for the exercise's own function)."""
    return "" if refused == check.name else ", which does this exercise's work"


def shared_memory(check, got, args, kwargs):
    """None, or which array of the answer shares memory with which input, where the text promises a new array or
    copies (`check.fresh`). The notebook's check only: memory does not cross to the grader's process."""
    if not check.fresh:
        return None
    try:
        answers = [a for a in flatten(got, check.returns) if isinstance(a, np.ndarray)]
    except ValueError:
        return None
    names = list(inspect.signature(reference(check.name)).parameters)
    inputs = [(names[i] if i < len(names) else f"argument {i}", a) for i, a in enumerate(args)]
    inputs += list(kwargs.items())
    inputs += [(f"{name}[{j}]", item) for name, value in list(inputs) if isinstance(value, (list, tuple))
               for j, item in enumerate(value)]  # the arrays of a list given (clip_grad_norm's grads)
    for i, answer in enumerate(answers):
        for name, value in inputs:
            if isinstance(value, np.ndarray) and np.may_share_memory(answer, value) and np.shares_memory(answer, value):
                part = "the result" if len(answers) == 1 and check.returns is None else f"array {i} of the result"
                return (f"{part} shares memory with the input {name}: the text asks for a new array (a copy), not "
                        f"a view of the input (slicing, np.split and reshape give views; .copy() makes a copy)")
    return None


@contextlib.contextmanager
def memory_watch(case):
    """Inside: tracemalloc follows the allocations (NumPy reports its arrays to it) when the case has
    `peak_bytes`. Yields a function that returns the peak in bytes (None when not measured)."""
    if case.peak_bytes is None or tracemalloc.is_tracing():
        yield lambda: None
        return
    tracemalloc.start()
    peak = []
    try:
        yield lambda: peak[0] if peak else None
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def problem_with(check, case, got, args, kwargs, peak=None):
    """None if the learner's answer `got` on `case` is right, else what is wrong: an input changed in
    place, more memory than the case allows, or the answer itself (compared with the reference's).
    The notebook's check and the grader both decide with this."""
    changed = changed_arguments(reference(check.name), case, args, kwargs)
    if changed:
        return f"{changed}: a function must leave its inputs as they were (work on a copy)"
    if got is RAISED_AS_REQUIRED:
        return None
    if case.peak_bytes is not None and peak is not None and peak > case.peak_bytes:
        return (f"the call took {peak / 2**20:.1f} MiB at its peak, more than the {case.peak_bytes / 2**20:.1f} "
                f"MiB allowed: {case.too_much}")
    expected = expected_answer(check.name, case)  # only now: no answer waits in a frame the learner could read
    return compare_result(expected, got, check.returns, check.float32_promised)


DTYPE_HINT = ("keep the input's dtype: a float64 input is answered in float64, and here float32 stays float32. "
              "A float64 NumPy scalar (np.sqrt(d), np.float64(...)) or a float64 array in the arithmetic turns "
              "float32 into float64; use a Python float (d ** 0.5) or .astype(x.dtype)")
# A whole number where the answer is a float (a count of bytes, say): floor division or int() dropped the fraction.
INTEGER_HINT = ("return a float, not a whole number: true division (/) gives one, while floor division (//), "
                "int() and round() give integers, which drop the fraction where the answer has one")


def failure_message(check, case, got, problem, fn_name, seed):
    """The whole message of a wrong answer: the case, the problem, the hint of a matching mistake, the seed."""
    if "expected dtype" in problem:
        hint = dtype_hint(check, case, got) or (
            INTEGER_HINT if re.search(r"expected dtype float\d+, got u?int", problem) else DTYPE_HINT)
    elif got is RAISED_AS_REQUIRED or any(words in problem for words in ("in place", "at its peak", "shares memory")):
        hint = None  # the answer's values are not what is wrong: no mistake's hint fits
    else:
        hint = matching_hint(check, case, got)
    return (f"{check.name} gives a wrong answer on the case '{case.label}'\n"
            f"  input: {describe_case(reference(check.name), case)}\n  {problem}"
            + (f"\n  hint: {hint}" if hint else "") + "\n" + seed_line(check.name, fn_name, seed))


def expected_answer(name, case):
    """The reference's answer on `case`, computed by the library as it was at import. (It never divides
    by zero or overflows; errstate only hushes the rare spurious "invalid value" flag of a BLAS matmul.)"""
    with untouched_library(), np.errstate(all="ignore"):
        return case.call(reference(name))


def run_check(name, fn, seed=None):
    """Call `fn` on the named cases, then on random ones, both drawn with `seed` (fresh when None), and compare
    with the library's `mha.numpy.<name>`. Prints one line when all pass; raises CheckFailed otherwise."""
    check = registered(name)
    if not callable(fn):
        raise CheckFailed(f"check_{name} needs a function, got {type(fn).__name__}")
    seed = fresh_seed() if seed is None else seed
    named, shared = check.named_cases(seed), None
    for case in named + check.make_random_cases(np.random.default_rng(seed)):
        got, args, kwargs, peak = call_learner(check, fn, case, seed)
        problem = problem_with(check, case, got, args, kwargs, peak)
        if problem:
            raise CheckFailed(failure_message(check, case, got, problem, fn, seed))
        said = shared is None and got is not RAISED_AS_REQUIRED and shared_memory(check, got, args, kwargs)
        shared = (case, got, said) if said else shared  # said once every answer is right: the values come first
    broken = broken_rule_of(name, check.rules, fn)  # the route, once the answers are right: their hints come first
    if broken:
        raise CheckFailed(f"{broken}\n{seed_line(name, fn, seed)}")
    if shared:
        raise CheckFailed(failure_message(check, *shared, fn, seed))
    print(f"check_{name}: all {len(named)} cases passed.")  # the named ones; the random ones come on top


def make_check(name):
    """The function `check_<name>(fn, *, seed=None)` that a chapter exports; its cases, named and
    random, must be registered."""
    if registered(name).make_random_cases is None:
        raise LookupError(f"no random cases are registered for {name}: "
                          f"decorate a function with @random_cases_for({name!r}) first")

    def check(fn, *, seed=None):
        run_check(name, fn, seed)
    check.__name__ = check.__qualname__ = f"check_{name}"
    check.__module__ = "mha.checks"  # where learners import it from
    check.__doc__ = (f"Check a learner's `{name}` against `mha.numpy.{name}` on named and random cases; "
                     f"raises CheckFailed with a hint on a wrong answer. `seed` repeats a failed draw.")
    return check
