"""The grader's walls, tried as a hostile student would, with the grader run as root (as in CI and
on Gradescope) or as a user: the student's code, in a worker, tries to leave its sandbox, to read
the grader's secret and the other submissions, to write outside its folder, to reach the grader's
pipes and to flood them, and to use more than its share of memory, disk and processes. Every
step must fail, and a reply that is too long or too deep must cost its notebook only, never the
grader's memory. (tests/test_grading_attacks.py grades whole notebooks.)
"""

import json
import os
import subprocess
import sys
import tracemalloc

import pytest

from conftest import ROOT

from tools.grading import resources, sandbox

SECRET = "walls-secret-8d1f0c"
needs_bubblewrap = pytest.mark.skipif(sandbox.ISOLATION != "bubblewrap", reason="bubblewrap does not work here")

# The student's code: every step it tries, each recorded as "ok" or the error that stopped it.
ESCAPE = r'''
import ctypes, glob, json, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND, CLONE_NEWUSER, CLONE_NEWNS, MNT_DETACH = 32, 4096, 0x10000000, 0x20000, 2

def attempt(step):
    try:
        result = step()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    if isinstance(result, int) and result < 0:
        return f"errno {ctypes.get_errno()}: {os.strerror(ctypes.get_errno())}"
    return "ok"

def write(path):
    with open(path, "w") as out:
        out.write("escaped")

def found_secret():
    for path in glob.glob("/proc/*/cmdline") + glob.glob("/proc/*/environ"):
        try:
            if SECRET.encode() in open(path, "rb").read():
                return path
        except OSError:
            pass
    raise LookupError("no secret in any /proc/*/cmdline or environ")

steps = {}
for folder in COVERED + ["/proc", "/tmp", "/"]:
    steps["umount " + folder] = attempt(lambda: libc.umount2(folder.encode(), MNT_DETACH))
steps["remount / read-write"] = attempt(lambda: libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None))
steps["mount a tmpfs"] = attempt(lambda: libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))
steps["unshare a user namespace"] = attempt(lambda: libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
steps["ptrace the relay"] = attempt(lambda: libc.ptrace(16, os.getppid(), 0, 0))
steps["read the secret"] = attempt(found_secret)
steps["read the library"] = attempt(lambda: open(LIBRARY).read())
steps["read another notebook"] = attempt(lambda: open(OTHER).read())
steps["write outside"] = attempt(lambda: write("/etc/mha-escaped"))
steps["write in the project"] = attempt(lambda: write(PROJECT + "/escaped"))
steps["write in the worker's folder"] = attempt(lambda: write("/tmp/sandbox/escaped"))
steps["write in /dev/shm"] = attempt(lambda: write("/dev/shm/escaped"))
steps["the relay's pipes by /proc"] = attempt(lambda: os.listdir(f"/proc/{os.getppid()}/fd"))
steps["the relay's memory"] = attempt(lambda: open(f"/proc/{os.getppid()}/mem", "rb"))
descriptors = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in map(int, os.listdir("/proc/self/fd"))
               if os.path.exists(f"/proc/self/fd/{fd}")}
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
who = {"uid": int(status["Uid"].split()[0]), "CapEff": int(status["CapEff"], 16), "CapBnd": int(status["CapBnd"], 16),
       "Seccomp": int(status["Seccomp"])}

def report():
    return json.dumps({"steps": steps, "who": who, "descriptors": descriptors})
'''


