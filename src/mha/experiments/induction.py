"""Chapter 11: induction heads in a small decoder-only Transformer trained on repeated segments.

- The vocabulary: 26 tokens, shown as the letters a .. z (`spell`).
- Data, made by code and seeded: `periodic_segments` (training: a segment of distinct
  letters repeated until the sequence is full, its length changing from sequence to
  sequence), `segment_and_repeat` (a segment, then the same segment again, or the same
  letters shuffled), `alphabet_runs` (segments of consecutive letters). In the training
  data a letter is never directly followed by the next letter of the alphabet, so every
  pair of neighbours in an alphabet run is new to the model.
- `train_induction`: AdamW with Vaswani et al.'s warm-up, a printed progress bar.
- Reading the heads (NumPy, float64): `previous_token_scores`, `induction_scores`,
  `after_copy_weights`, `repeat_loss` with heads knocked out, and the weights shipped with the
  library (`trained_params`), written by tools/data/train_induction.py.
- Every seed: `read_model` measures all of the above on the chapter's `held_out_sequences`, and
  the sweep "ch11_knockouts" (`knock_outs_over_seeds`) does so for ten seeds trained like the
  shipped model (seed 0 is the shipped model); tools/data/train_induction.py --seeds stores its table.
"""

import copy
import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import mha.numpy as mnp
import mha.torch as mt
from mha.experiments import seeds

LETTERS = "abcdefghijklmnopqrstuvwxyz"
WEIGHTS = Path(__file__).with_name("induction_model.npz")  # written by tools/data/train_induction.py


def spell(tokens):
    """One sequence of token ids as letters, e.g. [7, 4, 11] -> 'hel'."""
    return "".join(LETTERS[t] for t in np.asarray(tokens).tolist())


def segments(rng, batch_size, length, periods, vocab_size=26):
    """(B, length) tokens: distinct within a row, and token v + 1 (mod V) never right after token v,
    nor as the first token after the last one of a row's period (the pair where a repeat begins)."""
    tokens = np.zeros((batch_size, length), dtype=np.int64)
    used = np.zeros((batch_size, vocab_size), dtype=bool)
    rows = np.arange(batch_size)
    for i in range(length):
        allowed = ~used  # (B, V)
        if i > 0:
            allowed[rows, (tokens[:, i - 1] + 1) % vocab_size] = False  # no alphabet successor
            closing = np.flatnonzero(periods - 1 == i)  # rows whose period ends here
            allowed[closing, (tokens[closing, 0] - 1) % vocab_size] = False  # ... nor one across the repeat
        tokens[:, i] = np.where(allowed, rng.random((batch_size, vocab_size)), -1.0).argmax(axis=-1)
        used[rows, tokens[:, i]] = True
    return tokens


def periodic_segments(rng, batch_size, T, min_period, max_period, vocab_size=26):
    """Training sequences (B, T): a segment of L distinct tokens repeated until T tokens, L drawn
    for each sequence from min_period .. max_period. Returns the tokens and the periods L (B,)."""
    periods = rng.integers(min_period, max_period + 1, size=batch_size)  # (B,)
    segment = segments(rng, batch_size, max_period, periods, vocab_size)  # (B, max_period)
    positions = np.arange(T) % periods[:, None]  # (B, T): position t repeats token t mod L
    return np.take_along_axis(segment, positions, axis=1), periods


def segment_and_repeat(rng, batch_size, L, vocab_size=26, *, shuffle_repeat=False):
    """(B, 2L): a segment of L distinct tokens, then the same segment again (or, with
    shuffle_repeat, the same tokens in a new random order)."""
    segment = segments(rng, batch_size, L, np.full(batch_size, L), vocab_size)  # (B, L)
    repeat = rng.permuted(segment, axis=1) if shuffle_repeat else segment
    return np.concatenate([segment, repeat], axis=1)  # (B, 2L)


def alphabet_runs(rng, batch_size, L, vocab_size=26):
    """(B, 2L): L consecutive letters from a random start (wrapping after z), then the same again."""
    start = rng.integers(vocab_size, size=(batch_size, 1))
    segment = (start + np.arange(L)) % vocab_size  # (B, L)
    return np.concatenate([segment, segment], axis=1)  # (B, 2L)


# Training ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InductionConfig:
    """The model and its training; the defaults are those of the shipped weights."""
    vocab_size: int = 26
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    d_ff: int = 128
    max_len: int = 32
    min_period: int = 4
    max_period: int = 16
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100

    def model(self, dtype=None):
        return mt.DecoderOnlyTransformer(self.vocab_size, self.d_model, self.n_heads, self.n_layers, self.d_ff,
                                         self.max_len, dtype=dtype)


def progress_bar(step, steps, loss, seconds, width=24):
    """One line of a progress bar, e.g. 'step  300/1000 [#######.................] loss 2.913  1.9 s'."""
    done = round(width * step / steps)
    bar = "#" * done + "." * (width - done)
    return f"step {step:{len(str(steps))}d}/{steps} [{bar}] loss {loss:.3f} {seconds:5.1f} s"


