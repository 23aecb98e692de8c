"""Generation (chapter 12): the key-value cache, its memory, and grouped-query attention
against a production-style layer written on PyTorch.

    python -m benchmarks.generation          # full size
    python -m benchmarks.generation --tiny   # seconds: checks that everything runs

Tables (each a `harness.Table`):
  generation       time per generated token as the context T grows, with and without
                   mha.torch.KVCache, for a stack of GroupedQueryAttention layers (RoPE)
  kv_cache_memory  the cache of MHA, GQA and MQA: kv_cache_bytes for a Llama-2-7B-like
                   model at 8K tokens, and the bytes held by real KVCache objects filled
                   by GroupedQueryAttention at a smaller size, against the formula
  gqa_vs_pytorch   mha.torch.GroupedQueryAttention vs the same layer written directly
                   on PyTorch (nn.Linear, view/transpose, Hugging Face RoPE,
                   F.scaled_dot_product_attention with enable_gqa=True)
  (decoding against transformers' Llama and its caches: benchmarks/decoding.py)

CPU, float32 (the memory table: float16), eval mode, no autograd. Each table checks
that the two things it compares compute the same outputs before it times them.
"""

import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt
from benchmarks.harness import Table, compare, ms, print_tables, run_tables

FULL = dict(gen_Ts=(64, 128, 256, 512, 1024, 2048), gen_layers=4, gen_d=256, gen_h=8, gen_h_kv=2, gen_rounds=31,
            mem_layers=4, mem_T=1024, mem_steps=8,
            gqa_B=4, gqa_Ts=(256, 1024), gqa_d=512, gqa_h=8, gqa_kv=(8, 2, 1), rounds=21, warmup=3)
TINY = dict(gen_Ts=(8, 16, 32), gen_layers=2, gen_d=16, gen_h=4, gen_h_kv=2, gen_rounds=3,
            mem_layers=1, mem_T=16, mem_steps=2,
            gqa_B=2, gqa_Ts=(8,), gqa_d=16, gqa_h=4, gqa_kv=(4, 2, 1), rounds=3, warmup=1)
LLAMA = dict(n_layers=32, n_heads=32, d_head=128, T=8192, batch=1, bytes_per_value=2)  # Llama 2 7B, float16
ROPE_BASE = 10000.0
GQA_TARGET = 1.10
GIB, MIB = 2 ** 30, 2 ** 20


# --- generation: one token at a time, with and without the cache -------------------------------------

def attention_stack(n_layers, d, h, h_kv, seed=0, dtype=None, d_head=None):
    """n_layers GroupedQueryAttention layers with RoPE, in eval mode."""
    torch.manual_seed(seed)
    return [mt.GroupedQueryAttention(d, h, h_kv, d_head=d_head, rope_base=ROPE_BASE, dtype=dtype).eval()
            for _ in range(n_layers)]


def run_stack(layers, x, caches=None):
    """x -> x + attention(x), layer after layer (causal; each layer with its own cache if given)."""
    for i, layer in enumerate(layers):
        x = x + layer(x, causal=True, cache=None if caches is None else caches[i])[0]
    return x


def filled_caches(layers, prefix):
    """One KVCache per layer holding the keys and values of `prefix` (1, T, d)."""
    caches = [mt.KVCache() for _ in layers]
    run_stack(layers, prefix, caches)
    return caches


def next_token_with_cache(layers, caches, new):
    """A callable computing the new token's output from caches of T positions: the caches
    are put back to their T positions first, so they do not grow from round to round."""
    saved = [(c.keys, c.values) for c in caches]

    def step():
        for cache, (keys, values) in zip(caches, saved):
            cache.keys, cache.values = keys, values
        return run_stack(layers, new, caches)
    return step


def generation_table(size):
    """ms per generated token: the whole prefix again (no cache) vs the new token and a cache."""
    layers = attention_stack(size["gen_layers"], size["gen_d"], size["gen_h"], size["gen_h_kv"], seed=10)
    table = Table("generation", "Time per generated token: recompute the prefix vs a KV cache",
                  ["T", "without cache (ms/token)", "with cache (ms/token)", "speedup"],
                  settings={"layers": size["gen_layers"], "d_model": size["gen_d"], "n_heads": size["gen_h"],
                            "n_kv_heads": size["gen_h_kv"], "rope_base": ROPE_BASE, "batch": 1,
                            "dtype": "float32", "rounds": size["gen_rounds"], "threads": torch.get_num_threads()},
                  notes="a stack of GroupedQueryAttention layers (x + attention(x), causal, RoPE; no "
                        "feed-forward); the next token after T tokens of context. Without cache: a causal "
                        "forward over all T + 1 positions, of which the last is kept. With cache: one call "
                        "with the new token and one mha.torch.KVCache of T positions per layer (reset to T "
                        "before each round). eval mode, no autograd; speedup = without / with")
    run = dict(rounds=size["gen_rounds"], warmup=size["warmup"])
    with torch.no_grad():
        for T in size["gen_Ts"]:
            torch.manual_seed(T)
            x = torch.randn(1, T + 1, size["gen_d"])
            caches = filled_caches(layers, x[:, :T])
            candidates = {"without": lambda: run_stack(layers, x)[:, -1:],
                          "with": next_token_with_cache(layers, caches, x[:, T:])}
            assert torch.allclose(candidates["without"](), candidates["with"](), atol=1e-4), \
                "the cached step must give the output of the full forward"
            r = compare(candidates, "with", **run)
            table.add(**{"T": T, "without cache (ms/token)": ms(r["without"][0]),
                         "with cache (ms/token)": ms(r["with"][0]), "speedup": round(r["without"][1], 2)})
    return table