@pytest.fixture(scope="module")
def escape(tmp_path_factory):
    """A worker that ran the escape, beside a process that holds the secret in its command line and
    environment (as grade.py --secret would); (what each step gave, who the student's code was)."""
    base = tmp_path_factory.mktemp("walls")
    other = base / "class" / "other_student.ipynb"
    other.parent.mkdir()
    other.write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--secret", SECRET],
                              env={**os.environ, "MHA_GRADING_SECRET": SECRET})
    worker = sandbox.Worker(base / "w", ("softmax",), (), sandbox.Limits(), covered=[ROOT, other.parent])
    try:
        values = {"COVERED": [str(ROOT), str(other.parent)], "LIBRARY": str(ROOT / "src/mha/numpy/__init__.py"),
                  "OTHER": str(other), "PROJECT": str(ROOT), "SECRET": SECRET}
        preamble = "".join(f"{name} = {value!r}\n" for name, value in values.items())
        errors = worker.run([preamble + ESCAPE], 60)
        assert not errors, errors
        reply, _ = worker.call("report", (), {}, 30)
        assert reply["status"] == "returned", reply
        from tools.grading import wire
        said = json.loads(wire.untag(reply["result"]))
        grader_pipes = {f"pipe:[{os.fstat(fd).st_ino}]" for fd in (worker.requests, worker.replies)}
        return (said["steps"], said["who"] | {"descriptors": said["descriptors"], "grader": grader_pipes}), worker.hello
    finally:
        worker.close()
        holder.kill()
        holder.wait()


@needs_bubblewrap
def test_the_students_code_has_no_capability_and_is_not_root(escape):
    (_, who), hello = escape
    assert who["CapEff"] == 0 and who["CapBnd"] == 0, who
    assert who["Seccomp"] == 2, "the seccomp filter is on"
    assert who["uid"] != 0 if os.geteuid() == 0 else True
    assert hello["cap_eff"] == hello["cap_prm"] == hello["cap_amb"] == 0 and hello["seccomp"] == 2


STEPS = ["umount " + str(ROOT), "umount /proc", "umount /tmp", "umount /", "remount / read-write", "mount a tmpfs",
         "unshare a user namespace", "ptrace the relay", "read the secret", "read the library",
         "read another notebook", "write outside", "write in the project", "write in the worker's folder",
         "write in /dev/shm", "the relay's pipes by /proc", "the relay's memory"]


@needs_bubblewrap
@pytest.mark.parametrize("step", STEPS)
def test_every_step_of_the_escape_fails(escape, step):
    (steps, _), _ = escape
    assert steps[step] != "ok", f"{step} succeeded"


@needs_bubblewrap
def test_the_grader_pipes_are_not_the_students(escape):
    """The runner closed the grader's descriptors before any of the student's code ran: none of its
    descriptors is either of the grader's pipes (it has its own pipes to the relay)."""
    (_, who), _ = escape
    held = set(who["descriptors"].values())
    assert len(who["grader"]) == 2 and not held & who["grader"], (held, who["grader"])
    assert sum(link.startswith("pipe:") for link in held) == 2, held


def test_a_root_worker_or_one_with_a_capability_is_refused(monkeypatch):
    """The grader sends no case before it has read who the worker is."""
    honest = {"op": "hello", "uid": 10**9 + 1, "euid": 10**9 + 1, "saved_uid": 10**9 + 1, "fs_uid": 10**9 + 1,
              "cap_eff": 0, "cap_prm": 0, "cap_amb": 0, "cap_bnd": 0, "seccomp": 2}
    assert sandbox.problems_with(honest) == []
    assert "capabilities" in " ".join(sandbox.problems_with(honest | {"cap_eff": 0x1FFFEFFFFFF}))
    assert "seccomp" in " ".join(sandbox.problems_with(honest | {"seccomp": 0}))
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    assert "root" in " ".join(sandbox.problems_with(honest | {"uid": 0, "euid": 0}))
    assert sandbox.problems_with({"status": "returned"}) == ["it did not say who it is"]


def run_and_call(limits, cells, function, seconds=30, **call):
    worker = sandbox.Worker(limits_folder(), (), (), limits, covered=[ROOT])
    try:
        errors = worker.run(cells, seconds)
        return errors, worker.call(function, (), {}, seconds, **call), worker
    finally:
        worker.close()


def limits_folder():
    import tempfile
    from pathlib import Path
    return Path(tempfile.mkdtemp(prefix="mha-walls-")) / "w"