def train_induction(config=InductionConfig(), steps=2000, *, seed=0, progress=True, report_every=None,
                    on_step=None):
    """Train `config.model()` on `periodic_segments` with AdamW and `mt.warmup_schedule`.

    The random start comes from torch.manual_seed(seed), the batches from NumPy's generator
    seeded with `seed`: the same arguments give the same model on the same machine. With
    `progress`, prints a bar every `report_every` steps (a tenth of them by default); `on_step`,
    if given, is called as on_step(step, model) after every step. The schedule does not depend
    on `steps`, so the first 800 steps of a longer run are an 800-step run.
    Returns the model and the loss of every step.
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = config.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    schedule = mt.warmup_schedule(optimizer, config.warmup_steps)
    report_every, start, losses = report_every or max(1, steps // 10), time.perf_counter(), []
    for step in range(1, steps + 1):
        tokens, _ = periodic_segments(rng, config.batch_size, config.max_len, config.min_period, config.max_period,
                                      config.vocab_size)
        loss = mt.causal_lm_loss(model(torch.from_numpy(tokens)), torch.from_numpy(tokens))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, model)
        if progress and (step % report_every == 0 or step == steps):
            print(progress_bar(step, steps, np.mean(losses[-report_every:]), time.perf_counter() - start), flush=True)
    return model.eval(), losses


# Reading the heads (NumPy, float64) ----------------------------------------------------------


def mean_weight(weights, keys, queries):
    """The mean attention weight that each query puts on its key: weights (n_layers, B, h, T, T),
    queries and keys (n,) positions. Returns (n_layers, h), averaged over sequences and queries."""
    picked = weights[..., queries, keys]  # (n_layers, B, h, n)
    return picked.mean(axis=(1, 3))


def previous_token_scores(weights, L, *, whole_sequence=False):
    """On sequences made of a segment and its repeat (T = 2L): the mean weight of the queries of the
    first segment, t = 1 .. L - 1, on the token before them, t - 1. (n_layers, h).
    With whole_sequence, the mean over the queries of the repeat too, t = 1 .. 2L - 1."""
    queries = np.arange(1, 2 * L if whole_sequence else L)
    return mean_weight(weights, queries - 1, queries)


def induction_scores(weights, L):
    """On sequences made of a segment and its repeat (T = 2L): the mean weight of the queries of the
    repeat, t = L .. 2L - 1, on position t - L + 1, the token that followed the earlier copy of their
    own token. (n_layers, h)."""
    queries = np.arange(L, 2 * L)
    return mean_weight(weights, queries - L + 1, queries)


def after_copy_weights(weights, tokens, L):
    """The mean weight that the queries of the repeat, t = L .. 2L - 1, give to the position just after
    the earlier copy of their own token, wherever it is (the repeat may be shuffled). (n_layers, h)."""
    earlier = np.argmax(tokens[:, None, :L] == tokens[:, L:, None], axis=-1)  # (B, L): the earlier copy
    after_copy = (earlier + 1)[None, :, None, :, None]  # (1, B, 1, L, 1): the position after it
    picked = np.take_along_axis(weights[..., L:, :], after_copy, axis=-1)  # (n_layers, B, h, L, 1)
    return picked.mean(axis=(1, 3, 4))


def next_token_losses(params, tokens, head_mask=None):
    """The loss of predicting token t + 1 at every position t: (B, T - 1), in float64."""
    logits, _ = mnp.decoder_only_transformer(tokens, **params, head_mask=head_mask)  # (B, T, V)
    return mnp.cross_entropy(logits[:, :-1], tokens[:, 1:], reduction="none")  # (B, T - 1)


def repeat_loss(params, tokens, L, head_mask=None):
    """The mean loss over the repeat of segment-and-repeat sequences: the predictions of positions
    L .. 2L - 2, whose next token can be copied from the first segment."""
    return float(next_token_losses(params, tokens, head_mask)[:, L:].mean())


def knock_out_losses(params, tokens, L):
    """repeat_loss with each head switched off in turn: (n_layers, h)."""
    n_layers, n_heads = len(params["layers"]), params["n_heads"]
    losses = np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        for head in range(n_heads):
            head_mask = np.ones((n_layers, n_heads), dtype=bool)
            head_mask[layer, head] = False
            losses[layer, head] = repeat_loss(params, tokens, L, head_mask)
    return losses


# The shipped weights ---------------------------------------------------------------------------


def save_params(path, params, config, **notes):
    """Write a model's `numpy_params()` and its `InductionConfig` to an .npz file (no pickles)."""
    arrays = {k: v for k, v in params.items() if isinstance(v, np.ndarray)}
    for i, layer in enumerate(params["layers"]):
        arrays.update({f"layers/{i}/{k}": v for k, v in layer.items() if v is not None})
    about = {"config": asdict(config), "n_heads": params["n_heads"], "activation": params["activation"],
             "eps": params["eps"], "n_layers": len(params["layers"]), **notes}
    np.savez(path, about=np.array(json.dumps(about, sort_keys=True)), **arrays)


