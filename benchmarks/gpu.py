"""The GPU benchmark: same comparisons as on the CPU, plus bf16/fp16 and long sequences.

    python -m benchmarks.gpu              # on a machine with a CUDA GPU
    python -m benchmarks.gpu --save DIR   # also write the tables as CSV and JSON

Without a GPU it says so and exits with status 0. On a GPU it prints:
  gpu_mha        mha.torch.MultiHeadAttention vs nn.MultiheadAttention (B=8, T=512,
                 d=512, h=8) in float32, bfloat16 and float16: forward without
                 weights, with per-head weights, forward+backward
  gpu_encoder    mha.torch.EncoderBlock vs nn.TransformerEncoderLayer, same dtypes
  gpu_attention  one sequence, h=8, d_head=64, T up to 32768: PyTorch's fused
                 kernels (F.scaled_dot_product_attention), the explicit form
                 (mha.torch.scaled_dot_product_attention) and mha.torch.chunked_attention,
                 with time and peak GPU memory (torch.cuda.max_memory_allocated)
  gpu_gqa        mha.torch.GroupedQueryAttention vs the same layer written on
                 F.scaled_dot_product_attention(enable_gqa=True) (benchmarks.generation's
                 baseline), B=8, T=1024 and 4096, d=1024, h=16, h_kv 16/4/1, with and
                 without RoPE, causal or not, in float32, bfloat16 and float16
On a GPU absolute times mean something (the device is not shared with the
interpreter), so the tables give milliseconds as well as ratios. The same code
runs on the CPU at tiny sizes in the tests (`run("cpu", tiny=True)`).
"""

import sys

import torch
from torch import nn

import mha.torch as mt
from benchmarks import generation
from benchmarks.harness import Table, compare, machine, ms

FULL = dict(B=8, T=512, d=512, h=8, d_ff=2048, Ts=(1024, 2048, 4096, 8192, 16384, 32768), h_long=8, d_head=64,
            rounds=21, warmup=5, dtypes=("float32", "bfloat16", "float16"),
            gqa_B=8, gqa_Ts=(1024, 4096), gqa_d=1024, gqa_h=16, gqa_kv=(16, 4, 1))
TINY = dict(B=2, T=8, d=16, h=2, d_ff=32, Ts=(16, 32), h_long=2, d_head=8, rounds=2, warmup=1,
            dtypes=("float32", "bfloat16"), gqa_B=2, gqa_Ts=(8,), gqa_d=16, gqa_h=4, gqa_kv=(4, 1))


def synchronised(device, fn):
    """fn, then wait for the device: GPU kernels run asynchronously."""
    if device.type != "cuda":
        return fn
    return lambda: (fn(), torch.cuda.synchronize(device))


def row(table, what, dtype, r, ours="ours", theirs="theirs"):
    table.add(**{"comparison": what, "dtype": dtype, "ours (ms)": ms(r[ours][0]),
                 "PyTorch (ms)": ms(r[theirs][0]), "ratio": round(r[ours][1], 3)})


def mha_table(device, size):
    table = Table("gpu_mha", f"mha.torch.MultiHeadAttention vs nn.MultiheadAttention on {device}",
                  ["comparison", "dtype", "ours (ms)", "PyTorch (ms)", "ratio"],
                  settings={k: size[k] for k in ("B", "T", "d", "h", "rounds")})
    for name in size["dtypes"]:
        dtype = getattr(torch, name)
        torch.manual_seed(0)
        theirs = nn.MultiheadAttention(size["d"], size["h"], batch_first=True, device=device, dtype=dtype)
        ours = mt.MultiHeadAttention.from_torch(theirs)
        x = torch.randn(size["B"], size["T"], size["d"], device=device, dtype=dtype)
        run = dict(rounds=size["rounds"], warmup=size["warmup"])
        theirs.eval(), ours.eval()
        with torch.no_grad():
            cases = [("forward, no weights", lambda: ours(x), lambda: theirs(x, x, x, need_weights=False)),
                     ("forward, per-head weights", lambda: ours(x, return_weights=True),
                      lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False))]
            for what, a, b in cases:
                r = compare({"ours": synchronised(device, a), "theirs": synchronised(device, b)}, "theirs", **run)
                row(table, what, name, r)
        theirs.train(), ours.train()
        xg = x.clone().requires_grad_()
        r = compare({"ours": synchronised(device, lambda: ours(xg).float().sum().backward()),
                     "theirs": synchronised(device, lambda: theirs(xg, xg, xg, need_weights=False)[0]
                                            .float().sum().backward())}, "theirs", **run)
        row(table, "forward + backward", name, r)
    return table


