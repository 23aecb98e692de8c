"""Collectives that count what they are handed, and carry gradients.

Every collective of `mha.distributed` goes through this module, so that a `Traffic`
opened with `count_payload()` sees each one: its operation ("all_reduce",
"all_to_all", "send"), the pass it belongs to ("forward" or "backward"), and the
elements and bytes handed to it. That is the payload a wrapper can see; what the
algorithm then puts on the wire is another number (a ring all-reduce sends about
2(P - 1)/P of its payload per rank), which chapter 15's cost model adds.

Gradients. `send`/`recv` and the raw collectives of `torch.distributed` carry no
gradient, so each collective here is a `torch.autograd.Function` whose backward is
the collective that the chain rule asks for:
- `copy_to_ranks` (Megatron-LM's f): identity forward, all-reduce backward, at the
  input of a block split by heads, whose every rank reads the same x;
- `sum_over_ranks` (Megatron-LM's g): all-reduce forward, identity backward, where
  the ranks' partial outputs are added;
- `all_to_all`: an all-to-all forward, the inverse all-to-all backward.
"""

from collections import Counter
from contextlib import contextmanager

import torch
import torch.distributed as dist

PASSES = ("forward", "backward")

_open = []  # the Traffic records now counting, innermost last


class Traffic:
    """What this process handed to collectives: calls, elements and bytes by (operation, pass).

    traffic.elements["all_reduce", "forward"] is the number of elements handed to
    forward all-reduces while the record was open."""

    def __init__(self):
        self.calls, self.elements, self.bytes = Counter(), Counter(), Counter()
        self.work = Counter()  # (what, pass) -> count: ring attention's chunk pairs and multiply-adds

    def add(self, op, direction, tensors):
        self.calls[op, direction] += 1
        self.elements[op, direction] += sum(t.numel() for t in tensors)
        self.bytes[op, direction] += sum(t.numel() * t.element_size() for t in tensors)

    def by_pass(self, direction):
        """{operation: elements} handed in one pass ("forward" or "backward")."""
        if direction not in PASSES:
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        return {op: n for (op, d), n in self.elements.items() if d == direction}

    def as_dict(self):
        """A plain dict for results that cross processes: {"op/pass": {"calls", "elements", "bytes"}}."""
        payload = {f"{op}/{d}": {"calls": self.calls[op, d], "elements": self.elements[op, d],
                                 "bytes": self.bytes[op, d]} for op, d in sorted(self.calls)}
        return {"payload": payload, "work": {f"{what}/{d}": n for (what, d), n in sorted(self.work.items())}}


@contextmanager
def count_payload():
    """Open a `Traffic` that counts every collective of `mha.distributed` until the block ends.

        with count_payload() as traffic:
            out = model(x); out.sum().backward()
        traffic.elements["all_reduce", "forward"]
    """
    traffic = Traffic()
    _open.append(traffic)
    try:
        yield traffic
    finally:
        _open.remove(traffic)


def record(op, direction, *tensors):
    """Count `tensors` as handed to `op` in pass `direction`, in every open Traffic."""
    for traffic in _open:
        traffic.add(op, direction, tensors)


def record_work(what, direction, n):
    """Count n units of computation (say "chunk_pairs") in pass `direction`, in every open Traffic."""
    for traffic in _open:
        traffic.work[what, direction] += n


def all_reduce_(x, direction, group=None):
    """Sum x over the ranks of `group`, in place, counted."""
    record("all_reduce", direction, x)
    dist.all_reduce(x, group=group)
    return x


class SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward: every rank's partial sum affects the
    replicated total with slope 1, and every rank holds the same gradient of that total."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_(x.clone(), "forward", group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class CopyToRanks(torch.autograd.Function):
    """Identity forward; all-reduce (sum) backward: each rank's heads send back a part of
    the gradient of the input they share, and the input's gradient is the sum of the parts."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_(grad.contiguous().clone(), "backward", ctx.group), None


def sum_over_ranks(x, group=None):
    """The sum over ranks of each rank's x (an all-reduce), differentiable. x: any shape."""
    return SumOverRanks.apply(x, group)


def copy_to_ranks(x, group=None):
    """x itself, marked as read by every rank: its gradient is summed over ranks in the backward."""
    return CopyToRanks.apply(x, group)


def all_to_all_(x, scatter_dim, gather_dim, direction, group=None):
    """Split x into P pieces along scatter_dim, send piece s to rank s, and concatenate the
    pieces received from ranks 0 .. P-1 along gather_dim. Counted: x is handed whole."""
    world = dist.get_world_size(group)
    if x.shape[scatter_dim] % world:
        raise ValueError(f"all_to_all splits dimension {scatter_dim} of shape {tuple(x.shape)} "
                         f"into {world} equal pieces: {x.shape[scatter_dim]} is not divisible by {world}")
    pieces = [p.contiguous() for p in x.chunk(world, dim=scatter_dim)]
    received = [torch.empty_like(p) for p in pieces]
    record("all_to_all", direction, x)
    dist.all_to_all(received, pieces, group=group)
    return torch.cat(received, dim=gather_dim)


class AllToAll(torch.autograd.Function):
    """all_to_all_ forward; backward, the inverse all-to-all (the dims swapped)."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return all_to_all_(x, scatter_dim, gather_dim, "forward", group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all_(grad, gather_dim, scatter_dim, "backward", ctx.group), None, None, None


def all_to_all(x, scatter_dim, gather_dim, group=None):
    """Differentiable all-to-all: split along scatter_dim across ranks, gather along gather_dim."""
    return AllToAll.apply(x, scatter_dim, gather_dim, group)


def ring_neighbours(group=None):
    """(the rank this one sends to, the rank it receives from) on the ring 0 -> 1 -> ... -> P-1 -> 0."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    return (rank + 1) % world, (rank - 1) % world


class RingPass:
    """Each tensor sent to the next rank on the ring while the previous rank's arrive, started at
    once (so that computation can go on meanwhile); `wait()` returns the tensors received, in the
    same order. Counted as "send": what this rank hands over."""

    def __init__(self, tensors, direction, group=None):
        send_to, receive_from = ring_neighbours(group)
        tensors = [t.contiguous() for t in tensors]
        self.received = [torch.empty_like(t) for t in tensors]
        record("send", direction, *tensors)
        ops = [dist.P2POp(dist.isend, t, send_to, group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, receive_from, group) for r in self.received]
        self.requests = dist.batch_isend_irecv(ops)
        self.sent = tensors  # kept alive until the sends complete

    def wait(self):
        for request in self.requests:
            request.wait()
        return self.received


def ring_pass(tensors, direction, group=None):
    """Send each tensor to the next rank on the ring, receive the previous rank's, and wait."""
    return RingPass(tensors, direction, group).wait()


def all_reduce_gradients(module, group=None):
    """Sum the gradients of `module`'s parameters over ranks (counted as a backward all-reduce):
    what data parallelism does for weights every rank holds whole, as Ulysses' and the ring's
    projections are."""
    for parameter in module.parameters():
        if parameter.grad is not None:
            all_reduce_(parameter.grad, "backward", group)
