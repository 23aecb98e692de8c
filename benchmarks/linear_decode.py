"""Attention without the T x T matrix (chapter 18): a fixed state against a growing cache, measured.

    python -m benchmarks.linear_decode          # full size: several minutes on 2 cores
    python -m benchmarks.linear_decode --tiny   # seconds: checks that everything runs

Tables (each a `harness.Table`):
  state_versus_cache
        one decoded token through a softmax attention layer (GroupedQueryAttention, Qwen3.5's full
        layer: output gate, QK-norm, partial RoPE) whose KVCache holds T tokens, against one token
        through a GatedDeltaNet layer whose StateCache has a fixed size: time and bytes held, T = 64,
        128, ..., 16384, one thread; the crossings (where the cache's step becomes the slower, and
        the larger) are read from the rows by `crossing`, not assumed
  chunked_prefill
        the gated delta rule over a prompt of T tokens (T up to 4096): mha.torch.gated_delta_rule_chunked
        against mha.torch.gated_delta_rule_recurrent (one token at a time) and transformers' two forms
        (torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule), on the same inputs, one thread
  hybrid_decode
        a tiny Qwen3.5 (three Gated DeltaNet layers to one full-attention layer) copied by
        mha.torch.from_transformers, greedy: prefill and decoding (ms per token) of our copy, whose
        linear layers keep a StateCache, against model.generate(do_sample=False), at 1 and 2 threads
        and three prompt lengths

CPU, float32, eval mode, no autograd. Every table compares outputs (or tokens) before it times
anything; the candidates of a comparison run in interleaved rounds (see harness.py).
"""

import statistics

import torch

import mha.torch as mt
from benchmarks.decoding import ratio_spread, rounds_of
from benchmarks.harness import Table, ms, print_tables, run_tables
from benchmarks.real_model import FirstForward, threads, timed_rounds

# The layers: Qwen3.5's head shapes (Qwen3_5TextConfig's defaults: full attention with heads of 256 and
# 4 query heads to a key/value head, partial RoPE on a quarter of each head; Gated DeltaNet with key and
# value heads of 128, two value heads to a key head, a convolution of 4), a quarter of its heads.
FULL = dict(layer_d_model=1024, heads=4, kv_heads=1, d_head=256, rotary_dim=64, key_heads=4, value_heads=8,
            key_dim=128, value_dim=128, conv=4, state_Ts=tuple(2 ** n for n in range(6, 15)), state_steps=8,
            state_rounds=11, prefill_Ts=(256, 1024, 4096), chunk=64, prefill_rounds=7, prefill_threads=(1,),
            model="tiny Qwen3.5", threads=(1, 2), Ts=(64, 512, 2048), new=32, rounds=11, vocab=1024, d_model=256,
            layers=4, lm_heads=4, lm_kv_heads=2, lm_d_head=64, lm_key_heads=2, lm_value_heads=4, lm_key_dim=64,
            lm_value_dim=64, d_ff=512, warmup=1)
TINY = dict(layer_d_model=32, heads=2, kv_heads=1, d_head=16, rotary_dim=8, key_heads=1, value_heads=2,
            key_dim=8, value_dim=8, conv=4, state_Ts=(4, 8, 16), state_steps=2, state_rounds=3, prefill_Ts=(10, 40),
            chunk=8, prefill_rounds=3, prefill_threads=(1,), model="tiny Qwen3.5 (--tiny)", threads=(1, 2),
            Ts=(4, 8), new=3, rounds=3, vocab=64, d_model=32, layers=4, lm_heads=2, lm_kv_heads=1, lm_d_head=16,
            lm_key_heads=1, lm_value_heads=2, lm_key_dim=8, lm_value_dim=8, d_ff=64, warmup=1)
CHUNKED_TARGET = 0.50  # the chunked form / the recurrent one, at the longest prompt (one thread)
DECODE_TARGET = 1.00  # ours / transformers' generate(), per decoded token, every thread count and prompt length
STATE_COLUMNS = ["T", "KV cache step (ms)", "state step (ms)", "KV / state (time)", "min", "max", "KV cache (bytes)",
                 "state (bytes)", "KV / state (bytes)"]
PREFILL_COLUMNS = ["threads", "T", "chunk size", "recurrent (ms)", "chunked (ms)", "transformers' recurrent (ms)",
                   "transformers' chunked (ms)", "chunked / recurrent", "min", "max", "chunked / transformers'",
                   "min (transformers')", "max (transformers')"]
