"""How the costs move with the sequence length T and the number of heads h.

    python -m benchmarks.sweeps           # full size
    python -m benchmarks.sweeps --tiny

Tables:
  sweep_T          ours vs nn.MultiheadAttention forward across T = 128 ... 4096, with
                   B * T = 4096 tokens throughout (so the projections cost the same in
                   every row and only attention's T x T part grows); also the share of
                   the multiply-adds spent on scores and weighted sums
  sweep_h          ours vs nn.MultiheadAttention forward across h (d fixed)
  loop_vs_fused    the loop of heads (chapter 4) vs the fused form (chapter 5), both
                   backends, across h, at T = 512 and for short sequences (T = 32)
"""


import numpy as np
import torch
from torch import nn

import mha.numpy as mnp
import mha.torch as mt
from benchmarks.harness import Table, compare, ms, print_tables, run_tables
from mha.experiments.counting import attention_multiply_adds

FULL = dict(tokens=4096, Ts=(128, 256, 512, 1024, 2048, 4096), d=512, h=8, B=8, T=512,
            heads=(1, 2, 4, 8, 16, 32, 64), loop_heads=(1, 2, 4, 8, 16, 32, 64), loop_Ts=(512, 32),
            rounds=9, warmup=2)
TINY = dict(tokens=16, Ts=(4, 8), d=16, h=2, B=2, T=8, heads=(1, 2, 4), loop_heads=(1, 2), loop_Ts=(8, 4),
            rounds=2, warmup=1)


def pair(d, h, seed):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(d, h, batch_first=True).eval()
    return mt.MultiHeadAttention.from_torch(theirs).eval(), theirs


def forward_ratio(ours, theirs, x, size):
    with torch.no_grad():
        return compare({"ours": lambda: ours(x), "theirs": lambda: theirs(x, x, x, need_weights=False)},
                       "theirs", rounds=size["rounds"], warmup=size["warmup"])


def sweep_T_table(size):
    table = Table("sweep_T", "Forward time across T (B * T fixed): mha.torch vs nn.MultiheadAttention",
                  ["T", "B", "attention share of multiply-adds", "ours (ms)", "PyTorch (ms)", "ratio"],
                  settings={"tokens": size["tokens"], "d": size["d"], "h": size["h"], "dtype": "float32",
                            "rounds": size["rounds"], "threads": torch.get_num_threads()},
                  notes="eval mode, no autograd, no weights returned")
    ours, theirs = pair(size["d"], size["h"], seed=5)
    for T in size["Ts"]:
        B = max(1, size["tokens"] // T)
        torch.manual_seed(T)
        x = torch.randn(B, T, size["d"])
        r = forward_ratio(ours, theirs, x, size)
        count = attention_multiply_adds(T, T, size["d"], size["h"])
        table.add(**{"T": T, "B": B, "attention share of multiply-adds": round(count.attention / count.total, 3),
                     "ours (ms)": ms(r["ours"][0]), "PyTorch (ms)": ms(r["theirs"][0]),
                     "ratio": round(r["ours"][1], 3)})
    return table


def sweep_h_table(size):
    table = Table("sweep_h", "Forward time across h: mha.torch vs nn.MultiheadAttention",
                  ["h", "d_head", "ours (ms)", "PyTorch (ms)", "ratio"],
                  settings={"B": size["B"], "T": size["T"], "d": size["d"], "dtype": "float32",
                            "rounds": size["rounds"], "threads": torch.get_num_threads()},
                  notes="eval mode, no autograd, no weights returned")
    torch.manual_seed(6)
    x = torch.randn(size["B"], size["T"], size["d"])
    for h in size["heads"]:
        ours, theirs = pair(size["d"], h, seed=h)
        r = forward_ratio(ours, theirs, x, size)
        table.add(**{"h": h, "d_head": size["d"] // h, "ours (ms)": ms(r["ours"][0]),
                     "PyTorch (ms)": ms(r["theirs"][0]), "ratio": round(r["ours"][1], 3)})
    return table


def loop_setup(size, h):
    """A loop module and a fused module computing the same function (column blocks)."""
    torch.manual_seed(h)
    fused = mt.MultiHeadAttention(size["d"], h, bias=False).eval()
    return mt.MultiHeadAttentionLoop.from_fused(fused), fused


def loop_vs_fused_table(size):
    table = Table("loop_vs_fused", "The loop of heads (chapter 4) vs the fused form (chapter 5)",
                  ["T", "backend", "h", "d_head", "loop (ms)", "fused (ms)", "speed-up"],
                  settings={"B": size["B"], "d": size["d"], "dtype": "float32",
                            "rounds": size["rounds"], "threads": torch.get_num_threads()},
                  notes="both forms compute the per-head weights (the loop always does); "
                        "torch in eval mode, no autograd; speed-up = loop / fused")
    run = dict(rounds=size["rounds"], warmup=size["warmup"])
    for T in size["loop_Ts"]:
        torch.manual_seed(T)
        x = torch.randn(size["B"], T, size["d"])
        X = x.numpy()
        for h in size["loop_heads"]:
            loop, fused = loop_setup(size, h)
            with torch.no_grad():
                r = compare({"loop": lambda: loop(x), "fused": lambda: fused(x, return_weights=True)},
                            "fused", **run)
                assert torch.allclose(loop(x), fused(x), atol=1e-4), "the loop and the fused module must agree"
            add_loop_row(table, T, "mha.torch", h, size, r)
            params = {k: np.ascontiguousarray(v) for k, v in fused.numpy_params().items() if v is not None}
            heads = [tuple(np.ascontiguousarray(W) for W in triple)
                     for triple in mnp.heads_from_fused(params["W_q"], params["W_k"], params["W_v"], h)]
            r = compare({"loop": lambda: mnp.multihead_attention_loop(X, heads, params["W_o"]),
                         "fused": lambda: mnp.multihead_attention(X, n_heads=h, **params)}, "fused", **run)
            add_loop_row(table, T, "mha.numpy", h, size, r)
    return table


def add_loop_row(table, T, backend, h, size, r):
    table.add(**{"T": T, "backend": backend, "h": h, "d_head": size["d"] // h, "loop (ms)": ms(r["loop"][0]),
                 "fused (ms)": ms(r["fused"][0]), "speed-up": round(r["loop"][1], 2)})


TABLES = {"sweep_T": sweep_T_table, "sweep_h": sweep_h_table, "loop_vs_fused": loop_vs_fused_table}


def run(tiny=False, only=None):
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
