"""What crosses between the grader and its worker: plain data, never pickle.

A message is 8 bytes of length, then JSON. Values are tagged so that nothing is lost
on the way: a tuple stays a tuple, a float32 array stays float32 with its shape, a
NumPy scalar keeps its dtype. Only these cross:

    None, bool, int, float, str
    tuple, list, dict with str keys             of values that cross
    numpy arrays and scalars                    of bool, int, uint or float dtype
    numpy dtypes and scalar types               of those kinds (dtype=np.float32)
    TableModel                                  a function given as data: a table of logits

Anything else (an object array, a torch tensor, a function) cannot be encoded:
`encode` raises TypeError naming it, and `decode` refuses it, so a result is data
that the grader validates before it compares. This file is copied into the worker's
sandbox and must import nothing but NumPy.
"""

import base64
import json
import os
import re
import struct

import numpy as np

KINDS = "biuf"  # the dtype kinds that cross: bool, signed and unsigned integers, floats
MAX_BYTES = 512 * 2**20  # the largest request the grader sends (a case's inputs)
MAX_REPLY = 8 * 2**20  # the largest reply, unless a request allows more (sandbox.reply_limit)
MAX_DEPTH = 32  # the deepest nesting of a message: a tagged tuple of lists of arrays is about 8
MAX_ITEMS = 100_000  # the most values in a message: the cases' results hold a few dozen arrays
HEADER = struct.Struct("<Q")


class TableModel:
    """A stand-in language model given as data: tokens (..., T) -> logits (..., T, V), read from a
    (V, V) table by a summary of each prefix (the same rule as mha.checks.ch11.ToyLanguageModel)."""

    def __init__(self, table):
        self.table = np.asarray(table)
        self.vocab_size = self.table.shape[0]

    def __call__(self, tokens):
        tokens = np.asarray(tokens)
        if tokens.dtype == bool or not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"the model takes integer token ids, got dtype {tokens.dtype}")
        weighted = tokens * (np.arange(tokens.shape[-1]) + 2)  # (..., T): token s counts s + 2 times
        summary = np.cumsum(weighted, axis=-1) % self.vocab_size  # (..., T)
        return self.table[summary]  # (..., T, V)


def _array(a):
    a = np.asarray(a)  # (not ascontiguousarray, which makes a 0-d array 1-d)
    if a.dtype.kind not in KINDS:
        raise TypeError(f"an array of dtype {a.dtype} cannot be sent: only bool, int and float arrays")
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a.tobytes(order="C")).decode()}


def tag(value):
    """`value` as JSON-ready tagged data; TypeError for anything that does not cross."""
    if isinstance(value, np.generic):  # first: np.float64 is also a Python float
        return {"t": "scalar", **_array(np.asarray(value))}
    if value is None or isinstance(value, (bool, str)):
        return {"t": "py", "v": value}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"t": "int", "v": str(value)}  # exact, however large
    if isinstance(value, float):
        return {"t": "float", "v": repr(value)}  # nan and inf too
    if isinstance(value, np.ndarray):
        return {"t": "array", **_array(value)}
    if isinstance(value, (tuple, list)):
        return {"t": type(value).__name__, "v": [tag(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a dict with keys other than strings cannot be sent")
        return {"t": "dict", "v": [[k, tag(v)] for k, v in value.items()]}
    if isinstance(value, TableModel):
        return {"t": "table_model", "v": tag(value.table)}
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        dtype = np.dtype(value)  # a dtype argument (dtype=np.float32): its string, and whether it was the class
        if dtype.kind not in KINDS:
            raise TypeError(f"the dtype {dtype} cannot be sent: only bool, int and float dtypes")
        return {"t": "dtype", "v": dtype.str, "class": isinstance(value, type)}
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__} cannot be sent: "
                    "only numbers, strings, NumPy arrays, and tuples, lists and dicts of them")


def _unarray(data):
    dtype = np.dtype(data["dtype"])
    if dtype.kind not in KINDS:
        raise TypeError(f"an array of dtype {dtype} was sent")
    shape = tuple(int(n) for n in data["shape"])
    raw = base64.b64decode(data["data"], validate=True)
    if len(raw) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"an array of shape {shape} {dtype} came with {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def untag(data, rebuild=None):
    """The value that `tag` made `data` from. `rebuild` maps "table_model" to what the table becomes
    on this side (by default a TableModel)."""
    kind = data["t"]
    if kind == "py":
        if data["v"] is not None and not isinstance(data["v"], (bool, str)):
            raise TypeError(f"a {type(data['v']).__name__} was sent as a plain value")
        return data["v"]
    if kind == "int":
        return int(data["v"])
    if kind == "float":
        return float(data["v"])
    if kind == "array":
        return _unarray(data)
    if kind == "scalar":
        return _unarray(data)[()]
    if kind in ("tuple", "list"):
        items = [untag(v, rebuild) for v in data["v"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {str(k): untag(v, rebuild) for k, v in data["v"]}
    if kind == "dtype":
        dtype = np.dtype(str(data["v"]))
        if dtype.kind not in KINDS:
            raise TypeError(f"a dtype {dtype} was sent")
        return dtype.type if data.get("class") else dtype
    if kind == "table_model":
        return (rebuild or TableModel)(untag(data["v"]))
    raise TypeError(f"unknown kind of value {kind!r}")


def send(fd, message):
    """Write one message (a JSON-ready dict) to the file descriptor `fd`."""
    send_bytes(fd, json.dumps(message).encode())


def send_bytes(fd, body):
    """Write one message already encoded as JSON bytes."""
    if len(body) > MAX_BYTES:
        raise ValueError(f"a message of {len(body)} bytes is more than the {MAX_BYTES} allowed")
    view = memoryview(HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


def read_exactly(fd, n, wait=None):
    """n bytes from `fd`; EOFError if it closes first. `wait(fd)`, if given, is called before each
    read (the grader's: it raises when the time is up)."""
    chunks = []
    while n:
        if wait is not None:
            wait(fd)
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive_bytes(fd, limit=MAX_BYTES, wait=None):
    """One message's JSON bytes from `fd`; ValueError, before reading it, if it announces more than `limit`."""
    (length,) = HEADER.unpack(read_exactly(fd, HEADER.size, wait))
    if length > limit:
        raise ValueError(f"a message of {length} bytes announced, more than the {limit} allowed")
    return read_exactly(fd, length, wait)


STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes and all


def shape_of(body):
    """(depth, items) of a JSON text, read from its bytes without building any Python object: the
    deepest nesting of arrays and objects, and how many values they hold (about: commas and openings)."""
    plain = np.frombuffer(STRING.sub(b'""', body), dtype=np.uint8)
    opens = (plain == ord("[")) | (plain == ord("{"))
    closes = (plain == ord("]")) | (plain == ord("}"))
    depth = int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))
    return depth, int(opens.sum() + (plain == ord(",")).sum())


def receive(fd, wait=None, limit=MAX_BYTES, max_depth=MAX_DEPTH, max_items=MAX_ITEMS):
    """One message from `fd`: the dict that `send` wrote; ValueError if it is not one, or if it is longer,
    deeper or holds more values than the limits allow (checked before any object is built)."""
    body = receive_bytes(fd, limit, wait)
    depth, items = shape_of(body)
    if depth > max_depth or items > max_items:
        raise ValueError(f"a message nested {depth} deep with about {items} values, more than the "
                         f"{max_depth} and {max_items} allowed")
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a message that is not a JSON object")
    return message
