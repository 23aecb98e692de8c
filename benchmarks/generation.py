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
  decoding_vs_transformers
                   time per generated token after T tokens of context: GroupedQueryAttention
                   copies and a KVCache per layer against Hugging Face's LlamaAttention layers
                   with a DynamicCache and with a StaticCache (one thread)
  generate_vs_transformers
                   greedy generation with a whole model: mha.torch.from_transformers(model).generate
                   against model.generate(do_sample=False), a small random LlamaForCausalLM

CPU, float32 (the memory table: float16), eval mode, no autograd. Each table checks
that the two things it compares compute the same outputs before it times them.
"""

import contextlib
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.masking_utils import create_causal_mask
from transformers.models.llama import modeling_llama as llama

import mha.torch as mt
from benchmarks.harness import Table, compare, ms, print_tables, run_tables

FULL = dict(gen_Ts=(64, 128, 256, 512, 1024, 2048), gen_layers=4, gen_d=256, gen_h=8, gen_h_kv=2, gen_rounds=31,
            mem_layers=4, mem_T=1024, mem_steps=8,
            gqa_B=4, gqa_Ts=(256, 1024), gqa_d=512, gqa_h=8, gqa_kv=(8, 2, 1), rounds=21, warmup=3,
            dec_Ts=(64, 512, 2048), dec_steps=32, dec_rounds=31,
            lm_Ts=(64, 512), lm_new=32, lm_d_ff=688, lm_vocab=1024, lm_rounds=15)
TINY = dict(gen_Ts=(8, 16, 32), gen_layers=2, gen_d=16, gen_h=4, gen_h_kv=2, gen_rounds=3,
            mem_layers=1, mem_T=16, mem_steps=2,
            gqa_B=2, gqa_Ts=(8,), gqa_d=16, gqa_h=4, gqa_kv=(4, 2, 1), rounds=3, warmup=1,
            dec_Ts=(4, 8), dec_steps=2, dec_rounds=3,
            lm_Ts=(4,), lm_new=3, lm_d_ff=32, lm_vocab=64, lm_rounds=3)
LLAMA = dict(n_layers=32, n_heads=32, d_head=128, T=8192, batch=1, bytes_per_value=2)  # Llama 2 7B, float16
ROPE_BASE = 10000.0
GQA_TARGET = 1.10
DECODING_TARGET = 1.00  # ours / Llama's layers with a DynamicCache, per generated token
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


# --- decoding_vs_transformers: our layers and caches against Llama's, one token per step ----------------

def llama_attention_stack(size, seed=0):
    """Hugging Face Llama's attention layers (sdpa) with random weights, one LlamaRotaryEmbedding for
    all of them, as LlamaModel holds it, and our copies of the layers (GroupedQueryAttention.from_llama)."""
    config = LlamaConfig(hidden_size=size["gen_d"], num_attention_heads=size["gen_h"],
                         num_key_value_heads=size["gen_h_kv"], num_hidden_layers=size["gen_layers"],
                         intermediate_size=2 * size["gen_d"], vocab_size=32,
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    theirs = [llama.LlamaAttention(config, layer_idx=i).eval() for i in range(size["gen_layers"])]
    ours = [mt.GroupedQueryAttention.from_llama(layer, ROPE_BASE).eval() for layer in theirs]
    return config, theirs, llama.LlamaRotaryEmbedding(config), ours


def llama_step(config, layers, rotary, cache, x):
    """x (1, T, d) -> x + attention(x), layer after layer, with Llama's layers and `cache`, as
    LlamaModel runs one step: position ids from the cache's length, (cos, sin) made once for every
    layer, and create_causal_mask's mask for a StaticCache. For a DynamicCache without padding that
    function returns None: we pass None and do not count its time."""
    start = cache.get_seq_length()
    position_ids = torch.arange(start, start + x.shape[-2])[None]  # (1, T)
    mask = None
    if isinstance(cache, StaticCache):  # keys beyond those written are zeros: the mask hides them
        mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None, past_key_values=cache,
                                  position_ids=position_ids)  # (1, 1, T, max_cache_len) booleans
    position_embeddings = rotary(x, position_ids)  # (cos, sin), each (1, T, d_head)
    for layer in layers:
        x = x + layer(x, position_embeddings, mask, past_key_values=cache)[0]
    return x


def decoders(size, T, x):
    """{name: (rewind, decode)} for ours and Llama's two caches, each prefilled with x[:, :T].
    rewind() puts a cache back to T positions; decode() feeds the dec_steps tokens after them, one
    at a time, and returns every output (1, dec_steps, d). Also returns the prefills' outputs."""
    config, theirs, rotary, ours = llama_attention_stack(size, seed=T)
    tokens = [x[:, t:t + 1] for t in range(T, T + size["dec_steps"])]  # (1, 1, d) each
    caches = [mt.KVCache() for _ in ours]
    dynamic, static = DynamicCache(config=config), StaticCache(config=config, max_cache_len=T + size["dec_steps"])
    steps = {"ours": lambda token: run_stack(ours, token, caches),
             "DynamicCache": lambda token: llama_step(config, theirs, rotary, dynamic, token),
             "StaticCache": lambda token: llama_step(config, theirs, rotary, static, token)}
    prefills = {name: step(x[:, :T]) for name, step in steps.items()}  # (1, T, d) each
    rewinds = {"ours": rewinder(caches), "DynamicCache": lambda: dynamic.crop(T - dynamic.get_seq_length()),
               "StaticCache": lambda: rewind_static(static, T)}  # crop(-n) drops a DynamicCache's last n
    return {name: (rewinds[name], decoding(step, tokens)) for name, step in steps.items()}, prefills


