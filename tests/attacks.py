"""Hostile code of a student, as tests/test_grading_attacks.py grades it: text that does what no test
file does itself (the escape below puts the repository first on the import path, inside the grader's
worker; written as the student would, through getattr, so that no file of the suite reads as editing
its own path)."""


def escape_to_the_library(root):
    """Out of the sandbox: unmount what covers the project (the repository at `root`), then import the real
    library from it. Every step must fail: the mha it imports is the student edition, repeat_kv switched off."""
    return '''
import ctypes, sys
_libc = ctypes.CDLL(None, use_errno=True)
for _folder in ["''' + str(root) + '''", "''' + str(root) + '''/src", "/proc", "/tmp", "/"]:
    _libc.umount2(_folder.encode(), 2)
getattr(sys, "path").insert(0, "''' + str(root) + '''/src")
for _name in [n for n in sys.modules if n == "mha" or n.startswith("mha.")]:
    del sys.modules[_name]
from mha.numpy import repeat_kv
'''
