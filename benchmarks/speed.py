"""The library against PyTorch's own layers, same weights, same inputs, CPU.

    python -m benchmarks.speed            # full size: B=8, T=512, d=512, h=8, float32
    python -m benchmarks.speed --tiny     # seconds: checks that everything runs

Tables (each a `harness.Table`):
  mha_vs_pytorch      mha.torch.MultiHeadAttention vs nn.MultiheadAttention: forward
                      without weights, forward with per-head weights, forward+backward
  encoder_vs_pytorch  mha.torch.EncoderBlock vs nn.TransformerEncoderLayer
  numpy_vs_pytorch    mha.numpy.multihead_attention vs nn.MultiheadAttention
  causal              causal attention: the is_causal fast path vs a mask tensor

Forward passes run as in inference (eval mode, no autograd), where PyTorch's
layers take their fused "fast path"; forward+backward runs in training mode
(dropout 0). A ratio is ours / PyTorch: below 1 means ours is faster.
"""


import numpy as np
import torch
from torch import nn

import mha.numpy as mnp
import mha.torch as mt
from benchmarks.harness import Table, compare, ms, print_tables, run_tables

FULL = dict(B=8, T=512, d=512, h=8, d_ff=2048, rounds=31, warmup=3)
TINY = dict(B=2, T=8, d=16, h=2, d_ff=32, rounds=3, warmup=1)
COLUMNS = ["comparison", "ours (ms)", "PyTorch (ms)", "ratio", "target", "met"]


def settings_of(size):
    s = dict(size)
    return {"B": s["B"], "T": s["T"], "d": s["d"], "h": s["h"], "dtype": "float32",
            "rounds": s["rounds"], "threads": torch.get_num_threads()}


def add_row(table, comparison, ours, theirs, target=None):
    """One row from compare()'s result for ("ours", "theirs")."""
    (t_ours, ratio), (t_theirs, _) = ours, theirs
    table.add(**{"comparison": comparison, "ours (ms)": ms(t_ours), "PyTorch (ms)": ms(t_theirs),
                 "ratio": round(ratio, 3), "target": "" if target is None else f"<= {target}",
                 "met": "" if target is None else ("yes" if ratio <= target else "NO")})


def inputs(size, seed=0):
    torch.manual_seed(seed)
    return torch.randn(size["B"], size["T"], size["d"])


def backward_of(module, call):
    """A callable running forward and backward (gradients are cleared, not timed apart)."""
    def run():
        module.zero_grad(set_to_none=True)
        call().sum().backward()
    return run


def mha_table(size):
    """mha.torch.MultiHeadAttention against nn.MultiheadAttention, weights copied."""
    torch.manual_seed(1)
    theirs = nn.MultiheadAttention(size["d"], size["h"], batch_first=True)
    ours = mt.MultiHeadAttention.from_torch(theirs)
    x = inputs(size)
    table = Table("mha_vs_pytorch", "mha.torch.MultiHeadAttention vs torch.nn.MultiheadAttention",
                  COLUMNS, settings=settings_of(size),
                  notes="forward: eval mode, no autograd (PyTorch's fast path); "
                        "forward+backward: training mode, dropout 0")
    run = dict(rounds=size["rounds"], warmup=size["warmup"])
    theirs.eval(), ours.eval()
    with torch.no_grad():
        r = compare({"ours": lambda: ours(x),
                     "theirs": lambda: theirs(x, x, x, need_weights=False)}, "theirs", **run)
        add_row(table, "forward, no weights", r["ours"], r["theirs"], 1.05)
        r = compare({"ours": lambda: ours(x, return_weights=True),
                     "theirs": lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False)},
                    "theirs", **run)
        add_row(table, "forward, per-head weights", r["ours"], r["theirs"], 1.05)
    theirs.train(), ours.train()
    x_grad = x.clone().requires_grad_()
    r = compare({"ours": backward_of(ours, lambda: ours(x_grad)),
                 "theirs": backward_of(theirs, lambda: theirs(x_grad, x_grad, x_grad, need_weights=False)[0])},
                "theirs", **run)
    add_row(table, "forward + backward", r["ours"], r["theirs"], 1.05)
    return table


