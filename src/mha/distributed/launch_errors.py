"""How `mha.distributed.launch` reports a failure: its exceptions, and the one it raises for a failed call.

    RankError        a rank died without a result, or what it raised cannot be rebuilt here
    LaunchTimeout    the ranks did not all finish within the timeout (a TimeoutError)
    PortInUseError   the port given is in use (an OSError and a ValueError)
    RemoteTraceback  the traceback of a rank's exception, as text: the `__cause__` of what the caller sees

`failed_call_error(ranks)` turns the ranks of a failed call (the caller's `launcher.Rank` objects) into
the one exception to raise: the rank that failed first, with a note naming the ranks that failed after
it. `timeout_error(ranks, timeout)` names the ranks that had not finished and whether each had joined
the process group. Messages end with the last lines of the rank's own output (its log).
"""

import errno
import pickle
import signal


class RankError(RuntimeError):
    """A rank failed and its own exception could not be raised here: it died without a result,
    or its exception (or its result) could not be unpickled. `rank` says which."""

    def __init__(self, message, rank=None, exit_code=None):
        super().__init__(message)
        self.rank, self.exit_code = rank, exit_code

    def __reduce__(self):  # pickle the keywords too (a launch inside a rank sends it on)
        return type(self), (self.args[0], self.rank, self.exit_code), self.__dict__


class LaunchTimeout(TimeoutError):
    """The ranks did not all finish within the timeout. `ranks`: those that had not finished;
    `joined`: those of them that had joined the process group."""

    def __init__(self, message, ranks=(), joined=()):
        super().__init__(message)
        self.ranks, self.joined = list(ranks), list(joined)

    def __reduce__(self):
        return type(self), (self.args[0], self.ranks, self.joined), self.__dict__


class PortInUseError(OSError, ValueError):
    """The port given to launch is already in use. An OSError (what binding it raises) and a
    ValueError (a bad argument)."""

    def __init__(self, port):
        super().__init__(errno.EADDRINUSE, f"port={port} is already in use on this machine: pass another "
                                           f"port, or port=None to let launch pick a free one")
        self.port = port

    def __reduce__(self):
        return type(self), (self.port,), self.__dict__


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a rank, as text: the `__cause__` of the exception
    re-raised in the caller (as concurrent.futures does for its worker processes)."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return self.text


# --- A failed rank: the exception that tells the caller how it failed ---

def failed_call_error(ranks):
    """The exception of the rank that failed first (its failure often makes the others fail),
    with a note naming the ranks that failed after it."""
    failed = sorted((rank for rank in ranks if rank.failed), key=lambda rank: (rank.failed_at, rank.rank))
    error = rank_error(failed[0])
    if len(failed) > 1:
        later = "; ".join(f"rank {rank.rank}: {summary(rank.outcome)}" for rank in failed[1:])
        error.add_note(f"then other ranks failed too: {later}")
    return error


def rank_error(rank):
    """How one failed rank failed, from its outcome: ("died", exit code), ("unreadable", why) or
    ("error", the record that the rank wrote, rank_process.error_record)."""
    kind, detail = rank.outcome
    if kind == "died":
        return RankError(f"rank {rank.rank} of {rank.world_size} {how_it_ended(detail)} without a result"
                         + with_log(rank.describe_log()), rank=rank.rank, exit_code=detail)
    if kind == "unreadable":
        return RankError(f"rank {rank.rank} of {rank.world_size} returned a result that cannot be unpickled "
                         f"in the caller ({detail}): return objects that the caller can import, such as "
                         f"tensors, numbers or arrays", rank=rank.rank)
    return rebuilt_exception(detail, rank.rank, rank.world_size, rank.describe_log())


def rebuilt_exception(record, rank, world_size, log):
    """The rank's own exception, as raised there, when it unpickles here; else a RankError."""
    where = f"raised in rank {rank} of {world_size} (launched by mha.distributed.launch; its traceback above)"
    try:
        error = pickle.loads(record["exception"]) if record["exception"] is not None else None
        if error is not None and not isinstance(error, Exception):  # e.g. SystemExit: never end the caller
            raise TypeError(f"{type(error).__name__} is not an Exception")
    except Exception as why:
        error = None
        reason = f"{type(why).__name__}: {why}"
    else:
        reason = record["unpicklable"]
    if error is None:
        error = RankError(f"rank {rank} of {world_size} raised {record['type']}: {record['message']} "
                          f"(the exception itself could not be rebuilt here: {reason})", rank=rank)
    else:
        error.add_note(where)
    if log:
        error.add_note(log)
    error.__cause__ = RemoteTraceback(f'\n"""\n{record["traceback"].rstrip()}\n"""')
    return error


def summary(outcome):
    """One line on a failed rank's outcome, for the note on the ranks that failed later."""
    kind, detail = outcome
    if kind == "died":
        return how_it_ended(detail)
    if kind == "unreadable":
        return f"returned a result that cannot be unpickled ({detail})"
    return f"{detail['type']}: {detail['message']}".splitlines()[0][:200]


def how_it_ended(code):
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def with_log(text):
    return "\n" + text if text else ""


# --- The deadline passed ---

def timeout_error(ranks, timeout):
    """LaunchTimeout naming the ranks that had not finished, and whether each had joined the group."""
    unfinished = [rank.rank for rank in ranks if rank.outcome is None]
    joined = [rank.rank for rank in ranks if rank.outcome is None and rank.joined]
    finished = [rank.rank for rank in ranks if rank.outcome is not None]
    message = (f"{ranks_phrase(unfinished)} of {len(ranks)} did not finish within {timeout:g} s "
               f"({joined_phrase(unfinished, joined)})")
    if finished:
        message += f"; {ranks_phrase(finished)} finished"
    message += (". A rank that never reaches a collective the others wait in ends this way, and so does work "
                "longer than the timeout: pass a larger timeout= if the work needs it.")
    if not joined:
        message += " Starting a rank (Python and torch) takes a few seconds of it."
    logs = [rank.describe_log(lines=10) for rank in ranks if rank.outcome is None]
    return LaunchTimeout(message + with_log("\n".join(log for log in logs if log)), ranks=unfinished, joined=joined)


def ranks_phrase(ranks):
    """"rank 1", or "ranks 0, 2, 3"."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def joined_phrase(unfinished, joined):
    if len(unfinished) == 1:
        return "it had joined the process group" if joined else "it had not joined the process group"
    if len(joined) == len(unfinished):
        return "all had joined the process group"
    if not joined:
        return "none had joined the process group"
    missing = [rank for rank in unfinished if rank not in joined]
    return f"{ranks_phrase(joined)} had joined the process group, {ranks_phrase(missing)} had not"
