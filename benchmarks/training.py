"""Training and sampling (chapter 14): the course's language model against the same model written
directly with PyTorch layers, and the speed of sampling with the key-value cache.

    python -m benchmarks.training          # full size
    python -m benchmarks.training --tiny   # seconds: checks that everything runs

Tables (each a `harness.Table`):
  training_vs_pytorch
                 one whole training step (forward, cross-entropy, backward, clip_grad_norm_,
                 AdamW) of the chapter's model, mha.text.training.new_model(RUNS["char"][0], vocab),
                 against `PlainLM`, the same model written here from torch.nn layers, with the
                 course model's weights copied in (target: <= 1.10x)
  sampling_speed tokens per second of mha.torch.generate on the stored char model: with the
                 cache (the prompt read once, then one token per step), and, for scale, the same
                 sampling reading every token again at each step (no cache)

CPU, float32. Each table checks that the two things it compares compute the same thing (the
logits and every gradient; the sampled tokens) before it times them, and interleaves their rounds.
"""

import contextlib
import functools
import statistics

import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt
from benchmarks.decoding import ratio_spread, rounds_of
from benchmarks.harness import Table, ms, print_tables, run_tables
from mha.experiments.writing import RUNS, stored_model
from mha.text import CharTokenizer, load_splits
from mha.text.training import new_model, new_optimizer

FULL = dict(run="char", threads=(None, 1), rounds=15, warmup=2, prompts=(8, 64, 192), new_tokens=(64,),
            sample_rounds=9, stored=True)
TINY = dict(run="tiny", threads=(1,), rounds=3, warmup=1, prompts=(4, 8), new_tokens=(3,),
            sample_rounds=3, stored=False)
TRAINING_TARGET = 1.10  # ours / PlainLM, one whole training step
LOGITS_TOLERANCE = 1e-5  # of the largest |logit|
GRADIENT_TOLERANCE = 1e-4  # of each parameter's largest |gradient|


@functools.cache
def char_vocab_size():
    """The char model's vocabulary: its tokenizer fitted to the training text, as tools/data/train_lm.py fits it."""
    return CharTokenizer.fit(load_splits()["train"]).vocab_size


# --- the same model, written directly with PyTorch layers ----------------------------------------------

def rope_tables(T, d_head, base):
    """cos and sin (T, d_head) of positions 0 .. T - 1: feature i and i + d_head / 2 share an angle."""
    inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2).float() / d_head)  # (d_head / 2,)
    angles = torch.outer(torch.arange(T).float(), inv_freq)  # (T, d_head / 2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, d_head)
    return angles.cos(), angles.sin()


def rope(x, cos, sin):
    """x (B, h, T, d_head) rotated: x * cos + rotate_half(x) * sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class PlainAttention(nn.Module):
    """Causal multi-head self-attention with RoPE: (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d_model, d_model, bias=False)
                                                              for _ in range(4))

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        q, k, v = (proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d_head)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, d))  # (B, T, d)