def rewinder(caches):
    """A callable that puts our KVCaches back to the positions they hold now: their keys and values
    are assignable."""
    held = [(cache.keys, cache.values) for cache in caches]  # (1, h_kv, T, d_head) each

    def rewind():
        for cache, (keys, values) in zip(caches, held):
            cache.keys, cache.values = keys, values
    return rewind


def rewind_static(cache, T):
    """A StaticCache's next token is written at position T again (its layers count in a tensor)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(T)


def decoding(step, tokens):
    """A callable feeding `tokens` (1, 1, d) to step(token) one at a time; it returns the outputs,
    (1, len(tokens), d)."""
    return lambda: torch.cat([step(token) for token in tokens], dim=-2)


def rounds_of(candidates, rounds, warmup):
    """harness.compare's interleaving, keeping every round: each candidate is (setup, timed), and
    only timed() is timed. The order alternates from round to round; the first `warmup` rounds are
    thrown away. Returns {name: [seconds of each round]}."""
    names = list(candidates)
    times = {name: [] for name in names}
    for r in range(warmup + rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            setup, timed = candidates[name]
            setup()
            start = time.perf_counter()
            timed()
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def ratio_spread(times, name, baseline):
    """The per-round ratios name / baseline: (median, smallest, largest), rounded."""
    ratios = [t / b for t, b in zip(times[name], times[baseline])]
    return tuple(round(value, 3) for value in (statistics.median(ratios), min(ratios), max(ratios)))


DECODING_COLUMNS = ["T", "ours (ms/token)", "DynamicCache (ms/token)", "StaticCache (ms/token)",
                    "ours / DynamicCache", "min", "max", "ours / StaticCache", "min (static)", "max (static)",
                    "target", "met"]


def decoding_table(size):
    """ms per generated token after T tokens of context, ours against Llama's layers and caches."""
    table = Table("decoding_vs_transformers", "Time per generated token: GroupedQueryAttention + KVCache vs "
                  "Hugging Face's LlamaAttention + DynamicCache or StaticCache", DECODING_COLUMNS,
                  settings={"layers": size["gen_layers"], "d_model": size["gen_d"], "n_heads": size["gen_h"],
                            "n_kv_heads": size["gen_h_kv"], "rope_base": ROPE_BASE, "batch": 1, "dtype": "float32",
                            "steps": size["dec_steps"], "rounds": size["dec_rounds"], "warmup": size["warmup"],
                            "threads": 1, "attn_implementation": "sdpa"},
                  notes="a stack of attention layers (x + attention(x), no feed-forward), the same weights on both "
                        "sides: Hugging Face's LlamaAttention layers (sdpa), each with its layer_idx, and one "
                        "LlamaRotaryEmbedding making (cos, sin) once per step for all layers, as LlamaModel does, "
                        "with a DynamicCache or a StaticCache (max_cache_len = T + steps; its mask from "
                        "create_causal_mask, as LlamaModel makes it; the DynamicCache's is None and not made); "
                        "ours: GroupedQueryAttention.from_llama copies, forward(x, causal=True, cache=KVCache()). "
                        "The T-token prompt is prefilled once; each round rewinds the caches to T positions "
                        "(untimed) and times the next `steps` tokens, one per call; ms/token = that time / steps. "
                        "The outputs are compared first. Rounds interleaved (the order alternating), the first "
                        "`warmup` thrown away; times are medians over the rounds; ratios are medians of the "
                        "per-round ratios, with their smallest and largest (min, max). One thread, eval mode, "
                        f"no autograd; target: ours / DynamicCache <= {DECODING_TARGET:.2f}")
    with one_thread(), torch.no_grad():
        for T in size["dec_Ts"]:
            add_decoding_row(table, size, T)
    return table


