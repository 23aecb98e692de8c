"""Attention that remembers less (chapter 17): a tiny DeepSeek-V3 decoding from its latent cache.

    python -m benchmarks.latent_decode          # full size: a few minutes on 2 cores
    python -m benchmarks.latent_decode --tiny   # seconds: checks that everything runs

Table (a `harness.Table`):
  deepseek_v3_decode
        the prefill (the prompt's forward, up to the first new token) and the cached greedy decoding
        (ms per token after it) of mha.torch.from_transformers(model).generate, whose latent attention
        caches only the latent and the shared rotary key and decodes in the absorbed form, against
        model.generate(do_sample=False) on the same DeepseekV3ForCausalLM (random weights), at 1 and 2
        threads and two prompt lengths

transformers' DeepseekV3Attention caches the same latent but expands it into every head's keys and
values at each step (kv_b_proj over the whole cache); the absorbed form folds that up-projection into
the query and the output instead (DeepSeek-V2, 2024). CPU, float32, eval mode, no autograd. The tokens
are compared before anything is timed; each call is timed once per round, the rounds interleaved, and
one call gives both phases (a forward hook stamps the end of the first forward).
"""

import statistics

import torch

import mha.torch as mt
from benchmarks.decoding import ratio_spread
from benchmarks.harness import Table, ms, print_tables, run_tables
from benchmarks.real_model import FirstForward, threads, timed_rounds

# A DeepSeek-V3 of DeepSeek-V3's proportions, made small: latent rank r = 4 d_head, decoupled rotary part
# of half a head, one dense layer first, then experts (8 routed in 4 groups, 2 groups and 2 experts chosen,
# one shared), sigmoid routing with its correction bias.
FULL = dict(model="tiny DeepSeek-V3", threads=(1, 2), Ts=(64, 512), new=32, rounds=11, warmup=1, vocab=1024,
            d_model=256, layers=4, heads=8, q_lora_rank=96, kv_lora_rank=128, nope=32, rope=16, v=32, d_ff=512,
            d_expert=128, experts=8, top_k=2, groups=4, top_groups=2, shared=1)
TINY = dict(model="tiny DeepSeek-V3 (--tiny)", threads=(1, 2), Ts=(4, 8), new=3, rounds=3, warmup=1, vocab=64,
            d_model=32, layers=2, heads=4, q_lora_rank=16, kv_lora_rank=16, nope=8, rope=4, v=8, d_ff=64,
            d_expert=16, experts=4, top_k=2, groups=2, top_groups=1, shared=1)
TARGET = 1.00  # ours / generate(), both phases, every thread count and prompt length
CANDIDATES = ("ours", "generate()")
PHASES = ("prefill", "decoding, per token")
COLUMNS = ["threads", "prompt T", "new tokens", "phase", "ours (ms)", "generate() (ms)", "ours / generate()", "min",
           "max", "target", "met"]


def deepseek_config(size):
    """A DeepseekV3Config of `size`: no end-of-text token to stop at, sdpa attention (its default)."""
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(
        vocab_size=size["vocab"], hidden_size=size["d_model"], intermediate_size=size["d_ff"],
        moe_intermediate_size=size["d_expert"], num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"], n_shared_experts=size["shared"], n_routed_experts=size["experts"],
        num_experts_per_tok=size["top_k"], n_group=size["groups"], topk_group=size["top_groups"],
        first_k_dense_replace=1, q_lora_rank=size["q_lora_rank"], kv_lora_rank=size["kv_lora_rank"],
        qk_nope_head_dim=size["nope"], qk_rope_head_dim=size["rope"], v_head_dim=size["v"],
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    return config


def deepseek_model(size, seed=0):
    """transformers' DeepseekV3ForCausalLM with random weights (eval) and the course's copy of it. The
    experts' routing bias (a buffer that starts at zero) is drawn too, so that it takes part."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(deepseek_config(size)).eval()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model, mt.from_transformers(model).eval()


def generate_table(size):
    """Prefill and decoding of a tiny DeepSeek-V3, greedy: the course's latent cache against generate()."""
    table = Table("deepseek_v3_decode", f"{size['model']}, greedy: prefill and decoding from the latent cache, "
                  "mha.torch.from_transformers(model).generate vs model.generate(do_sample=False)", COLUMNS,
                  settings={"model": size["model"], "batch": 1, "dtype": "float32", "new tokens": size["new"],
                            "rounds": size["rounds"], "warmup": size["warmup"], "threads": list(size["threads"]),
                            **{key: size[key] for key in ("vocab", "d_model", "layers", "heads", "q_lora_rank",
                                                          "kv_lora_rank", "nope", "rope", "v", "d_ff", "d_expert",
                                                          "experts", "top_k", "groups", "top_groups", "shared")},
                            "attn_implementation": "sdpa", "device": "cpu"},
                  notes="transformers' DeepseekV3ForCausalLM with random weights (its experts' routing bias drawn "
                        "too) and our copy, mha.torch.from_transformers(model) (a TransformerLM with "
                        "MultiHeadLatentAttention: the cache holds the latent and the rotary key, decoding runs in "
                        "the absorbed form); each call continues a random prompt of T tokens by `new tokens` greedy "
                        "tokens: ours.generate(prompt, n) against model.generate(prompt, attention_mask=ones, "
                        "max_new_tokens=n, do_sample=False) with its default cache. The tokens are compared first "
                        "(equal). One call per candidate and round; a forward hook stamps the end of the model's "
                        "first forward: prefill = the call's start to then (ms), decoding = the rest of the call / "
                        "(n - 1) (ms per token). Rounds interleaved (the order alternating), the first `warmup` "
                        "thrown away; times are medians over the rounds; ratios are medians of the per-round "
                        "ratios, with their smallest and largest (min, max). Eval mode, no autograd; target: "
                        f"ratio <= {TARGET:.2f} in both phases at every thread count and prompt length")
    model, ours = deepseek_model(size)
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
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False, pad_token_id=0)
    calls = {"ours": lambda: ours.generate(prompt, n), "generate()": lambda: model.generate(prompt, **options)}
    tokens = {name: call() for name, call in calls.items()}  # (1, T + n) each
    assert torch.equal(tokens["ours"], tokens["generate()"]), "ours and generate() must write the same tokens"
    times = timed_rounds(calls, hook, n, size["rounds"], size["warmup"])
    for phase in PHASES:
        ratio, low, high = ratio_spread(times[phase], "ours", "generate()")
        table.add(**{"threads": n_threads, "prompt T": T, "new tokens": n, "phase": phase,
                     **{f"{name} (ms)": ms(statistics.median(times[phase][name])) for name in CANDIDATES},
                     "ours / generate()": ratio, "min": low, "max": high, "target": f"<= {TARGET:.2f}",
                     "met": "yes" if ratio <= TARGET else "NO"})


TABLES = {"deepseek_v3_decode": generate_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
