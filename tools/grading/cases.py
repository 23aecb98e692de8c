"""The grader's side of a check: draw the cases, send their inputs, judge what comes back.

The cases, the expected answers (mha.checks.reference), the comparison and the hints
(mha.checks.registry) live in the grader's process only. The worker receives a case's
inputs and returns the student's outputs as plain data (grading/wire.py); a function
given as an input (chapter 11's language model) crosses as its table of logits and is
rebuilt on the other side. A reply is judged exactly as the notebook's check judges an
answer (`registry.problem_with`): type, dtype and shape, values, inputs unchanged, and
the peak memory of a case that bounds it, here measured by the grader from outside. Once every case is
answered right, the route the exercise asks for is read from the student's cells in this process
(grading/syntax_rules.py), as the notebook's check reads it from the function.
"""

import numpy as np

import mha.checks  # noqa: F401 - every chapter's checks, registered
from mha.checks import registry
from mha.checks.common import ToyLanguageModel
from mha.checks.compare import describe_case
from tools.grading import wire
from tools.grading.sandbox import LimitReached
from tools.grading.syntax_rules import broken_rule_in


def registered(check_name):
    """The registry's Check for a manifest's check name ("check_softmax")."""
    return registry.registered(check_name.removeprefix("check_"))


def to_wire(value):
    """`value` with each function-as-data (ToyLanguageModel) replaced by what crosses (its table)."""
    if isinstance(value, ToyLanguageModel):
        return wire.TableModel(value.table)
    if isinstance(value, (tuple, list)):
        return type(value)(to_wire(v) for v in value)
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value


def toy_model(table):
    """A table that came back from the worker, as the ToyLanguageModel it was sent as."""
    model = object.__new__(ToyLanguageModel)
    model.table, model.vocab_size = np.asarray(table), len(table)
    return model


def reply_problem(check, case, reply):
    """(status, message) when the reply carries no answer to judge; None when it does."""
    status = reply.get("status")
    if status == "returned":
        return None
    if status in ("missing", "not written"):
        return status, reply.get("message", "")
    if status == "unsendable":
        return "failed", f"{check.name} returned something that is not an answer: {reply.get('message')}"
    message = str(reply.get("message", "no answer"))
    return "failed", (f"{check.name} raised {message}\n"
                      f"  on the case '{case.label}' ({describe_case(registry.reference(check.name), case)})")


def raise_problem(check, case, reply):
    """None if the function raised the exception that `case` requires, else (status, message)."""
    if reply.get("status") == "raised" and case.raises.__name__ in reply.get("types", []):
        return None
    if reply.get("status") == "returned":
        return "failed", (f"{check.name} returned an answer on the case '{case.label}', where it must raise "
                          f"{case.raises.__name__}")
    status, message = reply_problem(check, case, reply)
    return status, message + (f" (it must raise {case.raises.__name__} here)" if status == "failed" else "")


def answer(reply):
    """(result, args, kwargs) decoded from a reply: ValueError/TypeError if they are not plain data."""
    result = wire.untag(reply["result"], rebuild=toy_model)
    args = wire.untag(reply["args"], rebuild=toy_model)
    kwargs = wire.untag(reply["kwargs"], rebuild=toy_model)
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise TypeError("the arguments came back in another shape")
    return result, args, kwargs


def data_bytes(value):
    """The bytes of the arrays and strings in `value` (nested in tuples, lists and dicts), a few for the rest."""
    if isinstance(value, np.ndarray | np.generic):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(map(data_bytes, value)) + 64
    if isinstance(value, dict):
        return sum(data_bytes(v) + len(k) for k, v in value.items()) + 64
    if isinstance(value, ToyLanguageModel):
        return value.table.nbytes
    return len(str(value)) + 64


def reply_limit(args, kwargs, expected):
    """The most bytes a reply to this case may take: its result (at twice the expected answer's size, so that a
    float64 answer to a float32 case still crosses) and its arguments as the function left them, in base64
    (4/3) and JSON, with a margin. A reply beyond it is refused before it is read."""
    return 2 * (2 * data_bytes(expected) + data_bytes(args) + data_bytes(kwargs)) + 2**20


def judge_case(session, worker, check, function, case, seed):
    """None if the student's function answers `case` right, else (status, message)."""
    args, kwargs = case.arguments()
    measure = case.peak_bytes is not None
    limit = reply_limit(args, kwargs, None if case.raises else registry.expected_answer(check.name, case))
    reply, peak = session.ask(worker, lambda seconds: worker.call(function, to_wire(args), to_wire(kwargs), seconds,
                                                                 measure_memory=measure, reply_limit=limit))
    if reply.get("status") == "raised" and str(reply.get("message", "")).startswith("MemoryError"):
        worker.kill()  # out of memory: at the limit, the worker goes, and the notebook's other checks fail
        session.stopped = f"used more than {session.limits.memory_bytes / 2**30:g} GiB"
        raise LimitReached(session.stopped)
    if case.raises is not None:
        return raise_problem(check, case, reply)
    problem = reply_problem(check, case, reply)
    if problem:
        return problem
    try:
        got, args_after, kwargs_after = answer(reply)
    except (KeyError, TypeError, ValueError) as error:
        return "failed", f"{check.name}'s answer could not be read as data: {error}"
    wrong = registry.problem_with(check, case, got, args_after, kwargs_after, peak)
    if wrong:
        return "failed", registry.failure_message(check, case, got, wrong, function, seed)
    return None


def judge(session, worker, manifest_check, seed):
    """(status, message) of one check of the manifest on the student's function in `worker`."""
    check, function = registered(manifest_check["check"]), manifest_check["function"]
    named = check.named_cases(seed)  # drawn from the grading seed, as the random ones
    try:
        for case in named + check.make_random_cases(np.random.default_rng(seed)):
            problem = judge_case(session, worker, check, function, case, seed)
            if problem:
                return problem
    except LimitReached as limit:
        return "failed", str(limit)
    broken = broken_rule_in(session.notebook.cells, check, function)  # read here, from the notebook: never the worker
    if broken:
        return "failed", f"{broken}\n{registry.seed_line(check.name, function, seed)}"
    return "passed", f"check_{check.name}: all {len(named)} cases passed."