def encoder_table(device, size):
    table = Table("gpu_encoder", f"mha.torch.EncoderBlock vs nn.TransformerEncoderLayer on {device}",
                  ["comparison", "dtype", "ours (ms)", "PyTorch (ms)", "ratio"],
                  settings={k: size[k] for k in ("B", "T", "d", "h", "d_ff", "rounds")})
    for name in size["dtypes"]:
        dtype = getattr(torch, name)
        torch.manual_seed(0)
        theirs = nn.TransformerEncoderLayer(size["d"], size["h"], size["d_ff"], dropout=0.0, batch_first=True,
                                            device=device, dtype=dtype)
        ours = mt.EncoderBlock.from_torch(theirs)
        x = torch.randn(size["B"], size["T"], size["d"], device=device, dtype=dtype)
        run = dict(rounds=size["rounds"], warmup=size["warmup"])
        theirs.eval(), ours.eval()
        with torch.no_grad():
            r = compare({"ours": synchronised(device, lambda: ours(x)),
                         "theirs": synchronised(device, lambda: theirs(x))}, "theirs", **run)
        row(table, "forward", name, r)
        theirs.train(), ours.train()
        xg = x.clone().requires_grad_()
        r = compare({"ours": synchronised(device, lambda: ours(xg).float().sum().backward()),
                     "theirs": synchronised(device, lambda: theirs(xg).float().sum().backward())},
                    "theirs", **run)
        row(table, "forward + backward", name, r)
    return table


def attention_forms(q, k, v):
    import torch.nn.functional as F
    return {"fused kernel": lambda: F.scaled_dot_product_attention(q, k, v),
            "explicit": lambda: mt.scaled_dot_product_attention(q, k, v)[0],
            "chunked": lambda: mt.chunked_attention(q, k, v, chunk=1024)}


def timed_with_memory(device, fn, size):
    """(median seconds, peak bytes) of fn alone, or None when it runs out of memory."""
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        r = compare({"fn": synchronised(device, fn)}, "fn", rounds=max(3, size["rounds"] // 4), warmup=1)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        return r["fn"][0], peak
    except torch.OutOfMemoryError:
        return None


def attention_table(device, size):
    table = Table("gpu_attention", f"Attention alone on {device}: fused kernel, explicit, chunked",
                  ["T", "dtype", "form", "ms", "peak memory (GiB)"],
                  settings={"batch": 1, "h": size["h_long"], "d_head": size["d_head"]})
    for name in size["dtypes"]:
        dtype = getattr(torch, name)
        for T in size["Ts"]:
            torch.manual_seed(T)
            q, k, v = (torch.randn(1, size["h_long"], T, size["d_head"], device=device, dtype=dtype)
                       for _ in range(3))
            with torch.no_grad():
                for form, fn in attention_forms(q, k, v).items():
                    result = timed_with_memory(device, fn, size)
                    seconds, peak = result if result else (None, None)
                    table.add(**{"T": T, "dtype": name, "form": form,
                                 "ms": "out of memory" if result is None else ms(seconds),
                                 "peak memory (GiB)": "" if peak is None else round(peak / 2 ** 30, 3)})
    return table


def gqa_table(device, size):
    table = Table("gpu_gqa", f"{generation.GQA_TITLE} on {device}", ["dtype", *generation.GQA_COLUMNS],
                  settings={**generation.gqa_settings(size), "dtypes": ", ".join(size["dtypes"])},
                  notes=generation.GQA_NOTES)
    for name in size["dtypes"]:
        generation.gqa_rows(table, size, device, getattr(torch, name), lambda fn: synchronised(device, fn))
    return table


def run(device="cuda", tiny=False):
    device = torch.device(device)
    size = TINY if tiny else FULL
    return [mha_table(device, size), encoder_table(device, size), attention_table(device, size),
            gqa_table(device, size)]


def main(argv):
    if not torch.cuda.is_available():
        print("No CUDA GPU found (torch.cuda.is_available() is False): the GPU benchmark "
              "has nothing to measure here. Run `python -m benchmarks.gpu` on a machine with a GPU.")
        return 0
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    info = machine()
    print("machine:", ", ".join(f"{k} {v}" for k, v in info.items()), end="\n\n")
    for table in run("cuda", tiny="--tiny" in argv):
        print(table.text(), end="\n\n")
        if save:
            table.save(save, info)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