def load_params(path=WEIGHTS, dtype=np.float64):
    """The parameters written by `save_params`, as `mnp.decoder_only_transformer` takes them (in `dtype`),
    and the notes saved with them (the config, the seed, the steps)."""
    with np.load(path, allow_pickle=False) as stored:
        about = json.loads(str(stored["about"]))
        arrays = {k: stored[k].astype(dtype) for k in stored.files if k != "about"}
    layers = [{k.split("/")[2]: v for k, v in arrays.items() if k.startswith(f"layers/{i}/")}
              for i in range(about["n_layers"])]
    params = {k: v for k, v in arrays.items() if not k.startswith("layers/")}
    params.update(layers=layers, n_heads=about["n_heads"], activation=about["activation"], eps=about["eps"])
    params.setdefault("b_out", None)
    params.setdefault("beta", None)
    return params, about


def trained_params():
    """The shipped weights (float64) and their notes."""
    return load_params(WEIGHTS)


# Every seed: chapter 11's table (tools/data/train_induction.py --seeds writes it) ------------------------

LIVE_STEPS, SHIPPED_STEPS = 800, 2000  # the chapter's live training; the shipped weights and the table
PROMPTS = ("kvbzqhtp", "mnopqrst", "transformer")  # each written twice, then continued up to 32 letters


def held_out_sequences(n=200, L=12):
    """The chapter's test sequences, (n, 2L) each, from generators that training never uses: a segment
    and its repeat, the same segments with the repeat shuffled, and alphabet runs."""
    return {"repeat": segment_and_repeat(np.random.default_rng(1234), n, L),
            "shuffled": segment_and_repeat(np.random.default_rng(1234), n, L, shuffle_repeat=True),
            "runs": alphabet_runs(np.random.default_rng(5), n, L)}


def letters_copied(params, text, max_len=32):
    """Prompt with `text` written twice and continue greedily up to max_len letters: how many new
    letters continue the cycle before the first slip."""
    prompt = np.array([LETTERS.index(c) for c in text] * 2)
    written = mnp.generate_greedy(lambda t: mnp.decoder_only_transformer(t, **params)[0], prompt,
                                  max_len - len(prompt), max_len=max_len)[len(prompt):]
    right = written == np.resize(prompt[:len(text)], len(written))  # the cycle, continued
    return int(np.argmin(right)) if not right.all() else len(written)


def read_model(params, L=12):
    """What chapter 11 measures on a model (float64 parameters), on `held_out_sequences`: losses,
    the heads' scores, the knock-outs, copying alphabet runs and continuing the PROMPTS."""
    held_out = held_out_sequences(L=L)
    tokens, shuffled = held_out["repeat"], held_out["shuffled"]
    per_position, runs = next_token_losses(params, tokens), next_token_losses(params, held_out["runs"])
    _, weights = mnp.decoder_only_transformer(tokens, **params)  # (n_layers, B, h, T, T)
    _, shuffled_weights = mnp.decoder_only_transformer(shuffled, **params)
    previous, knocked = previous_token_scores(weights, L), knock_out_losses(params, tokens, L)
    block_2_off = np.ones(knocked.shape, dtype=bool)
    block_2_off[1] = False
    return {"first_loss": per_position[:, :L - 1].mean(), "repeat_loss": per_position[:, L:].mean(),
            "previous": previous, "previous_whole": previous_token_scores(weights, L, whole_sequence=True),
            "induction": induction_scores(weights, L), "induction_shuffled": induction_scores(shuffled_weights, L),
            "after_copy_shuffled": after_copy_weights(shuffled_weights, shuffled, L),
            "knocked": knocked, "previous_head_knocked": knocked[0, previous[0].argmax()],
            "block_2_off": repeat_loss(params, tokens, L, block_2_off),
            "runs_first_loss": runs[:, :L - 1].mean(), "runs_repeat_loss": runs[:, L:].mean(),
            "copied": [letters_copied(params, text) for text in PROMPTS]}


@contextmanager
def one_thread():
    """torch on one thread inside the block (the same sums in the same order on every run; tiny models
    run fastest so), as many threads as before after it. The course's one such helper: the training
    tools, the benchmarks and the tests use it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@seeds.sweep("ch11_knockouts", seeds=range(10), tolerance=0.25, held_out=(101,))
def knock_outs_over_seeds(seed):
    """One row of chapter 11's table: the model of `seed`, trained like the shipped one (seed 0 is the
    shipped model), read by `read_model` after LIVE_STEPS (keys "live_...") and SHIPPED_STEPS, and its
    training curve, the mean loss over each 50 steps."""
    kept = {}

    def keep_live(step, model):
        if step == LIVE_STEPS:
            kept["live"] = copy.deepcopy(model).double().numpy_params()

    with one_thread():
        model, losses = train_induction(InductionConfig(), SHIPPED_STEPS, seed=seed, progress=False,
                                        on_step=keep_live)
    row = read_model(model.double().numpy_params())
    row.update({f"live_{key}": value for key, value in read_model(kept["live"]).items()})
    return {**row, "curve": np.mean(np.reshape(losses, (-1, 50)), axis=1)}
