"""A seccomp filter for the worker: the system calls that could undo the sandbox return EPERM.

    install()        # in the worker, before any of the student's code runs: True if a filter is on

Refused: mounting and unmounting (mount, umount2, the new mount API, pivot_root), entering
or making namespaces (unshare, setns, and clone with a namespace flag; clone3 answers ENOSYS,
so that the C library falls back on clone, whose flags a filter can read), ptrace and the
other ways into another process's memory, and loading kernel code. A system call of another
architecture (a 32-bit call on a 64-bit machine, x32) is refused whole.

The program is classic BPF, written here by hand (the kernel's `struct sock_filter`), so that
the worker needs nothing but Python's ctypes; it knows x86-64 and aarch64, and on any other
machine `install()` returns False and the grader's report says so. This file is copied into
the worker's sandbox and imports nothing of the grader.
"""

import errno
import os
import platform
import struct

# Each architecture's audit number and its system call numbers (linux/audit.h, asm/unistd.h).
ARCHITECTURES = {
    "x86_64": (0xC000003E, {
        "mount": 165, "umount2": 166, "pivot_root": 155, "ptrace": 101, "unshare": 272, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "bpf": 321, "userfaultfd": 323,
        "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249, "chroot": 161,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "pidfd_getfd": 438}, {"clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {
        "mount": 40, "umount2": 39, "pivot_root": 41, "ptrace": 117, "unshare": 97, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "bpf": 280, "userfaultfd": 282,
        "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218, "chroot": 51,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "pidfd_getfd": 438}, {"clone": 220, "clone3": 435}),
}
X32_BIT = 0x40000000  # x86-64's x32 system calls: numbers with this bit set
# clone's flags that make a namespace: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

LOAD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low 32 bits on little-endian machines)


def program(machine=None):
    """The filter as a list of (code, jump if true, jump if false, k); None for an unknown machine."""
    known = ARCHITECTURES.get(machine or platform.machine())
    if known is None:
        return None
    audit, refused, clones = known
    refused = sorted(refused.values())
    deny, enosys = ("ret", ERRNO | errno.EPERM), ("ret", ERRNO | errno.ENOSYS)
    steps = [(LOAD, ARCH), (JEQ, audit, None, "deny"), (LOAD, NR)]
    if machine in (None, "x86_64") and audit == ARCHITECTURES["x86_64"][0]:
        steps.append((JGE, X32_BIT, "deny", None))
    steps += [(JEQ, number, "deny", None) for number in refused]
    steps += [(JEQ, clones["clone3"], "enosys", None), (JEQ, clones["clone"], None, "allow"),
              (LOAD, ARG0), (JSET, NAMESPACE_FLAGS, "deny", "allow")]
    labels = {"allow": ("ret", ALLOW), "deny": deny, "enosys": enosys}
    return assemble(steps, labels)


def assemble(steps, labels):
    """Resolve the named jumps: each label becomes a return at the end of the program."""
    order = list(labels)
    end = len(steps)
    where = {name: end + i for i, name in enumerate(order)}
    code = []
    for i, step in enumerate(steps):
        if step[0] == LOAD:
            code.append((LOAD, 0, 0, step[1]))
            continue
        op, k, yes, no = step
        jump = lambda target: 0 if target is None else where[target] - i - 1  # noqa: E731
        code.append((op, jump(yes), jump(no), k))
    code += [(RET, 0, 0, labels[name][1]) for name in order]
    return code


def as_bytes(instructions):
    """The program as the kernel reads it: struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}."""
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)


def install():
    """Load the filter into this process (and all it starts); True on success. Needs ctypes."""
    instructions = program()
    if instructions is None:
        return False
    try:
        import ctypes
    except ImportError:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    raw = as_bytes(instructions)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(instructions), ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return True