CANDIDATES = ("ours", "generate()")
PHASES = ("prefill", "decoding, per token")
HYBRID_COLUMNS = ["threads", "prompt T", "new tokens", "phase", "ours (ms)", "generate() (ms)", "ours / generate()",
                  "min", "max", "target", "met"]
LAYER_KEYS = ("layer_d_model", "heads", "kv_heads", "d_head", "rotary_dim", "key_heads", "value_heads", "key_dim",
              "value_dim", "conv")


def crossing(rows, column):
    """The first T from which on the KV cache costs more than the state: rows[i][column] > 1 there and
    at every longer T (one noisy row below a crossing does not make one). None if it never does."""
    first = None
    for row in sorted(rows, key=lambda row: row["T"]):
        if row[column] > 1:
            first = row["T"] if first is None else first
        else:
            first = None
    return first


# --- state_versus_cache: one decoded token, a growing KV cache against a fixed state -------------------------

def layers(size, seed=0):
    """(softmax attention, Gated DeltaNet): the two layers of `size` with random weights (eval)."""
    torch.manual_seed(seed)
    d = size["layer_d_model"]
    softmax = mt.GroupedQueryAttention(d, size["heads"], size["kv_heads"], d_head=size["d_head"], rope_base=1e7,
                                       qk_norm="head", output_gate=True, rotary_dim=size["rotary_dim"]).eval()
    linear = mt.GatedDeltaNet(d, n_key_heads=size["key_heads"], n_value_heads=size["value_heads"],
                              key_head_dim=size["key_dim"], value_head_dim=size["value_dim"],
                              conv_kernel=size["conv"]).eval()
    return softmax, linear


def kv_decoder(softmax, T, tokens):
    """(rewind, decode) for the softmax layer with a KVCache of T positions (random keys and values: the
    step's work does not depend on them). decode() feeds `tokens` (1, 1, d) one at a time and returns the
    outputs (1, steps, d); rewind() puts the cache back to its T positions."""
    shape = (1, softmax.n_kv_heads, T, softmax.d_head)  # (1, h_kv, T, d_head)
    cache = mt.KVCache()
    cache.append(torch.randn(shape), torch.randn(shape))
    held = cache.keys, cache.values

    def rewind():
        cache.keys, cache.values = held

    def decode():
        return torch.cat([softmax(token, causal=True, cache=cache)[0] for token in tokens], dim=-2)
    return rewind, decode, cache


def state_decoder(linear, prompt, tokens):
    """(rewind, decode) for the Gated DeltaNet layer whose StateCache has read `prompt` (1, T0, d): the
    state's size and a step's work do not depend on how many tokens it has read, so one prompt serves
    every T. rewind() puts back the state read from the prompt (copies: a step may update in place)."""
    cache = linear.new_cache()
    linear(prompt, cache=cache)
    held = cache.conv_state.clone(), cache.recurrent_state.clone(), cache.position

    def rewind():
        cache.conv_state, cache.recurrent_state = held[0].clone(), held[1].clone()
        cache.position = held[2]

    def decode():
        return torch.cat([linear(token, cache=cache) for token in tokens], dim=-2)
    return rewind, decode, cache


def check_cached_steps(softmax, linear, size):
    """Before anything is timed: each layer's cached steps equal its forward over the whole sequence."""
    x = torch.randn(1, size["state_Ts"][0] + size["state_steps"], size["layer_d_model"])  # (1, T0 + steps, d)
    T0 = size["state_Ts"][0]
    tokens = [x[:, t:t + 1] for t in range(T0, x.shape[-2])]  # (1, 1, d) each
    kv = mt.KVCache()
    softmax(x[:, :T0], causal=True, cache=kv)
    stepped = torch.cat([softmax(token, causal=True, cache=kv)[0] for token in tokens], dim=-2)
    torch.testing.assert_close(stepped, softmax(x, causal=True)[0][:, T0:], rtol=1e-4, atol=1e-5)
    rewind, decode, _ = state_decoder(linear, x[:, :T0], tokens)
    torch.testing.assert_close(decode(), linear(x)[:, T0:], rtol=1e-4, atol=1e-5)