@pytest.mark.parametrize("answer", ["np.zeros(2**22)", "nested(40)"])
def test_a_reply_too_long_or_too_deep_is_refused_before_it_is_read(answer):
    """Refused by size (32 MiB against a 1 MiB limit) or by depth (40 against 32), with the grader's
    own memory untouched: the body of a too long reply is never read."""
    cells = ["import numpy as np\ndef nested(n):\n    return [nested(n - 1)] if n else [1.0]\n"
             f"def answer():\n    return {answer}\n"]
    tracemalloc.start()
    try:
        with pytest.raises(sandbox.LimitReached, match="refused"):
            run_and_call(sandbox.Limits(), cells, "answer", reply_limit=2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"the grader took {peak / 2**20:.1f} MiB for a refused reply"


@needs_bubblewrap
def test_a_fork_loop_stops_at_the_process_limit():
    cells = ["import subprocess\nstarted = []\ndef fork_loop():\n    try:\n        for _ in range(100):\n"
             "            started.append(subprocess.Popen(['sleep', '30']))\n    except OSError as error:\n"
             "        return len(started), str(error)\n    return len(started), 'no limit'\n"]
    _, (reply, _), _ = run_and_call(sandbox.Limits(processes=8), cells, "fork_loop")
    from tools.grading import wire
    count, error = wire.untag(reply["result"])
    assert count < 8 and "Resource temporarily unavailable" in error, (count, error)


@needs_bubblewrap
def test_tmp_and_every_file_are_bounded_and_the_worker_folder_is_read_only():
    """A tmpfs fill and a disk fill stop at the file-size limit (8 MiB here)."""
    cells = ["import os\ndef fill():\n    said = []\n    for path in ['/tmp/fill', 'fill_here', '/tmp/sandbox/fill']:\n"
             "        try:\n            with open(path, 'wb') as out:\n                for _ in range(64):\n"
             "                    out.write(b'x' * 2**20)\n                    out.flush()\n"
             "            said.append('wrote 64 MiB')\n        except OSError as error:\n"
             "            said.append(type(error).__name__ + ': ' + str(error))\n    return said\n"]
    _, (reply, _), _ = run_and_call(sandbox.Limits(file_bytes=8 * 2**20), cells, "fill")
    from tools.grading import wire
    said = wire.untag(reply["result"])
    assert not any(s == "wrote 64 MiB" for s in said), said
    assert "Read-only file system" in said[2], said


@needs_bubblewrap
def test_memory_is_measured_on_the_students_process_not_a_decoy_child():
    """A child started first (a sleeping decoy) must not move the measurement away from the runner."""
    cells = ["import subprocess, numpy as np\ndecoy = subprocess.Popen(['sleep', '60'])\n"
             "def big():\n    a = np.ones(2**25)\n    return float(a.sum())\n"]
    _, (reply, peak), _ = run_and_call(sandbox.Limits(), cells, "big", measure_memory=True)
    assert reply["status"] == "returned" and peak >= 2**28 * 0.9, peak


def memory_cgroup_here():
    group = resources.MemoryGroup.create(2**30, 8)
    if group is not None:
        group.remove()
    return group is not None


@pytest.mark.skipif(not memory_cgroup_here(), reason="no memory cgroup on this machine")
@needs_bubblewrap
def test_children_share_one_memory_limit_where_there_is_a_cgroup():
    """Three children of 400 MiB each cannot live together under 1 GiB, though each is under it."""
    cells = ["import subprocess, sys\ndef children():\n    code = 'import numpy as np, time; a = np.ones(50 * 2**20); "
             "time.sleep(5)'\n    kids = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(3)]\n"
             "    return [kid.wait() for kid in kids]\n"]
    from tools.grading import wire
    try:
        _, (reply, _), _ = run_and_call(sandbox.Limits(memory_bytes=2**30), cells, "children")
    except sandbox.LimitReached as limit:  # the kernel chose the runner itself
        assert "killed" in str(limit) or "ended" in str(limit), limit
        return
    codes = wire.untag(reply["result"])
    assert any(code == -9 for code in codes), codes