@contextlib.contextmanager
def one_thread():
    """torch on one thread inside the block, as many threads as before after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def add_decoding_row(table, size, T):
    torch.manual_seed(T)
    x = torch.randn(1, T + size["dec_steps"], size["gen_d"])
    candidates, prefills = decoders(size, T, x)
    outputs = {name: decode() for name, (rewind, decode) in candidates.items()}  # (1, steps, d) each
    for name in ("DynamicCache", "StaticCache"):
        torch.testing.assert_close(prefills["ours"], prefills[name], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outputs["ours"], outputs[name], rtol=1e-5, atol=1e-5)
    times = rounds_of(candidates, size["dec_rounds"], size["warmup"])
    for name, (rewind, decode) in candidates.items():  # a rewound cache decodes the same tokens again
        rewind()
        torch.testing.assert_close(decode(), outputs[name], rtol=0, atol=0)
    per_token = {name: ms(statistics.median(t) / size["dec_steps"]) for name, t in times.items()}
    dynamic, static = ratio_spread(times, "ours", "DynamicCache"), ratio_spread(times, "ours", "StaticCache")
    table.add(**{"T": T, "ours (ms/token)": per_token["ours"], "DynamicCache (ms/token)": per_token["DynamicCache"],
                 "StaticCache (ms/token)": per_token["StaticCache"], "ours / DynamicCache": dynamic[0],
                 "min": dynamic[1], "max": dynamic[2], "ours / StaticCache": static[0], "min (static)": static[1],
                 "max (static)": static[2], "target": f"<= {DECODING_TARGET:.2f}",
                 "met": "yes" if dynamic[0] <= DECODING_TARGET else "NO"})


# --- generate_vs_transformers: a whole model, greedy -----------------------------------------------------

def llama_model(size, seed=0):
    """A small LlamaForCausalLM with random weights (the layers of decoding_vs_transformers, a gated
    feed-forward, RMSNorms), no end-of-text token to stop at, and our copy of it (from_transformers)."""
    config = LlamaConfig(hidden_size=size["gen_d"], num_attention_heads=size["gen_h"],
                         num_key_value_heads=size["gen_h_kv"], num_hidden_layers=size["gen_layers"],
                         intermediate_size=size["lm_d_ff"], vocab_size=size["lm_vocab"],
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    return model, mt.from_transformers(model).eval()


GENERATE_COLUMNS = ["prompt T", "new tokens", "ours (ms/token)", "generate() (ms/token)",
                    "generate(static) (ms/token)", "ours / generate()", "min", "max", "ours / generate(static)",
                    "min (static)", "max (static)"]


def generate_table(size):
    """ms per generated token, a whole model greedy: ours against transformers' generate()."""
    table = Table("generate_vs_transformers", "Greedy generation with a whole model: "
                  "mha.torch.from_transformers(model).generate vs model.generate(do_sample=False)", GENERATE_COLUMNS,
                  settings={"layers": size["gen_layers"], "d_model": size["gen_d"], "n_heads": size["gen_h"],
                            "n_kv_heads": size["gen_h_kv"], "d_ff": size["lm_d_ff"], "vocab": size["lm_vocab"],
                            "rope_base": ROPE_BASE, "batch": 1, "dtype": "float32", "rounds": size["lm_rounds"],
                            "warmup": size["warmup"], "threads": 1, "attn_implementation": "sdpa"},
                  notes="a LlamaForCausalLM with random weights and our copy, mha.torch.from_transformers(model) "
                        "(a TransformerLM); each call continues a random prompt of T tokens by `new tokens` "
                        "greedy tokens, the prompt's forward included: ours.generate(prompt, n) against "
                        "model.generate(prompt, attention_mask=ones, max_new_tokens=n, do_sample=False) with its "
                        "default DynamicCache, and with cache_implementation=\"static\". The tokens are compared "
                        "first (equal). ms/token = a call's time / new tokens. Rounds interleaved (the order "
                        "alternating), the first `warmup` thrown away; times are medians over the rounds; ratios are "
                        "medians of the per-round ratios, with their smallest and largest. One thread, eval mode, "
                        "no autograd")
    model, ours = llama_model(size)
    with one_thread(), torch.no_grad():
        for T in size["lm_Ts"]:
            add_generate_row(table, size, model, ours, T)
    return table