# --- kv_cache_memory: the formula, and real caches measured --------------------------------------------

def stored_bytes(caches):
    """The bytes of the tensors the caches hold: keys and values of every layer."""
    return sum(t.nelement() * t.element_size() for c in caches for t in (c.keys, c.values))


def measured_cache_bytes(n_kv_heads, size):
    """Fill one KVCache per layer as generation does (a prompt, then one token at a time) with
    float16 GroupedQueryAttention layers of Llama's heads; returns (cached positions, bytes held)."""
    layers = attention_stack(size["mem_layers"], 256, LLAMA["n_heads"], n_kv_heads, seed=n_kv_heads,
                             dtype=torch.float16, d_head=LLAMA["d_head"])
    caches = [mt.KVCache() for _ in layers]
    T_prompt = size["mem_T"] - size["mem_steps"]
    x = torch.randn(1, size["mem_T"], 256, dtype=torch.float16)
    with torch.no_grad():
        run_stack(layers, x[:, :T_prompt], caches)
        for t in range(T_prompt, size["mem_T"]):
            run_stack(layers, x[:, t:t + 1], caches)
    assert len({len(c) for c in caches}) == 1 and all(c.keys.dtype == torch.float16 for c in caches)
    return len(caches[0]), stored_bytes(caches)


def kv_cache_memory_table(size):
    L, T = size["mem_layers"], size["mem_T"]
    table = Table("kv_cache_memory", "KV cache memory of MHA, GQA and MQA (float16, one sequence)",
                  ["attention", "n_kv_heads", "GiB at 8K tokens (formula)", "measured at",
                   "measured (bytes)", "formula (bytes)", "measured scaled to 8K (GiB)"],
                  settings={"n_layers": LLAMA["n_layers"], "n_heads": LLAMA["n_heads"], "d_head": LLAMA["d_head"],
                            "T": LLAMA["T"], "batch": 1, "dtype": "float16",
                            "measured layers": L, "measured T": T, "prompt + single steps": f"{T - size['mem_steps']}"
                            f" + {size['mem_steps']}"},
                  notes="formula: mha.torch.kv_cache_bytes(n_layers, n_kv_heads, d_head, T) = 2 (keys and "
                        "values) x layers x n_kv_heads x d_head x T x 2 bytes, for Llama 2 7B's shape (32 "
                        "layers, 32 query heads of width 128). measured: the bytes of the keys and values held "
                        "by real mha.torch.KVCache objects, one per float16 GroupedQueryAttention layer (32 "
                        "query heads, d_head 128, RoPE; d_model does not enter the cache), filled by a prompt "
                        "and then one token per call; scaled to 8K = measured x (32 / layers) x (8192 / T)")
    scale = (LLAMA["n_layers"] / L) * (LLAMA["T"] / T)
    for name, h_kv in (("MHA", 32), ("GQA", 8), ("MQA", 1)):
        cached, measured = measured_cache_bytes(h_kv, size)
        formula = mt.kv_cache_bytes(L, h_kv, LLAMA["d_head"], cached, bytes_per_value=2)
        big = mt.kv_cache_bytes(LLAMA["n_layers"], h_kv, LLAMA["d_head"], LLAMA["T"], bytes_per_value=2)
        table.add(**{"attention": name, "n_kv_heads": h_kv, "GiB at 8K tokens (formula)": big / GIB,
                     "measured at": f"{L} layers, T={cached}", "measured (bytes)": measured,
                     "formula (bytes)": formula, "measured scaled to 8K (GiB)": measured * scale / GIB})
    return table


# --- gqa_vs_pytorch: ours against a production-style layer ---------------------------------------------

