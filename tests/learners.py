"""Solutions as learners write them, for the tests of `mha.checks`.

`own_copy(name)` is a right solution that is the learner's own: the library's source
for `mha.numpy.<name>`, compiled again in a module of the learner's (as if copied into
a notebook cell), so that it is another function with the same answers. The recorders
and replays are wrong solutions that remember what an earlier check asked and answered.
"""

import inspect
import sys
import textwrap

import numpy as np

import mha.numpy as mn


def own_copy(name):
    """mha.numpy.<name>, its source compiled again outside mha: right answers, the learner's own code."""
    library = getattr(mn, name)
    namespace = dict(vars(sys.modules[library.__module__]), __name__="learner")
    exec(compile(textwrap.dedent(inspect.getsource(library)), "<learner>", "exec"), namespace)
    return namespace[name]


def recorded(name):
    """A right solution that writes down every (inputs, answer) it gives, in call order."""
    solve, calls = own_copy(name), []

    def recorder(*args, **kwargs):
        answer = solve(*args, **kwargs)
        calls.append(((args, kwargs), answer))
        return answer
    return recorder, calls


def replay_in_order(calls):
    """A solution that gives back the recorded answers one after another, whatever it is asked."""
    answers = iter([answer for _, answer in calls])

    def replay(*args, **kwargs):
        return next(answers)
    return replay


def replay_by_input(calls):
    """A solution that looks the inputs up among the recorded ones, and answers zeros when they are new."""
    def replay(*args, **kwargs):
        for (seen_args, seen_kwargs), answer in calls:
            if same_inputs((seen_args, seen_kwargs), (args, kwargs)):
                return answer
        return np.zeros(1)
    return replay


def same_inputs(a, b):
    """True when two nests of arrays, numbers and None are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_inputs(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_inputs(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and np.array_equal(a, b)
    return type(a) is type(b) and a == b
