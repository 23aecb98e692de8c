"""The reference that the checks compare with, kept out of the learner's reach.

`NUMPY` holds the public names of `mha.numpy` as they were when `mha.checks` was
first imported. The checks read their reference there, never in `mha.numpy` at
check time: after `mha.numpy.softmax = my_softmax`, `check_softmax(my_softmax)`
still compares with the library's own softmax.

The reference calls its helpers by their names in the face's modules
(`multihead_attention` calls `scaled_dot_product_attention` through the globals
of `mha.numpy.attention`). `untouched_library()` puts those names back as they
were, for as long as the reference runs, and then restores what the learner set.
"""

import contextlib
import importlib
import inspect
import sys
import types

import mha.numpy

MISSING = object()  # a global that the learner deleted


def snapshot(face):
    """The public names of `face` as the library defines them, even if some were already reassigned
    (found again in the face's own modules)."""
    names = {name: getattr(face, name) for name in face.__all__}
    for name, value in names.items():
        if callable(value) and not getattr(value, "__module__", "").startswith(face.__name__):
            names[name] = defined_in_the_modules_of(face, name)
    return types.SimpleNamespace(**names)


def defined_in_the_modules_of(face, name):
    """The function `name` as one of the face's modules defines it."""
    for module_name, module in list(sys.modules.items()):
        original = getattr(module, name, None) if module_name.startswith(face.__name__ + ".") else None
        if getattr(original, "__module__", None) == module_name:
            return original
    raise ImportError(f"{face.__name__}.{name} was replaced before mha.checks was imported, and no module of "
                      f"{face.__name__} defines it: restart the kernel, then import mha.checks first")


NUMPY = snapshot(mha.numpy)

# The globals of the modules that define the face's functions, as they were at import.
ORIGINAL_GLOBALS = {module: dict(vars(module)) for module in
                    {sys.modules[f.__module__] for f in vars(NUMPY).values() if isinstance(f, types.FunctionType)}}


def reference(name):
    """The library's own `mha.numpy.<name>`, as it was when mha.checks was imported."""
    return getattr(NUMPY, name)


def library_function(name):
    """The library function that a check names: `mha.numpy.<name>` as at import (`reference`), or, for a dotted name
    of another module of mha (a check's `forbids`: "mha.text.bits_per_character"), that module's function."""
    if "." not in name:
        return reference(name)
    module, _, attribute = name.rpartition(".")
    if module.split(".")[0] != "mha":
        raise ValueError(f"a dotted library name must name a module of mha, got {name!r}")
    function = getattr(importlib.import_module(module), attribute)
    return inspect.unwrap(function)


@contextlib.contextmanager
def untouched_library():
    """Inside: every global of the face's modules is the one from import time. After: the learner's again."""
    changed = []
    for module, original in ORIGINAL_GLOBALS.items():
        now = vars(module)
        for name, value in original.items():
            if now.get(name, MISSING) is not value:
                changed.append((now, name, now.get(name, MISSING)))
                now[name] = value
    try:
        yield
    finally:
        for now, name, value in changed:
            if value is MISSING:
                del now[name]
            else:
                now[name] = value