def state_table(size):
    """Per decoded token, time and bytes: a KVCache of T tokens against the Gated DeltaNet's state."""
    table = Table("state_versus_cache", "One decoded token: softmax attention with a KV cache of T tokens vs "
                  "Gated DeltaNet with its fixed state (time and bytes held)", STATE_COLUMNS,
                  settings={**{key: size[key] for key in LAYER_KEYS}, "batch": 1, "dtype": "float32",
                            "steps": size["state_steps"], "rounds": size["state_rounds"], "warmup": size["warmup"],
                            "threads": 1, "device": "cpu"},
                  notes="two layers of Qwen3.5's head shapes with random weights: mha.torch.GroupedQueryAttention "
                        "(output gate, QK-norm per head, RoPE on rotary_dim features of each head) with a "
                        "KVCache holding T positions (random keys and values), and mha.torch.GatedDeltaNet with "
                        "a StateCache that has read a prompt (the same for every T: the state's size and a "
                        "step's work do not depend on T). Each layer's cached steps are checked against its "
                        "forward over the whole sequence first, and a rewound cache decodes the same outputs "
                        "again. Each round rewinds both caches (untimed) and times `steps` tokens, one per call; "
                        "ms = that time / steps. Rounds interleaved (the order alternating), the first `warmup` "
                        "thrown away; times are medians over the rounds; KV / state (time) is the median of the "
                        "per-round ratios, with their smallest and largest (min, max). Bytes: what each cache "
                        "holds before the step (KVCache.nbytes, StateCache.nbytes; float32, half that in "
                        "bfloat16, the ratio unchanged). One thread, eval mode, no autograd. The crossing is the "
                        "first T from which on the ratio stays above 1 (benchmarks.linear_decode.crossing)")
    softmax, linear = layers(size)
    with threads(1), torch.no_grad():
        check_cached_steps(softmax, linear, size)
        torch.manual_seed(1)
        prompt = torch.randn(1, size["state_Ts"][0], size["layer_d_model"])  # (1, T0, d)
        for T in size["state_Ts"]:
            tokens = [torch.randn(1, 1, size["layer_d_model"]) for _ in range(size["state_steps"])]
            add_state_row(table, size, softmax, linear, prompt, T, tokens)
    table.notes += (f"; here: time at T = {crossing(table.rows, 'KV / state (time)')}, bytes at T = "
                    f"{crossing(table.rows, 'KV / state (bytes)')}")
    return table


def add_state_row(table, size, softmax, linear, prompt, T, tokens):
    kv_rewind, kv_decode, kv_cache = kv_decoder(softmax, T, tokens)
    state_rewind, state_decode, state_cache = state_decoder(linear, prompt, tokens)
    kv_bytes, state_bytes = kv_cache.nbytes, state_cache.nbytes
    candidates = {"KV cache": (kv_rewind, kv_decode), "state": (state_rewind, state_decode)}
    for rewind, decode in candidates.values():  # a rewound cache decodes the same outputs again
        first = decode()
        rewind()
        torch.testing.assert_close(decode(), first, rtol=0, atol=0)
    times = rounds_of(candidates, size["state_rounds"], size["warmup"])
    ratio, low, high = ratio_spread(times, "KV cache", "state")
    steps = size["state_steps"]
    table.add(**{"T": T, "KV cache step (ms)": ms(statistics.median(times["KV cache"]) / steps),
                 "state step (ms)": ms(statistics.median(times["state"]) / steps), "KV / state (time)": ratio,
                 "min": low, "max": high, "KV cache (bytes)": kv_bytes, "state (bytes)": state_bytes,
                 "KV / state (bytes)": round(kv_bytes / state_bytes, 3)})


# --- chunked_prefill: the gated delta rule over a prompt, chunked against recurrent --------------------------

def delta_inputs(size, T, seed=0):
    """Queries, keys (1, h, T, d_k) L2-normalised, values (1, h, T, d_v), log decays g <= 0 and write
    strengths beta (1, h, T), as a Gated DeltaNet layer makes them (h = its value heads)."""
    generator = torch.Generator().manual_seed(seed)
    h, d_k, d_v = size["value_heads"], size["key_dim"], size["value_dim"]
    q, k = (mt.l2_normalize(torch.randn(1, h, T, d_k, generator=generator)) for _ in range(2))
    v = torch.randn(1, h, T, d_v, generator=generator)
    g = -torch.nn.functional.softplus(torch.randn(1, h, T, generator=generator))  # log decays, (1, h, T)
    beta = torch.sigmoid(torch.randn(1, h, T, generator=generator))  # (1, h, T)
    return q, k, v, g, beta


