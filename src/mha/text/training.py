"""Chapter 14: training a `TransformerLM` on text, the way real runs do it.

AdamW with weight decay on the matrices only, a learning rate that warms up linearly and then
decays along a cosine, gradients clipped by their global norm, the validation loss every
`eval_every` steps, a progress bar with the current losses, and checkpoints that resume.

The batches are a function of (seed, step) alone: step s draws its `batch_size` windows from a
generator seeded with (seed, s). So a run resumed from a checkpoint sees the samples it would
have seen, and `world_size` processes under `torchrun` (DistributedDataParallel, each rank
taking its rows of the same global batch) see the samples one process sees.

`python -m mha.text.train` (src/mha/text/train.py) runs it from the command line; the chapter reads what it stored.
"""

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import mha.numpy as mnp
import mha.torch as mt
from mha import validate


@dataclass(frozen=True)
class TrainingConfig:
    """A training run: the model's shape, the data's windows, the optimizer and the schedule.

    context: tokens per training window (T); batch_size: windows per step, over all processes.
    lr: the peak learning rate, reached after warmup_steps; it then follows a cosine down to
    min_lr_ratio * lr at step `steps`. weight_decay: AdamW's, on matrices only (not on norms).
    clip: the largest global gradient norm. eval_every: steps between validation losses,
    over eval_windows windows of the validation text. tokenizer: "char" or "bpe" (byte-level BPE with
    bpe_vocab_size tokens, trained on the training text). init_std: the normal init of every matrix
    (output projections of each sublayer scaled by 1 / sqrt(2 n_layers), as GPT-2 does).
    """

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 344
    rope_base: float = 10000.0
    context: int = 256
    batch_size: int = 32
    steps: int = 2000
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    clip: float = 1.0
    eval_every: int = 100
    eval_windows: int = 32
    init_std: float = 0.02
    seed: int = 0
    checkpoint_every: int = 200
    tokenizer: str = "char"
    bpe_vocab_size: int = 1024

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "context", "batch_size", "steps", "eval_every",
                     "eval_windows", "checkpoint_every"):
            validate.check_int(name, getattr(self, name))
        validate.check_int("warmup_steps", self.warmup_steps, minimum=0)
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer must be 'char' or 'bpe', got {self.tokenizer!r}")
        for name in ("lr", "clip", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def model_config(self, vocab_size):
        """The `LMConfig` of the model: Llama's shape (RMSNorm before each sublayer, RoPE, SwiGLU), tied
        embeddings, no biases."""
        return mt.LMConfig(vocab_size=vocab_size, d_model=self.d_model, n_layers=self.n_layers, d_ff=self.d_ff,
                           attention=dict(n_heads=self.n_heads, rope_base=self.rope_base), norm="rms",
                           norm_eps=1e-5, feed_forward="silu", tie_embeddings=True)


def learning_rate(step, config):
    """The learning rate of step (1-based): linear warm-up to config.lr over warmup_steps, then a cosine
    from lr down to min_lr_ratio * lr at config.steps (and flat after it): mha.numpy.warmup_cosine."""
    return mnp.warmup_cosine(step, peak=config.lr, warmup_steps=config.warmup_steps, total_steps=config.steps,
                             final=config.min_lr_ratio * config.lr)


def new_model(config, vocab_size, *, dtype=None):
    """A `TransformerLM` with the run's initialization, drawn from torch.manual_seed(config.seed)."""
    torch.manual_seed(config.seed)
    model = mt.TransformerLM(config.model_config(vocab_size), dtype=dtype)
    residual_std = config.init_std / math.sqrt(2 * config.n_layers)
    for name, parameter in model.named_parameters():
        if parameter.ndim < 2:
            continue  # norm weights stay at 1
        is_residual_output = name.endswith(("W_o.weight", "W_down.weight"))
        torch.nn.init.normal_(parameter, std=residual_std if is_residual_output else config.init_std)
    return model


def new_optimizer(model, config):
    """AdamW, with weight decay on the matrices and none on the norms' weights."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": matrices, "weight_decay": config.weight_decay}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


def batch_starts(step, n_tokens, config):
    """The start of each window of step `step`: (batch_size,) ints in [0, n_tokens - context - 1],
    drawn from a generator seeded with (seed, step) alone."""
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    return torch.randint(n_tokens - config.context - 1, (config.batch_size,), generator=generator)


def windows(ids, starts, length):
    """ids (N,), starts (B,) -> (B, length) windows ids[s : s + length]."""
    offsets = torch.arange(length)
    return ids[starts[:, None] + offsets]  # (B, length)


def rank_rows(batch, rank, world_size):
    """The rows of a global batch (B, ...) that one of world_size processes computes: B / world_size of them."""
    if len(batch) % world_size:
        raise ValueError(f"batch_size must be divisible by the number of processes ({world_size}), got {len(batch)}")
    share = len(batch) // world_size
    return batch[rank * share:(rank + 1) * share]


def evaluation_windows(ids, config):
    """eval_windows windows (n, context + 1), evenly spaced over ids: the same every time."""
    n = min(config.eval_windows, (len(ids) - 1) // (config.context + 1))
    if n < 1:
        raise ValueError(f"the validation text needs at least {config.context + 1} tokens, got {len(ids)}")
    starts = torch.linspace(0, len(ids) - config.context - 1, n).long()
    return windows(ids, starts, config.context + 1)  # (n, context + 1)


@torch.no_grad()
def mean_loss(model, batch):
    """The mean next-token loss in nats of the windows batch (B, T + 1)."""
    logits = model(batch[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()


@torch.no_grad()
@torch.no_grad()
def text_nats(model, ids, context, *, stride=None, batch_size=16):
    """The total loss in nats of predicting ids[1:] (the first token has no context), each token seen
    with at least context - stride tokens before it (windows of context tokens, stride apart; stride
    defaults to context / 2). With stride 1, every token after the first window is predicted from the
    `context` tokens before it, the longest context the model trained on. The ids go to the model's
    device. Returns (total nats, number of tokens scored)."""
    stride = stride or context // 2
    if not 1 <= stride <= context:
        raise ValueError(f"stride must be in [1, context = {context}], got {stride}")
    device = next(model.parameters()).device
    ids = torch.as_tensor(ids).to(device)
    n = len(ids)
    starts = list(range(0, max(1, n - context), stride))
    total, scored, next_target = 0.0, 0, 1  # next_target: the first position not scored yet
    for i in range(0, len(starts), batch_size):
        chunk = starts[i:i + batch_size]
        batch = torch.stack([ids[s:s + context + 1] for s in chunk]) if n > context else ids[None]  # (b, <= T+1)
        logits = model(batch[:, :-1])  # (b, T, V)
        losses = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # (b, T)
        firsts = []  # for each window, the first of its targets not yet scored
        for s in chunk:
            firsts.append(next_target - (s + 1))
            next_target = s + 1 + losses.shape[1]
        fresh = torch.arange(losses.shape[1], device=device)[None] >= torch.tensor(firsts, device=device)[:, None]
        total += (losses.double() * fresh).sum().item()
        scored += int(fresh.sum().item())
    if next_target < n:  # the tail after the last full window
        tail = ids[max(0, n - context - 1):]
        losses = F.cross_entropy(model(tail[None, :-1])[0], tail[1:], reduction="none")
        new = n - next_target
        total += losses[-new:].double().sum().item()
        scored += new
    return total, scored


def progress_line(step, steps, train_loss, val_loss, seconds, width=24):
    """One line of the progress bar: step, bar, the current train and validation losses, time."""
    done = round(width * step / steps)
    bar = "#" * done + "." * (width - done)
    val = "  -  " if val_loss is None else f"{val_loss:.3f}"
    return f"step {step:{len(str(steps))}d}/{steps} [{bar}] train {train_loss:.3f} val {val} {seconds:6.0f} s"


def distributed_world():
    """(rank, world_size): from torch.distributed when a process group is running, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def global_mean(value, world_size, device="cpu"):
    """The mean of a float over all processes (each computed the mean of an equal share)."""
    if world_size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(tensor)
    return tensor.item() / world_size


def train(config, train_ids, val_ids, vocab_size, *, checkpoint=None, resume=False, stop_at=None,
          progress=True, report_every=50, device=None):
    """Train a new model (or resume one from `checkpoint`) up to step config.steps, or stop_at if given.

    train_ids, val_ids: 1-D int64 tensors. device: where to compute (default the CPU); the model is
    drawn on the CPU first, so every device starts from the same weights. Under torchrun the model
    is wrapped in DistributedDataParallel (give each process its own GPU as `device`) and each rank
    computes its rows of the global batch.
    Returns (model, curve): curve a list of {"step", "lr", "train_loss", "val_loss" (or None)},
    one per step, the losses averaged over all processes. Only rank 0 prints and writes.
    """
    rank, world_size = distributed_world()
    device = torch.device("cpu" if device is None else device)
    model = new_model(config, vocab_size).to(device)
    optimizer = new_optimizer(model, config)
    curve, first_step = [], 1
    if resume and checkpoint is not None and Path(checkpoint).exists():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        curve, first_step = state["curve"], state["step"] + 1
    trained = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    evaluation = evaluation_windows(val_ids, config).to(device)
    last_step = config.steps if stop_at is None else min(stop_at, config.steps)
    start = time.perf_counter()
    for step in range(first_step, last_step + 1):
        lr = learning_rate(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = rank_rows(windows(train_ids, batch_starts(step, len(train_ids), config), config.context + 1),
                          rank, world_size).to(device)  # (B / world_size, context + 1)
        logits = trained(batch[:, :-1])  # (b, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        val_loss = None
        if step % config.eval_every == 0 or step == config.steps:
            val_loss = mean_loss(model, evaluation)  # every process computes the same
        curve.append({"step": step, "lr": lr, "train_loss": global_mean(loss.item(), world_size, device),
                      "val_loss": val_loss})
        if progress and rank == 0 and (step % report_every == 0 or step == last_step):
            print(progress_line(step, config.steps, curve[-1]["train_loss"], last_val_loss(curve),
                                time.perf_counter() - start), flush=True)
        if checkpoint is not None and rank == 0 and (step % config.checkpoint_every == 0 or step == last_step):
            save_checkpoint(checkpoint, model, optimizer, step, curve)
    return model.eval(), curve


def last_val_loss(curve):
    values = [point["val_loss"] for point in curve if point["val_loss"] is not None]
    return values[-1] if values else None


def save_checkpoint(path, model, optimizer, step, curve):
    """Everything a run needs to resume at step + 1 (the batches are a function of the step)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "curve": curve},
               temporary)
    temporary.replace(path)  # never a half-written checkpoint


# Stored models --------------------------------------------------------------------------


def save_model(folder, model, config, tokenizer, curve, results):
    """Write a trained model where the chapter finds it: weights.npz (float32), tokenizer.json and
    run.json (the training config, the loss curve and the measured results)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: value.detach().to(torch.float32).numpy() for name, value in model.state_dict().items()}
    np.savez_compressed(folder / "weights.npz", **weights)
    (folder / "tokenizer.json").write_text(tokenizer.to_json())
    run = {"config": asdict(config), "curve": curve, "results": results}
    (folder / "run.json").write_text(json.dumps(run, indent=1) + "\n")


def load_run(folder):
    """The run.json of a stored model: {"config", "curve", "results"}."""
    return json.loads((Path(folder) / "run.json").read_text())


def load_model(folder, *, dtype=torch.float32):
    """(model in eval mode, TrainingConfig, run) from a folder written by save_model."""
    run = load_run(folder)
    config = TrainingConfig(**{**run["config"], "betas": tuple(run["config"]["betas"])})
    weights = np.load(Path(folder) / "weights.npz")
    vocab_size = weights["embedding.weight"].shape[0]
    model = mt.TransformerLM(config.model_config(vocab_size), dtype=dtype)
    model.load_state_dict({name: torch.from_numpy(weights[name]).to(dtype) for name in weights.files})
    return model.eval(), config, run
