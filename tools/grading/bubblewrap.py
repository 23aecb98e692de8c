"""bubblewrap's command line for a worker (grading/sandbox.py says what the sandbox is for).

    bubblewrap_works()                                   # can it make a worker's sandbox here?
    bubblewrap_command(folder, hidden, covered, limits)  # the arguments before the worker's command

Everything is read-only but the worker's own /tmp (bounded in size where bwrap can bound a tmpfs);
the covered folders and the hidden packages are empty and read-only; Python's own folders are bound
again where a covered folder holds them, or where (as root) a folder above them is closed to other
users and is replaced by an empty one; the worker's folder appears read-only at SANDBOX.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

BWRAP = shutil.which("bwrap")
SANDBOX = Path("/tmp/sandbox")  # where the worker's folder appears inside bubblewrap (read-only)


def bubblewrap_help():
    return subprocess.run([BWRAP, "--help"], capture_output=True, text=True).stdout if BWRAP else ""


def identity_options():
    """bwrap's options for who the worker is (see the module's docstring)."""
    if os.geteuid() == 0:
        return ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    return ["--unshare-user", "--cap-drop", "ALL"] + (["--disable-userns"] if "--disable-userns" in HELP else [])


def bubblewrap_works():
    """True when bubblewrap is installed and can make the worker's sandbox here (it needs namespaces)."""
    if BWRAP is None:
        return False
    probe = subprocess.run([BWRAP, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", *identity_options(),
                            "true"], capture_output=True)
    return probe.returncode == 0


def package_folders(names):
    """The folders (and single-file modules) of the installed packages `names`."""
    found = []
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for name in names:
            for candidate in (Path(site) / name, Path(site) / f"{name}.py"):
                if candidate.exists():
                    found.append(candidate)
    return found


def inside(path, folder):
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def closed_to_others(path):
    """The highest folder above `path` that a user of no group cannot pass through (mode without o+x), or None."""
    for folder in reversed(Path(path).resolve().parents):
        if folder != Path("/") and not folder.stat().st_mode & 0o001:
            return folder
    return None


def python_binds(covered):
    """Python's own folders, bound again where a covered folder (or /tmp) holds them, or where a folder
    above them is closed to the worker's user (as root: /root, say) and is replaced by an empty one."""
    folders = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["purelib"],
                                          sysconfig.get_paths()["platlib"], Path(sys.executable).parent)}
    options, emptied = [], set()
    for path in sorted(folders):
        closed = closed_to_others(path) if os.geteuid() == 0 else None
        if closed is not None and closed not in emptied and not any(inside(closed, c) for c in covered):
            emptied.add(closed)
            options += ["--tmpfs", str(closed)]
        if closed is not None:  # the folders between, made open to pass through (bwrap makes them 0700)
            between = [f for f in path.parents if f.is_relative_to(closed) and f != closed]
            options += [a for f in reversed(between) for a in ("--perms", "0755", "--dir", str(f))]
        if closed is not None or any(inside(path, c) for c in [*covered, "/tmp"]):
            options += ["--ro-bind", str(path), str(path)]
    return options


def bubblewrap_command(folder, hidden, covered, limits):
    """bwrap's arguments: a read-only system, `covered` folders emptied, `hidden` packages emptied,
    Python's own folders bound again if need be, a /tmp of its own and `folder` at SANDBOX."""
    command = [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc",
               "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session", *identity_options()]
    if "--size" in HELP:  # a /tmp in memory, of a bounded size
        command += ["--size", str(limits.file_bytes), "--tmpfs", "/tmp", "--chmod", "1777", "/tmp"]
    else:  # no bound on a tmpfs here: the worker's /tmp is on disk, each file bounded by RLIMIT_FSIZE
        command += ["--bind", str(folder / "tmp"), "/tmp"]
    emptied = [*covered, *(p for p in package_folders(hidden) if p.is_dir())]
    for path in covered:
        command += ["--tmpfs", str(path)]
    command += python_binds(covered)
    for path in package_folders(hidden):
        command += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    for path in emptied:  # last: the binds above needed their mount points made in these
        command += ["--remount-ro", str(path)]
    return command + ["--ro-bind", str(folder), str(SANDBOX), "--chdir", str(SANDBOX)]


HELP = bubblewrap_help()