def add_generate_row(table, size, model, ours, T):
    torch.manual_seed(T)
    prompt = torch.randint(0, size["lm_vocab"], (1, T))
    n, ones = size["lm_new"], torch.ones_like(prompt)
    options = dict(attention_mask=ones, max_new_tokens=n, do_sample=False, pad_token_id=0)
    calls = {"ours": lambda: ours.generate(prompt, n),
             "generate()": lambda: model.generate(prompt, **options),
             "generate(static)": lambda: model.generate(prompt, cache_implementation="static", **options)}
    tokens = {name: call() for name, call in calls.items()}  # (1, T + n) each
    for name in ("generate()", "generate(static)"):
        assert torch.equal(tokens["ours"], tokens[name]), f"ours and {name} must write the same tokens"
    times = rounds_of({name: (lambda: None, call) for name, call in calls.items()}, size["lm_rounds"], size["warmup"])
    per_token = {name: ms(statistics.median(t) / n) for name, t in times.items()}
    dynamic, static = ratio_spread(times, "ours", "generate()"), ratio_spread(times, "ours", "generate(static)")
    table.add(**{"prompt T": T, "new tokens": n, "ours (ms/token)": per_token["ours"],
                 "generate() (ms/token)": per_token["generate()"],
                 "generate(static) (ms/token)": per_token["generate(static)"], "ours / generate()": dynamic[0],
                 "min": dynamic[1], "max": dynamic[2], "ours / generate(static)": static[0],
                 "min (static)": static[1], "max (static)": static[2]})


TABLES = {"generation": generation_table, "kv_cache_memory": kv_cache_memory_table, "gqa_vs_pytorch": gqa_table,
          "decoding_vs_transformers": decoding_table, "generate_vs_transformers": generate_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
