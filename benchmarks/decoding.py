"""Decoding against Hugging Face's (chapter 12): our layers, caches and whole model, one token
per step, against transformers' Llama with its caches and its generate().

    python -m benchmarks.decoding          # full size
    python -m benchmarks.decoding --tiny   # seconds: checks that everything runs

Tables (each a `harness.Table`):
  decoding_vs_transformers
                   time per generated token after T tokens of context: GroupedQueryAttention
                   copies and a KVCache per layer against Hugging Face's LlamaAttention layers
                   with a DynamicCache and with a StaticCache (one thread)
  generate_vs_transformers
                   greedy generation with a whole model: mha.torch.from_transformers(model).generate
                   against model.generate(do_sample=False), a small random LlamaForCausalLM

CPU, float32, eval mode, no autograd, one thread. Each table checks that the two things it
compares compute the same outputs (or tokens) before it times them, and interleaves their rounds.
"""

import copy
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.masking_utils import create_causal_mask
from transformers.models.llama import modeling_llama as llama

import mha.torch as mt
from mha.experiments.induction import one_thread
from benchmarks.generation import ROPE_BASE, run_stack
from benchmarks.harness import Table, compare, ms, print_tables, run_tables

FULL = dict(gen_layers=4, gen_d=256, gen_h=8, gen_h_kv=2, warmup=3, dec_Ts=(64, 512, 2048), dec_steps=32,
            dec_rounds=31, lm_Ts=(64, 512), lm_new=32, lm_d_ff=688, lm_vocab=1024, lm_rounds=15)
TINY = dict(gen_layers=2, gen_d=16, gen_h=4, gen_h_kv=2, warmup=1, dec_Ts=(4, 8), dec_steps=2, dec_rounds=3,
            lm_Ts=(4,), lm_new=3, lm_d_ff=32, lm_vocab=64, lm_rounds=3)
DECODING_TARGET = 1.00  # ours / Llama's layers with a DynamicCache, per generated token


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


TABLES = {"decoding_vs_transformers": decoding_table, "generate_vs_transformers": generate_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