class PlainBlock(nn.Module):
    """x + attention(norm(x)), then x + SwiGLU(norm(x)): (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model, n_heads, d_ff, eps):
        super().__init__()
        self.attention_norm, self.mlp_norm = nn.RMSNorm(d_model, eps=eps), nn.RMSNorm(d_model, eps=eps)
        self.attention = PlainAttention(d_model, n_heads)
        self.gate_proj, self.up_proj = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class PlainLM(nn.Module):
    """Llama's shape in torch.nn layers: tokens (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, vocab_size, d_model, n_layers, n_heads, d_ff, context, rope_base, eps=1e-5):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(PlainBlock(d_model, n_heads, d_ff, eps) for _ in range(n_layers))
        self.norm = nn.RMSNorm(d_model, eps=eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.embedding.weight  # tied
        cos, sin = rope_tables(context, d_model // n_heads, rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.embedding(tokens)  # (B, T, d)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        return self.lm_head(self.norm(x))  # (B, T, V)


# PlainLM's parameter in layer i -> the course's in block i
LAYER_NAMES = {"attention_norm": "attention_norm_in", "attention.q_proj": "attention.W_q",
               "attention.k_proj": "attention.W_k", "attention.v_proj": "attention.W_v",
               "attention.o_proj": "attention.W_o", "mlp_norm": "feed_forward_norm_in",
               "gate_proj": "feed_forward.W_gate", "up_proj": "feed_forward.W_up", "down_proj": "feed_forward.W_down"}


def course_names(n_layers):
    """{PlainLM's parameter name: the TransformerLM's}, every parameter of both."""
    names = {"embedding.weight": "embedding.weight", "norm.weight": "norm.weight"}
    for i in range(n_layers):
        names.update({f"layers.{i}.{plain}.weight": f"blocks.{i}.{ours}.weight" for plain, ours in LAYER_NAMES.items()})
    return names


def plain_copy(course, config):
    """A PlainLM holding the weights of `course`, a TransformerLM made from TrainingConfig `config`."""
    plain = PlainLM(course.config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.d_ff,
                    config.context, config.rope_base, eps=course.config.norm_eps)
    theirs, ours = dict(plain.named_parameters()), dict(course.named_parameters())
    names = course_names(config.n_layers)
    assert set(names) == set(theirs) and set(names.values()) == set(ours), "every parameter is copied"
    with torch.no_grad():
        for plain_name, course_name in names.items():
            theirs[plain_name].copy_(ours[course_name])
    return plain


def check_same_model(course, plain, batch):
    """Logits and every gradient of the loss on `batch` (B, T + 1) must agree: the logits within
    LOGITS_TOLERANCE of the largest |logit|, each gradient within GRADIENT_TOLERANCE of its largest
    entry. Raises AssertionError naming what differs; returns the two relative differences."""
    logits = {}
    for name, model in (("course", course), ("plain", plain)):
        model.zero_grad(set_to_none=True)
        logits[name] = model(batch[:, :-1])  # (B, T, V)
        F.cross_entropy(logits[name].flatten(0, 1), batch[:, 1:].flatten()).backward()
    logit_gap = relative_gap(logits["plain"], logits["course"])
    assert logit_gap <= LOGITS_TOLERANCE, f"logits differ by {logit_gap:.2e} of the largest"
    ours, theirs = dict(course.named_parameters()), dict(plain.named_parameters())
    gradient_gap = 0.0
    for plain_name, course_name in course_names(len(plain.layers)).items():
        gap = relative_gap(theirs[plain_name].grad, ours[course_name].grad)
        assert gap <= GRADIENT_TOLERANCE, f"the gradients of {course_name} differ by {gap:.2e} of the largest"
        gradient_gap = max(gradient_gap, gap)
    for model in (course, plain):
        model.zero_grad(set_to_none=True)
    return logit_gap, gradient_gap


def relative_gap(a, b):
    """max |a - b| / max |b|."""
    return ((a - b).abs().max() / b.abs().max()).item()


# --- training_vs_pytorch --------------------------------------------------------------------------------

def training_step(model, optimizer, batch, clip):
    """One step as mha.text.training.train takes it: forward, cross-entropy, backward, clip, AdamW."""
    logits = model(batch[:, :-1])  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss


def plain_optimizer(model, config):
    """AdamW as a PyTorch user writes it: weight decay on the matrices, none on the norms."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=config.lr, betas=tuple(config.betas))


@contextlib.contextmanager
def torch_threads(n):
    """torch on n threads inside the block (None: as many as now), as many as before after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(before if n is None else n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


TRAINING_COLUMNS = ["threads", "ours (ms/step)", "PlainLM (ms/step)", "ratio", "min", "max", "target", "met",
                    "logits gap", "gradients gap"]


def training_table(size):
    """ms per training step of the course's model and of PlainLM, the same weights."""
    config = RUNS[size["run"]][0]
    table = Table("training_vs_pytorch", "One training step: mha.torch.TransformerLM (the chapter's model) vs the "
                  "same model written directly with torch.nn layers", TRAINING_COLUMNS,
                  settings={"run": size["run"], "vocab": char_vocab_size(), "d_model": config.d_model,
                            "n_layers": config.n_layers, "n_heads": config.n_heads, "d_ff": config.d_ff,
                            "context": config.context, "batch": config.batch_size, "dtype": "float32",
                            "rounds": size["rounds"], "warmup": size["warmup"]},
                  notes="ours: mha.text.training.new_model(RUNS[run][0], vocab) and new_optimizer; PlainLM "
                        "(benchmarks/training.py): nn.Embedding, nn.RMSNorm (eps 1e-5), nn.Linear without "
                        "biases, RoPE in a few lines, F.scaled_dot_product_attention(is_causal=True), F.silu, "
                        "the output layer tied to the embedding, AdamW with the same groups; ours' weights "
                        "copied in. Before timing, the logits (gap: max |difference| / max |logit|, at most "
                        f"{LOGITS_TOLERANCE:g}) and every gradient (gap: of its largest entry, at most "
                        f"{GRADIENT_TOLERANCE:g}) are compared. A step: forward, cross-entropy, backward, "
                        "clip_grad_norm_, AdamW step, on one fixed batch of random tokens. Rounds interleaved "
                        "(the order alternating), the first `warmup` thrown away; times are medians; the ratio "
                        "is the median of the per-round ratios, with their smallest and largest. threads: "
                        f"torch's default and one; target: ours / PlainLM <= {TRAINING_TARGET:.2f}")
    for threads in size["threads"]:
        with torch_threads(threads) as n:
            add_training_row(table, size, config, n)
    return table


def add_training_row(table, size, config, threads):
    course = new_model(config, char_vocab_size())  # float32, train mode
    plain = plain_copy(course, config)
    batch = torch.randint(char_vocab_size(), (config.batch_size, config.context + 1),
                          generator=torch.Generator().manual_seed(threads))  # (B, T + 1)
    logit_gap, gradient_gap = check_same_model(course, plain, batch)
    steps = {"ours": (course, new_optimizer(course, config)), "PlainLM": (plain, plain_optimizer(plain, config))}
    candidates = {name: (lambda: None, lambda m=model, o=optimizer: training_step(m, o, batch, config.clip))
                  for name, (model, optimizer) in steps.items()}
    times = rounds_of(candidates, size["rounds"], size["warmup"])
    ratio, low, high = ratio_spread(times, "ours", "PlainLM")
    table.add(**{"threads": threads, "ours (ms/step)": ms(statistics.median(times["ours"])),
                 "PlainLM (ms/step)": ms(statistics.median(times["PlainLM"])), "ratio": ratio, "min": low,
                 "max": high, "target": f"<= {TRAINING_TARGET:.2f}", "met": "yes" if ratio <= TRAINING_TARGET else "NO",
                 "logits gap": float(f"{logit_gap:.2g}"), "gradients gap": float(f"{gradient_gap:.2g}")})


# --- sampling_speed --------------------------------------------------------------------------------------

def sampling_model(size):
    """(model in eval mode, its description): the stored char model at full size, else an untrained
    model of the run's shape (new_model), as the tiny size and a checkout without the weights have."""
    if size["stored"]:
        try:
            return stored_model("char")[0], "the stored char model (mha.experiments.writing.stored_model)"
        except FileNotFoundError:
            pass
    return new_model(RUNS[size["run"]][0], char_vocab_size()).eval(), f"untrained, new_model(RUNS[{size['run']!r}][0])"


def without_cache(model):
    """The model as a plain callable tokens (B, T) -> logits (B, T, V): mt.generate then reads every
    token again at each step."""
    return lambda tokens: model(tokens)


SAMPLING_COLUMNS = ["prompt T", "new tokens", "cached (tokens/s)", "uncached (tokens/s)", "speed-up", "min", "max"]


def sampling_table(size):
    """Tokens per second of mha.torch.generate, with the cache and reading every token again."""
    model, description = sampling_model(size)
    config = model.config
    table = Table("sampling_speed", "Sampling with mha.torch.generate: tokens per second with the KV cache "
                  "and without it", SAMPLING_COLUMNS,
                  settings={"model": description, "vocab": config.vocab_size, "d_model": config.d_model,
                            "n_layers": config.n_layers, "n_heads": model.n_heads, "batch": 1, "dtype": "float32",
                            "threads": 1, "temperature": 1.0, "top_k": None, "top_p": None,
                            "rounds": size["sample_rounds"], "warmup": size["warmup"]},
                  notes="each call continues a prompt of random token ids by `new tokens` tokens drawn with "
                        "mha.torch.generate(model, prompt, n, generator=torch.Generator().manual_seed(0)): "
                        "cached, the model (a TransformerLM) reads the prompt once and then one token per step "
                        "with its KVCache; uncached, the same function is given the model as a plain callable "
                        "and reads every token again at each step. Both draw the same tokens (checked first). "
                        "tokens/s = new tokens / a call's median time (the prompt's forward included); "
                        "speed-up = uncached time / cached time, the median of the per-round ratios with "
                        "their smallest and largest. Rounds interleaved, the first `warmup` thrown away. One "
                        "thread, eval mode, no autograd")
    with torch_threads(1), torch.no_grad():
        for T in size["prompts"]:
            for n in size["new_tokens"]:
                add_sampling_row(table, size, model, T, n)
    return table


def add_sampling_row(table, size, model, T, n):
    prompt = torch.randint(model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))  # (1, T)
    calls = {"cached": lambda: mt.generate(model, prompt, n, generator=torch.Generator().manual_seed(0)),
             "uncached": lambda: mt.generate(without_cache(model), prompt, n,
                                             generator=torch.Generator().manual_seed(0))}
    tokens = {name: call() for name, call in calls.items()}  # (1, T + n) each
    assert torch.equal(tokens["cached"], tokens["uncached"]), "with and without the cache, the same tokens"
    times = rounds_of({name: (lambda: None, call) for name, call in calls.items()}, size["sample_rounds"],
                      size["warmup"])
    speedup, low, high = ratio_spread(times, "uncached", "cached")
    per_second = {name: round(n / statistics.median(t), 1) for name, t in times.items()}
    table.add(**{"prompt T": T, "new tokens": n, "cached (tokens/s)": per_second["cached"],
                 "uncached (tokens/s)": per_second["uncached"], "speed-up": speedup, "min": low, "max": high})


TABLES = {"training_vs_pytorch": training_table, "sampling_speed": sampling_table}


def run(tiny=False, only=None):
    """Every table of this module (or those named in `only`), in order."""
    return run_tables(TABLES, TINY if tiny else FULL, only)


if __name__ == "__main__":
    print_tables(run)
