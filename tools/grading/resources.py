"""What a worker may use, and what it used: users, limits, memory cgroups, the process tree.

    user = worker_user()                 # as root: a fresh uid and gid of no one; else None
    group = MemoryGroup.create(limits)   # a memory (and pids) cgroup where the machine offers one, else None
    preexec = limiter(limits, group, user)   # given to subprocess: the limits set in the child before exec
    tree(pid), runner_pid(root, ns_pid), peak_bytes(pids)

Limits of a worker (sandbox.Limits): its memory (RLIMIT_DATA of each process, and in a memory
cgroup all its processes and what they write to a tmpfs together), the size of a file it
writes (RLIMIT_FSIZE), and its number of processes (RLIMIT_NPROC, set by the worker itself
once it runs as its own user: as root, a uid that nothing else on the machine uses).
"""

import os
import resource
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

FIRST_UID = 1_000_000_000  # far above any account's uid; a worker takes one at random above it
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class User:
    uid: int
    gid: int


def worker_user():
    """As root, a uid and gid that no process or file of this machine has (drawn at random); None otherwise."""
    if os.geteuid() != 0:
        return None
    uid = FIRST_UID + secrets.randbelow(2**29)
    return User(uid, uid)


def own_cgroup(controller):
    """The folder of this process's cgroup for `controller` (v1), or of its unified cgroup (v2); None if none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            folder = CGROUP_ROOT / controller / path.lstrip("/")
            return folder if folder.is_dir() else None
    unified = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if unified is not None:
        folder = CGROUP_ROOT / unified.lstrip("/")
        controllers = (folder / "cgroup.subtree_control")
        if controllers.exists() and controller in controllers.read_text().split():
            return folder
    return None


class MemoryGroup:
    """A cgroup of one worker: its memory (processes and tmpfs together) and its number of processes."""

    def __init__(self, memory, pids):
        self.memory, self.pids = memory, pids
        self.v1 = (memory / "memory.limit_in_bytes").exists()

    @classmethod
    def create(cls, memory_bytes, processes):
        """A new cgroup under this process's own, limited; None where the machine offers none (not root,
        no memory controller, or a cgroup that cannot be written)."""
        parent = own_cgroup("memory")
        if parent is None or os.geteuid() != 0:
            return None
        name = f"mha-worker-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            memory = parent / name
            memory.mkdir()
            group = cls(memory, None)
            group.write("memory.limit_in_bytes" if group.v1 else "memory.max", memory_bytes)
            if (memory / "memory.swappiness").exists():
                group.write("memory.swappiness", 0)
            if (memory / "memory.swap.max").exists():
                group.write("memory.swap.max", 0)
            pids_parent = own_cgroup("pids")
            if pids_parent is not None:
                group.pids = memory if pids_parent == parent else pids_parent / name  # v2: one folder for both
                group.pids.mkdir(exist_ok=True)
                (group.pids / "pids.max").write_text(str(processes))
        except OSError:
            cls(parent / name, None).remove()
            return None
        return group

    def write(self, name, value):
        (self.memory / name).write_text(str(value))

    def join(self):
        """Put the calling process in the group (in the child, before exec)."""
        for folder in {self.memory, self.pids} - {None}:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self):
        return int((self.memory / ("memory.usage_in_bytes" if self.v1 else "memory.current")).read_text())

    def reset_peak(self):
        """Start the peak again from the usage now (v1; on v2 the peak cannot be reset: None)."""
        if self.v1:
            self.write("memory.max_usage_in_bytes", 0)
            return True
        return False

    def peak(self):
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        path = self.memory / name
        return int(path.read_text()) if path.exists() else None

    def remove(self):
        """Kill what is left in the group, then remove it."""
        for folder in (self.memory, self.pids):
            if folder is None or not folder.exists():
                continue
            for _ in range(50):
                pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)


def limiter(memory_bytes, file_bytes, group=None, drop_to=None):
    """The function that subprocess runs in the child before exec: join the cgroup, set the limits,
    and (as root, without bubblewrap) become the worker's user."""
    def limit():
        if group is not None:
            group.join()
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop_to is not None:
            os.setgroups([])
            os.setresgid(drop_to.gid, drop_to.gid, drop_to.gid)
            os.setresuid(drop_to.uid, drop_to.uid, drop_to.uid)
    return limit


def children(pid):
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def tree(pid):
    """`pid` and every process below it (Linux's /proc)."""
    return [pid] + [p for child in children(pid) for p in tree(child)]


def status(pid):
    """/proc/<pid>/status as a dict of strings ({} once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def runner_pid(root, ns_pid):
    """The host's pid of the process below `root` whose pid in its own namespace is `ns_pid`."""
    for pid in tree(root):
        spaces = status(pid).get("NSpid", str(pid)).split()
        if spaces and int(spaces[-1]) == ns_pid and pid != root:
            return pid
    return ns_pid if ns_pid in tree(root) else None


def memory_bytes(pid, field):
    value = status(pid).get(field)
    return int(value.split()[0]) * 1024 if value else 0


def restart_peaks(pids):
    """VmHWM of each process starts again from its VmRSS; their VmRSS in all."""
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            pass
    return sum(memory_bytes(pid, "VmRSS") for pid in pids)


def peak_bytes(pids):
    """The sum of the peaks (VmHWM) of `pids`, the processes alive now."""
    return sum(memory_bytes(pid, "VmHWM") for pid in pids)


def kill_user(uid):
    """SIGKILL every process of `uid` (a worker's own user, as root: what escaped its process group)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and status(entry.name).get("Uid", "").split()[:1] == [str(uid)]:
            try:
                os.kill(int(entry.name), 9)
            except ProcessLookupError:
                pass