def prefill_calls(size, T):
    """{name: call} on one prompt's inputs: ours chunked and recurrent, and transformers' two forms (they take
    (1, T, h, d) and scale the queries themselves, as ours do)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)

    q, k, v, g, beta = delta_inputs(size, T)
    theirs = [a.transpose(1, 2).contiguous() for a in (q, k, v, g, beta)]  # (1, T, h, d) and (1, T, h)
    chunk = size["chunk"]
    return {"recurrent": lambda: mt.gated_delta_rule_recurrent(q, k, v, g, beta),
            "chunked": lambda: mt.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=chunk),
            "transformers' recurrent": lambda: theirs_in_our_layout(torch_recurrent_gated_delta_rule(
                *theirs[:3], g=theirs[3], beta=theirs[4], output_final_state=True)),
            "transformers' chunked": lambda: theirs_in_our_layout(torch_chunk_gated_delta_rule(
                *theirs[:3], g=theirs[3], beta=theirs[4], chunk_size=chunk, output_final_state=True))}


def theirs_in_our_layout(result):
    out, state = result  # (1, T, h, d_v), (1, h, d_k, d_v)
    return out.transpose(1, 2), state  # (1, h, T, d_v)


def prefill_table(size):
    """The gated delta rule over a prompt: chunked against recurrent (and against transformers' chunked)."""
    table = Table("chunked_prefill", "The gated delta rule over a prompt of T tokens: the chunked form vs the "
                  "recurrent one (and transformers' two forms)", PREFILL_COLUMNS,
                  settings={"heads": size["value_heads"], "key_dim": size["key_dim"], "value_dim": size["value_dim"],
                            "chunk size": size["chunk"], "batch": 1, "dtype": "float32",
                            "rounds": size["prefill_rounds"], "warmup": size["warmup"],
                            "threads": list(size["prefill_threads"]), "device": "cpu"},
                  notes="random queries and keys (L2-normalised), values, log decays g = -softplus(noise) and "
                        "write strengths beta = sigmoid(noise), one sequence of `heads` heads: "
                        "mha.torch.gated_delta_rule_chunked (chunk_size = chunk size) against "
                        "mha.torch.gated_delta_rule_recurrent (one token at a time) and transformers' "
                        "torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule (the fallbacks "
                        "transformers runs without the fla package) on the same inputs, each returning the outputs "
                        "and the final state. The four outputs and states are compared first (within 1e-4 of the "
                        "largest). Rounds interleaved (the "
                        "order alternating), the first `warmup` thrown away; times are medians over the rounds; "
                        "ratios are medians of the per-round ratios, with their smallest and largest. One thread (two "
                        "threads on a shared 2-core machine swing by 10x), eval, no autograd; target: "
                        f"chunked / recurrent <= {CHUNKED_TARGET:.2f} at the longest T")
    with torch.no_grad():
        for n_threads in size["prefill_threads"]:
            with threads(n_threads):
                for T in size["prefill_Ts"]:
                    add_prefill_row(table, size, n_threads, T)
    return table


def add_prefill_row(table, size, n_threads, T):
    calls = prefill_calls(size, T)
    results = {name: call() for name, call in calls.items()}  # (out (1, h, T, d_v), state (1, h, d_k, d_v))
    for name in ("chunked", "transformers' recurrent", "transformers' chunked"):
        for ours, other in zip(results["recurrent"], results[name]):
            torch.testing.assert_close(other, ours, rtol=0, atol=1e-4 * float(ours.abs().max()))
    times = rounds_of({name: (lambda: None, call) for name, call in calls.items()}, size["prefill_rounds"],
                      size["warmup"])
    chunked = ratio_spread(times, "chunked", "recurrent")
    theirs = ratio_spread(times, "chunked", "transformers' chunked")
    table.add(**{"threads": n_threads, "T": T, "chunk size": size["chunk"],
                 **{f"{name} (ms)": ms(statistics.median(times[name])) for name in calls},
                 "chunked / recurrent": chunked[0], "min": chunked[1], "max": chunked[2],
                 "chunked / transformers'": theirs[0], "min (transformers')": theirs[1],
                 "max (transformers')": theirs[2]})


# --- hybrid_decode: a tiny Qwen3.5, greedy, against transformers' generate -----------------------------------

def qwen3_5_config(size):
    """A Qwen3_5TextConfig of `size`: three Gated DeltaNet layers to one full-attention layer (its default
    interval), no end-of-text token to stop at, sdpa attention (transformers' default)."""
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=size["vocab"], hidden_size=size["d_model"], intermediate_size=size["d_ff"],
        num_hidden_layers=size["layers"], num_attention_heads=size["lm_heads"],
        num_key_value_heads=size["lm_kv_heads"], head_dim=size["lm_d_head"],
        linear_num_key_heads=size["lm_key_heads"], linear_num_value_heads=size["lm_value_heads"],
        linear_key_head_dim=size["lm_key_dim"], linear_value_head_dim=size["lm_value_dim"],
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    return config


def qwen3_5_model(size, seed=0):
    """transformers' Qwen3_5ForCausalLM with random weights (eval) and the course's copy of it."""
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(qwen3_5_config(size)).eval()
    return model, mt.from_transformers(model).eval()


def hybrid_table(size):
    """Prefill and decoding of a tiny Qwen3.5, greedy: the course's copy against generate()."""
    table = Table("hybrid_decode", f"{size['model']}, greedy: prefill and decoding with the state cache, "
                  "mha.torch.from_transformers(model).generate vs model.generate(do_sample=False)", HYBRID_COLUMNS,
                  settings={"model": size["model"], "batch": 1, "dtype": "float32", "new tokens": size["new"],
                            "rounds": size["rounds"], "warmup": size["warmup"], "threads": list(size["threads"]),
                            "layer types": qwen3_5_config(size).layer_types,
                            **{key: size[key] for key in ("vocab", "d_model", "layers", "lm_heads", "lm_kv_heads",
                                                          "lm_d_head", "lm_key_heads", "lm_value_heads",
                                                          "lm_key_dim", "lm_value_dim", "d_ff")},
                            "attn_implementation": "sdpa", "device": "cpu"},
                  notes="transformers' Qwen3_5ForCausalLM with random weights and our copy, "
                        "mha.torch.from_transformers(model) (a TransformerLM whose linear layers are GatedDeltaNet "
                        "with a StateCache, its full layer GroupedQueryAttention with a KVCache); each call "
                        "continues a random prompt of T tokens by `new tokens` greedy tokens: ours.generate(prompt, "
                        "n) against model.generate(prompt, attention_mask=ones, max_new_tokens=n, do_sample=False) "
                        "with its default cache (transformers' PyTorch fallbacks of the gated delta rule and the "
                        "convolution: fla and causal_conv1d are not installed). The tokens are compared first "
                        "(equal). One call per candidate and round; a forward hook stamps the end of the model's "
                        "first forward: prefill = the call's start to then (ms), decoding = the rest of the call "
                        "/ (n - 1) (ms per token). Rounds interleaved (the order alternating), the first `warmup` "
                        "thrown away; times are medians over the rounds; ratios are medians of the per-round "
                        "ratios, with their smallest and largest (min, max). Eval mode, no autograd; target: "
                        f"decoding ratio <= {DECODE_TARGET:.2f} at every thread count and prompt length")
    model, ours = qwen3_5_model(size)
    hook = FirstForward(model, ours)
    try:
        with torch.no_grad():
            for n_threads in size["threads"]:
                with threads(n_threads):
                    for T in size["Ts"]:
                        add_hybrid_rows(table, size, model, ours, hook, n_threads, T)
    finally:
        hook.remove()
    return table


def add_hybrid_rows(table, size, model, ours, hook, n_threads, T):
    torch.manual_seed(T)
    prompt = torch.randint(0, model.config.vocab_size, (1, T))  # (1, T)
    n = size["new"]
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False, pad_token_id=0)
    calls = {"ours": lambda: ours.generate(prompt, n), "generate()": lambda: model.generate(prompt, **options)}
    tokens = {name: call() for name, call in calls.items()}  # (1, T + n) each
    assert torch.equal(tokens["ours"], tokens["generate()"]), "ours and generate() must write the same tokens"
    times = timed_rounds(calls, hook, n, size["rounds"], size["warmup"])
    for phase in PHASES:
        ratio, low, high = ratio_spread(times[phase], "ours", "generate()")
        target = DECODE_TARGET if phase == "decoding, per token" else None
        table.add(**{"threads": n_threads, "prompt T": T, "new tokens": n, "phase": phase,
                     **{f"{name} (ms)": ms(statistics.median(times[phase][name])) for name in CANDIDATES},
                     "ours / generate()": ratio, "min": low, "max": high,
                     "target": "" if target is None else f"<= {target:.2f}",
                     "met": "" if target is None else ("yes" if ratio <= target else "NO")})


TABLES = {"state_versus_cache": state_table, "chunked_prefill": prefill_table, "hybrid_decode": hybrid_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
