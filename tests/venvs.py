"""Virtual environments for the environment tests, installed once and copied fresh for every run.

`cached_venv(name, inputs, install)` is the folder `.cache/venvs/<name>-<hash>/` (git-ignored),
the hash taken over `inputs` (what determines the install: the requirement lines, pip's flags,
any other input the caller names) and the Python that makes it (its version and executable).
It is built when missing: `python -m venv` into a temporary sibling, `install(python)` there,
then a rename, so that an interrupted build never leaves a half venv; a lock keeps two
processes from building it at once. A changed pin gives another hash, hence a new venv, and the
venvs of that name built for other inputs are deleted then.

`fresh_copy(venv, target)` copies it for one run (tests/test_colab.py, tests/test_nbgrader.py):
what a test installs or changes there never reaches the cache. A venv's scripts (`bin/pip`,
`bin/alembic`, which nbgrader runs by name) name its interpreter by its path in their first
lines: those lines are pointed at the venv's own folder after the rename and in every copy.
"""

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "venvs"


def venv_hash(inputs):
    """16 hex digits over the inputs and the Python that makes the venv."""
    python = {"version": sys.version, "machine": platform.machine(),
              "base": os.path.realpath(getattr(sys, "_base_executable", sys.executable))}
    text = json.dumps({"inputs": list(inputs), "python": python}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_venv(name, inputs, install):
    """The cached venv `name` for these inputs, built first when missing.

    `install(python)` installs into a fresh venv whose interpreter is `python`; it raises (or
    calls pytest.skip) to refuse it, and then nothing is cached."""
    CACHE.mkdir(parents=True, exist_ok=True)
    venv = CACHE / f"{name}-{venv_hash(inputs)}"
    if (venv / "pyvenv.cfg").exists():
        return venv
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if venv.exists():
            return venv  # built by another process while this one waited
        for stale in CACHE.glob(f"{venv.name}.building-*"):  # left by an interrupted build
            shutil.rmtree(stale, ignore_errors=True)
        building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.building-", dir=CACHE))
        try:
            subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
            install(building / "bin" / "python")
            point_scripts(building, venv)
            building.rename(venv)
        finally:
            shutil.rmtree(building, ignore_errors=True)  # gone already when renamed
    for older in CACHE.iterdir():  # the same venv for pins of the past
        if older != venv and re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}", older.name):
            shutil.rmtree(older, ignore_errors=True)
            older.with_name(older.name + ".lock").unlink(missing_ok=True)
    return venv


def fresh_copy(venv, target):
    """A copy of the venv at `target` (its links to the base interpreter kept as links), its scripts run by
    the copy's interpreter; `target`."""
    shutil.copytree(venv, target, symlinks=True)
    point_scripts(target, target, venv)
    return Path(target)


def point_scripts(venv, to, was=None):
    """In the scripts of `venv`'s bin/, the venv's path `was` (default: `venv`) becomes `to` in the lines
    that name the interpreter (pip writes the first, or the second after a `#!/bin/sh` for a long path)."""
    was = str(Path(was or venv).resolve()).encode()
    for script in (Path(venv) / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        text = script.read_bytes()
        if not text.startswith(b"#!"):
            continue
        lines = text.split(b"\n", 2)
        lines[:2] = [line.replace(was, str(to).encode()) for line in lines[:2]]
        if b"\n".join(lines) != text:
            script.write_bytes(b"\n".join(lines))


def purelib(python):
    """The site-packages folder of a venv's interpreter."""
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