def encoder_table(size):
    """mha.torch.EncoderBlock against nn.TransformerEncoderLayer, weights copied."""
    torch.manual_seed(2)
    theirs = nn.TransformerEncoderLayer(size["d"], size["h"], size["d_ff"], dropout=0.0, batch_first=True)
    ours = mt.EncoderBlock.from_torch(theirs)
    x = inputs(size)
    table = Table("encoder_vs_pytorch", "mha.torch.EncoderBlock vs torch.nn.TransformerEncoderLayer",
                  COLUMNS, settings={**settings_of(size), "d_ff": size["d_ff"]},
                  notes="post-norm, relu, dropout 0; forward: eval mode, no autograd "
                        "(PyTorch's fast path); forward+backward: training mode")
    run = dict(rounds=size["rounds"], warmup=size["warmup"])
    theirs.eval(), ours.eval()
    with torch.no_grad():
        r = compare({"ours": lambda: ours(x), "theirs": lambda: theirs(x)}, "theirs", **run)
        add_row(table, "forward", r["ours"], r["theirs"], 1.10)
    theirs.train(), ours.train()
    x_grad = x.clone().requires_grad_()
    r = compare({"ours": backward_of(ours, lambda: ours(x_grad)),
                 "theirs": backward_of(theirs, lambda: theirs(x_grad))}, "theirs", **run)
    add_row(table, "forward + backward", r["ours"], r["theirs"], 1.10)
    return table


def numpy_table(size):
    """The NumPy reference against nn.MultiheadAttention: float32, contiguous weights."""
    torch.manual_seed(3)
    theirs = nn.MultiheadAttention(size["d"], size["h"], batch_first=True).eval()
    params = {k: np.ascontiguousarray(v) for k, v in mt.MultiHeadAttention.from_torch(theirs).numpy_params().items()}
    x = inputs(size)
    X = x.numpy()  # float32, contiguous
    table = Table("numpy_vs_pytorch", "mha.numpy.multihead_attention vs torch.nn.MultiheadAttention",
                  COLUMNS, settings=settings_of(size),
                  notes="NumPy float32 throughout; PyTorch in eval mode without autograd (its fast "
                        "path), except in the last row: nn.MultiheadAttention(...)(x, x, x) as constructed, "
                        "training mode with autograd (dropout 0), need_weights=True; "
                        "the NumPy function always returns the per-head weights")
    run = dict(rounds=size["rounds"], warmup=size["warmup"])

    def ours():
        return mnp.multihead_attention(X, n_heads=size["h"], **params)

    with torch.no_grad():
        r = compare({"ours": ours, "theirs": lambda: theirs(x, x, x, need_weights=False)}, "theirs", **run)
        add_row(table, "forward vs PyTorch without weights", r["ours"], r["theirs"], 1.5)
        r = compare({"ours": ours, "theirs": lambda: theirs(x, x, x, need_weights=True,
                                                             average_attn_weights=False)}, "theirs", **run)
        add_row(table, "forward vs PyTorch with per-head weights", r["ours"], r["theirs"], 1.5)
    theirs.train()  # as constructed and called by default: autograd on, weights averaged over heads
    r = compare({"ours": ours, "theirs": lambda: theirs(x, x, x)}, "theirs", **run)
    add_row(table, "forward vs PyTorch called by default (training mode)", r["ours"], r["theirs"], 1.5)
    return table


def causal_table(size):
    """Causal self-attention: `causal=True` (PyTorch's is_causal kernel) vs a boolean mask."""
    torch.manual_seed(4)
    theirs = nn.MultiheadAttention(size["d"], size["h"], batch_first=True).eval()
    ours = mt.MultiHeadAttention.from_torch(theirs).eval()
    x = inputs(size)
    T = size["T"]
    allowed = mt.causal_mask(T)  # ours: True = may attend
    blocked = ~allowed  # nn.MultiheadAttention: True = may NOT attend
    table = Table("causal", "Causal self-attention: the is_causal fast path against a mask tensor",
                  ["comparison", "ours (ms)", "baseline (ms)", "ratio"], settings=settings_of(size),
                  notes="eval mode, no autograd; ratio = ours / baseline")
    run = dict(rounds=size["rounds"], warmup=size["warmup"])
    rows = [
        ("ours causal=True vs nn.MultiheadAttention with a boolean causal mask",
         lambda: theirs(x, x, x, attn_mask=blocked, need_weights=False)),
        ("ours causal=True vs ours with mask=causal_mask(T)", lambda: ours(x, mask=allowed)),
    ]
    with torch.no_grad():
        for label, baseline in rows:
            r = compare({"ours": lambda: ours(x, causal=True), "baseline": baseline}, "baseline", **run)
            table.add(**{"comparison": label, "ours (ms)": ms(r["ours"][0]),
                         "baseline (ms)": ms(r["baseline"][0]), "ratio": round(r["ours"][1], 3)})
    return table


TABLES = {"mha": mha_table, "encoder": encoder_table, "numpy": numpy_table, "causal": causal_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