def rotate_half(x):
    """Hugging Face's rotate_half: (x1, x2) -> (-x2, x1) over the halves of the last axis."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class PyTorchGQA(nn.Module):
    """Grouped-query attention as a production model writes it (Hugging Face Llama's layout),
    with the projections of a GroupedQueryAttention copied; no input checks."""

    def __init__(self, ours):
        super().__init__()
        self.h, self.h_kv, self.d_head = ours.n_heads, ours.n_kv_heads, ours.d_head
        self.q_proj, self.k_proj = copy.deepcopy(ours.W_q), copy.deepcopy(ours.W_k)
        self.v_proj, self.o_proj = copy.deepcopy(ours.W_v), copy.deepcopy(ours.W_o)
        self.rope = ours.rope_base is not None
        if self.rope:  # LlamaRotaryEmbedding's buffer, made once
            device = ours.W_q.weight.device
            exponents = torch.arange(0, self.d_head, 2, dtype=torch.float32, device=device) / self.d_head
            self.register_buffer("inv_freq", 1.0 / (ours.rope_base ** exponents), persistent=False)

    def rotary(self, T, dtype):
        """cos, sin (T, d_head), as LlamaRotaryEmbedding.forward computes them on every call."""
        positions = torch.arange(T, dtype=torch.float32, device=self.inv_freq.device)
        freqs = positions[:, None] * self.inv_freq[None, :]  # (T, d_head / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, d_head)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x, causal=False):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d_head).transpose(1, 2)  # (B, h, T, d_head)
        k = self.k_proj(x).view(B, T, self.h_kv, self.d_head).transpose(1, 2)  # (B, h_kv, T, d_head)
        v = self.v_proj(x).view(B, T, self.h_kv, self.d_head).transpose(1, 2)  # (B, h_kv, T, d_head)
        if self.rope:
            cos, sin = self.rotary(T, x.dtype)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # (B, h, T, d_head)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.h * self.d_head))  # (B, T, d)


def gqa_pair(d, h, h_kv, rope_base, seed, device=None, dtype=None):
    torch.manual_seed(seed)
    ours = mt.GroupedQueryAttention(d, h, h_kv, rope_base=rope_base, device=device, dtype=dtype).eval()
    return ours, PyTorchGQA(ours).eval()


def gqa_rows(table, size, device=None, dtype=None, synchronised=lambda fn: fn):
    """One row per (T, h_kv, RoPE, causal), ours vs the baseline; the outputs must agree."""
    run = dict(rounds=size["rounds"], warmup=size["warmup"])
    tolerance = 1e-4 if dtype in (None, torch.float32) else 2e-2
    for T in size["gqa_Ts"]:
        torch.manual_seed(T)
        x = torch.randn(size["gqa_B"], T, size["gqa_d"], device=device, dtype=dtype)
        for h_kv in size["gqa_kv"]:
            for rope_base in (ROPE_BASE, None):
                ours, theirs = gqa_pair(size["gqa_d"], size["gqa_h"], h_kv, rope_base, seed=h_kv, device=device,
                                        dtype=dtype)
                for causal in (True, False):
                    with torch.no_grad():
                        a, b = (lambda: ours(x, causal=causal)[0]), (lambda: theirs(x, causal=causal))
                        assert torch.allclose(a(), b(), atol=tolerance, rtol=tolerance), \
                            "ours and the baseline must agree"
                        r = compare({"ours": synchronised(a), "baseline": synchronised(b)}, "baseline", **run)
                    add_gqa_row(table, T, h_kv, rope_base, causal, r, dtype)


def add_gqa_row(table, T, h_kv, rope_base, causal, r, dtype=None):
    ratio = r["ours"][1]
    row = {"T": T, "n_kv_heads": h_kv, "RoPE": "yes" if rope_base else "no", "causal": "yes" if causal else "no",
           "ours (ms)": ms(r["ours"][0]), "baseline (ms)": ms(r["baseline"][0]), "ratio": round(ratio, 3),
           "target": f"<= {GQA_TARGET}", "met": "yes" if ratio <= GQA_TARGET else "NO"}
    if "dtype" in table.columns:
        row["dtype"] = str(dtype).removeprefix("torch.")
    table.add(**row)


GQA_TITLE = "mha.torch.GroupedQueryAttention vs the same layer on F.scaled_dot_product_attention"
GQA_COLUMNS = ["T", "n_kv_heads", "RoPE", "causal", "ours (ms)", "baseline (ms)", "ratio", "target", "met"]
GQA_NOTES = ("baseline: the same projections (weights copied), .view(...).transpose(1, 2), Hugging Face "
             "Llama's RoPE (rotate_half; cos and sin made on every call from a stored inv_freq) and "
             "F.scaled_dot_product_attention(q, k, v, is_causal=..., enable_gqa=True), then the output "
             "projection; ours: GroupedQueryAttention(x, causal=...) with return_weights=False. "
             f"eval mode, no autograd; ratio = ours / baseline; target <= {GQA_TARGET}")


def gqa_settings(size):
    return {"B": size["gqa_B"], "d_model": size["gqa_d"], "n_heads": size["gqa_h"],
            "d_head": size["gqa_d"] // size["gqa_h"], "rope_base": ROPE_BASE, "rounds": size["rounds"]}


def gqa_table(size):
    table = Table("gqa_vs_pytorch", GQA_TITLE, GQA_COLUMNS, settings={**gqa_settings(size), "dtype": "float32",
                                         "threads": torch.get_num_threads()}, notes=GQA_NOTES)
    gqa_rows(table, size)
    return table


TABLES = {"generation": generation_table, "kv_cache_memory": kv_cache_memory_table, "gqa_vs_pytorch": gqa_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
