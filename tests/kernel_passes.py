"""The same book on every CPU: chapters and the identical-heads test re-run under other kernels.

Matrix kernels round differently on each CPU and with each number of threads; the chapters'
stored outputs and claims must hold under all of them. With $MHA_KERNEL_PASSES set (`make test`
sets it to `all`), the pytest session that runs the machine's own kernels also runs:

    generic   PyTorch's portable kernels (no vector instructions), 1 thread
    avx2      AVX2 kernels, as on a CPU without AVX-512, 2 threads

for every chapter notebook (a second copy of its cells whose Jupyter kernel starts with the pass's
environment) and for tests/test_heads.py (one item that runs the file in a fresh interpreter
with that environment). Each copy is a work unit of its own, `book/05_x.ipynb@generic`, so the two
pytest-xdist workers share them like any file.

Where the machine's own kernels already are AVX2, the avx2 pass would repeat the main run: it is
dropped, and the main run's chapters start their kernels with the avx2 settings instead (the
same kernels, the same threads), so that every chapter still runs under both.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from nbval.plugin import IPyNbFile

ROOT = Path(__file__).resolve().parent.parent
PASSES = {
    "generic": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "2"},
}
TESTS_UNDER_EVERY_KERNEL = ["tests/test_heads.py"]


def native_capability():
    """What PyTorch's kernels use on this CPU: 'AVX512', 'AVX2', 'DEFAULT', ... (import deferred)."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def passes_asked():
    """The passes $MHA_KERNEL_PASSES names ('all', or a comma-separated list; unset: none)."""
    asked = os.environ.get("MHA_KERNEL_PASSES", "").strip()
    names = list(PASSES) if asked == "all" else [n.strip() for n in asked.split(",") if n.strip()]
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise pytest.UsageError(f"MHA_KERNEL_PASSES: unknown pass {unknown}; expected 'all' or some of {list(PASSES)}")
    return names


def passes_to_run():
    """The asked passes that differ from the machine's own kernels, and the environment of the main run's kernels."""
    names = passes_asked()
    if "avx2" in names and native_capability() == "AVX2":
        return [n for n in names if n != "avx2"], PASSES["avx2"]
    return names, {}


class NotebookUnderKernels(IPyNbFile):
    """A chapter whose Jupyter kernel starts with `kernel_env` added to the environment."""

    kernel_env = {}

    def setup(self):
        saved = {name: os.environ.get(name) for name in self.kernel_env}
        os.environ.update(self.kernel_env)  # the kernel's process copies the environment as it starts
        try:
            super().setup()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class TestsUnderKernels(pytest.Item):
    """A test file run again in a fresh interpreter whose PyTorch starts under another pass's kernels."""

    def __init__(self, *, test_file, pass_name, **kwargs):
        super().__init__(**kwargs)
        self.test_file, self.pass_name = test_file, pass_name

    def runtest(self):
        env = {**os.environ, **PASSES[self.pass_name], "MHA_KERNEL_PASSES": "", "MHA_TIMES": ""}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", self.test_file]
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        if run.returncode != 0:
            raise AssertionError(f"{self.test_file} under the {self.pass_name} kernels "
                                 f"({PASSES[self.pass_name]}) failed:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}")

    def reportinfo(self):
        return self.path, None, f"{self.test_file} under the {self.pass_name} kernels"


def notebook_files(items):
    """The nbval notebook collectors among the items, each once, in order."""
    seen = {}
    for item in items:
        if isinstance(item.parent, IPyNbFile):
            seen.setdefault(item.parent.nodeid, item.parent)
    return list(seen.values())


def add_kernel_passes(session, items):
    """The items of every asked pass: each chapter's cells under its kernels, and each test file in
    TESTS_UNDER_EVERY_KERNEL run whole (when the session collected it). The main run's chapters
    get the avx2 settings where the machine's own kernels are AVX2 (see the module's docstring)."""
    names, main_env = passes_to_run()
    notebooks = notebook_files(items)
    if main_env:
        for notebook in notebooks:  # the main run's own copies: their kernels start with main_env
            notebook.__class__, notebook.kernel_env = NotebookUnderKernels, main_env
    added = []
    for name in names:
        for notebook in notebooks:
            copy = NotebookUnderKernels.from_parent(notebook.parent, path=notebook.path,
                                                    name=f"{notebook.name}@{name}", nodeid=f"{notebook.nodeid}@{name}")
            copy.kernel_env = PASSES[name]
            added.extend(copy.collect())
        collected = {item.nodeid.split("::", 1)[0] for item in items}
        for test_file in TESTS_UNDER_EVERY_KERNEL:
            if test_file in collected:
                added.append(TestsUnderKernels.from_parent(session, name=f"{test_file}@{name}", nodeid=f"{test_file}@{name}",
                                                           test_file=test_file, pass_name=name))
    return added
