"""Peak memory of attention as T grows: the T x T form against the chunked one.

    python -m benchmarks.memory           # T = 1024 ... 16384, h = 8, d_head = 64
    python -m benchmarks.memory --tiny

Each measurement runs in a fresh Python process, which imports the library, makes
Q, K, V for one sequence (h heads, float32), runs one attention call and reports
its own peak resident memory as the operating system counts it (VmHWM in
/proc/self/status, the high-water mark of the resident set): the whole process,
interpreter and libraries included. (ru_maxrss is not used: on Linux a child
inherits its parent's maximum through fork and exec.) The "at start" column is the
same process just before the call. The T x T form is only run when it fits
comfortably (`budget_gib`); otherwise the row says how much it would need.

Forms measured:
  T x T (NumPy)       mha.numpy.scaled_dot_product_attention: scores, softmax, weights
  chunked (NumPy)     mha.numpy.chunked_attention: keys in blocks, online softmax
  fused kernel (torch) torch.nn.functional.scaled_dot_product_attention on (1, h, T, d_head)
                      (PyTorch's own memory-efficient CPU kernel, for comparison; with
                      3-D inputs it falls back to the T x T "math" form)
"""

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import Table, print_tables, run_tables

ROOT = Path(__file__).resolve().parent.parent
GIB = 2 ** 30
FULL = dict(Ts=(1024, 2048, 4096, 8192, 16384), h=8, d_head=64, chunk=256, budget_gib=8.0)
TINY = dict(Ts=(64, 128), h=2, d_head=8, chunk=32, budget_gib=1.0)
FORMS = {"full": "T x T (NumPy)", "chunked": "chunked (NumPy)", "torch": "fused kernel (torch)"}


def predicted_full_bytes(T, h):
    """The T x T form holds one (h, T, T) float32 array at its peak: the scores,
    which the softmax overwrites in place and which are returned as the weights."""
    return h * T * T * 4


def peak_resident_bytes():
    """The process's peak resident memory so far, from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib * 1024


def child(form, T, h, d_head, chunk):
    """Runs in the fresh process: one attention call, then print a JSON line."""
    import numpy as np

    rng = np.random.default_rng(T)
    Q, K, V = (rng.standard_normal((h, T, d_head), dtype=np.float32) for _ in range(3))
    if form == "torch":
        import torch
        import torch.nn.functional as F

        q, k, v = (torch.from_numpy(a)[None] for a in (Q, K, V))  # (1, h, T, d_head): 4-D takes the fused kernel

        def attend():
            return F.scaled_dot_product_attention(q, k, v)[0].numpy()
    else:
        import mha.numpy as mnp

        def attend():
            if form == "chunked":
                return mnp.chunked_attention(Q, K, V, chunk=chunk)
            return mnp.scaled_dot_product_attention(Q, K, V)[0]
    start = peak_resident_bytes()
    t0 = time.perf_counter()
    out = attend()
    seconds = time.perf_counter() - t0
    print(json.dumps({"start": start, "peak": peak_resident_bytes(), "seconds": seconds,
                      "checksum": float(np.abs(out).sum())}))


def measure(form, T, size):
    """Run `child` in a fresh interpreter; memory capped a little above the budget."""
    cap = int((size["budget_gib"] + 3) * GIB)
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}));"
            f"from benchmarks.memory import child; child({form!r}, {T}, {size['h']}, "
            f"{size['d_head']}, {size['chunk']})")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def gib(n_bytes):
    return round(n_bytes / GIB, 3)


def memory_table(size):
    table = Table("memory", "Peak memory of one attention call, whole process (VmHWM)",
                  ["T", "form", "peak (GiB)", "at start (GiB)", "seconds", "note"],
                  settings={"h": size["h"], "d_head": size["d_head"], "chunk": size["chunk"],
                            "dtype": "float32", "batch": 1},
                  notes="one process per row; the T x T form is skipped when it would need more "
                        f"than {size['budget_gib']} GiB")
    for T in size["Ts"]:
        for form, label in FORMS.items():
            need = predicted_full_bytes(T, size["h"])
            if form == "full" and need > size["budget_gib"] * GIB:
                table.add(**{"T": T, "form": label, "peak (GiB)": "", "at start (GiB)": "", "seconds": "",
                             "note": f"not run: would need about {gib(need):.0f} GiB"})
                continue
            r = measure(form, T, size)
            if r is None:
                table.add(**{"T": T, "form": label, "peak (GiB)": "", "at start (GiB)": "", "seconds": "",
                             "note": "failed (out of memory?)"})
                continue
            table.add(**{"T": T, "form": label, "peak (GiB)": gib(r["peak"]),
                         "at start (GiB)": gib(r["start"]), "seconds": round(r["seconds"], 3), "note": ""})
    return table


def run(tiny=False, only=None):
    return run_tables({"memory": memory_table}, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
