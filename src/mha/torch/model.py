"""Chapter 11 in PyTorch: a decoder-only Transformer to train, its loss, its warm-up, and greedy generation.

`DecoderOnlyTransformer` is a small GPT made of the course's own modules: a token
embedding, `LearnedPositions`, a stack of pre-norm `EncoderBlock`s whose self-attention
is causal, a final LayerNorm and a linear output head. Its `numpy_params()` feed
`mha.numpy.decoder_only_transformer`, which computes the same logits. The loss, the
learning-rate warm-up and the generation loop have the names of their NumPy twins.
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.attention import linear_bias, linear_weight
from mha.torch.blocks import EncoderBlock
from mha.torch.positions import LearnedPositions
from mha.torch.tensors import check_is_tensor


def check_id_dtype(name, ids):
    """Token ids must be an integer tensor (not booleans); their values are not read."""
    check_is_tensor(name, ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be integer token ids, got dtype {ids.dtype}")


def check_ids(name, ids, vocab_size):
    """Token ids: an integer tensor, each id in 0 .. vocab_size - 1 (vocab_size=None: any id >= 0)."""
    check_id_dtype(name, ids)
    if ids.numel() and not ids.is_meta:  # a meta tensor has no values to read
        low, high = int(ids.min()), int(ids.max())
        if low < 0:
            raise ValueError(f"{name} holds the id {low}, but token ids start at 0")
        if vocab_size is not None and high >= vocab_size:
            raise ValueError(f"{name} holds the id {high}, but the vocabulary has ids 0 .. {vocab_size - 1} only")


def check_tokens(tokens, vocab_size, max_len=None, name="tokens"):
    """Sequences of token ids, shape (..., T) with 1 <= T (<= max_len when given)."""
    check_ids(name, tokens, vocab_size)
    validate.check_ndim(name, tokens, 1)
    validate.check_sequence_length(name, tokens.shape, max_len)


def check_prompt(prompt):
    """A prompt to continue: integer ids of shape (..., T_0), T_0 >= 1. Its ids are not read
    here: the model reads them, and checks them against its vocabulary, once."""
    check_id_dtype("prompt", prompt)
    validate.check_ndim("prompt", prompt, 1)
    validate.check_sequence_length("prompt", prompt.shape)


class DecoderOnlyTransformer(nn.Module):
    """Token embedding, learned positions, n_layers pre-norm blocks with causal self-attention,
    a final LayerNorm and a linear head: tokens (..., T) -> logits (..., T, vocab_size).

    `dropout` is that of every block (attention weights, sublayer outputs, the feed-forward's hidden layer).
    """

    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff, max_len, *, dropout=0.0, activation="gelu",
                 eps=1e-5, device=None, dtype=None):
        super().__init__()
        options = dict(device=device, dtype=dtype)
        self.vocab_size = validate.check_int("vocab_size", vocab_size)
        self.n_heads, self.activation, self.eps = n_heads, activation, eps
        self.embedding = nn.Embedding(vocab_size, d_model, **options)
        self.positions = LearnedPositions(max_len, d_model, **options)
        self.blocks = nn.ModuleList(
            EncoderBlock(d_model, n_heads, d_ff, dropout=dropout, norm_first=True, eps=eps, activation=activation,
                         **options)
            for _ in range(validate.check_int("n_layers", n_layers)))
        self.norm = nn.LayerNorm(d_model, eps=eps, **options)
        self.output = nn.Linear(d_model, vocab_size, **options)

    def forward(self, tokens, return_weights=False, *, head_mask=None):
        """tokens: (..., T) integer ids. head_mask: None, or booleans (n_layers, h) on the tokens' device,
        False switching a head off. Returns logits (..., T, V), and with return_weights=True also the
        attention weights of every block, (n_layers, ..., h, T, T)."""
        check_tokens(tokens, self.vocab_size, self.positions.max_len)
        x = self.positions(self.embedding(tokens))  # (..., T, d_model)
        if head_mask is not None:
            check_head_mask(head_mask, len(self.blocks), self.n_heads, tokens)
        all_weights = []
        for i, block in enumerate(self.blocks):
            mask = None if head_mask is None else head_mask[i][:, None, None]  # (h, 1, 1): False = head off
            out = block(x, mask, return_weights=return_weights, causal=True)  # causal self-attention
            x, weights = out if return_weights else (out, None)
            all_weights.append(weights)  # (..., h, T, T)
        logits = self.output(self.norm(x))  # (..., T, V)
        return (logits, torch.stack(all_weights)) if return_weights else logits

    def numpy_params(self):
        """The keyword arguments of `mha.numpy.decoder_only_transformer`, weights in the row-vector convention."""
        return {"embedding": self.embedding.weight.detach().cpu().numpy(),
                "position_table": self.positions.numpy_params()["table"],
                "layers": [block.numpy_params() for block in self.blocks],
                "gamma": self.norm.weight.detach().cpu().numpy(), "beta": linear_bias(self.norm),
                "W_out": linear_weight(self.output), "b_out": linear_bias(self.output),
                "n_heads": self.n_heads, "activation": self.activation, "eps": self.eps}


def check_head_mask(head_mask, n_layers, n_heads, tokens):
    """A boolean tensor of shape (n_layers, n_heads) on the tokens' device."""
    check_is_tensor("head_mask", head_mask)
    if head_mask.dtype != torch.bool or tuple(head_mask.shape) != (n_layers, n_heads):
        raise ValueError(f"head_mask must be booleans of shape (n_layers, n_heads) = ({n_layers}, {n_heads}), "
                         f"got dtype {head_mask.dtype} and shape {validate.shape_str(head_mask.shape)}")
    if head_mask.device != tokens.device:
        raise ValueError(f"head_mask is on {head_mask.device}, tokens on {tokens.device}: move one with .to()")


def cross_entropy(logits, targets, *, reduction="mean"):
    """-log softmax(logits)[target] for every position: logits (..., V), targets (...) integer ids.

    reduction="mean" averages over every position, "none" returns the loss of each, shape (...).
    """
    check_is_tensor("logits", logits)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    validate.check_ndim("logits", logits, 1)
    check_ids("targets", targets, logits.shape[-1])
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {validate.shape_str(logits.shape[:-1])} (the logits' without "
                         f"the vocabulary axis), got {validate.shape_str(targets.shape)}")
    if reduction not in ("mean", "none"):
        raise ValueError(f'reduction must be "mean" or "none", got {reduction!r}')
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)
    return losses if reduction == "mean" else losses.reshape(targets.shape)  # (...)


def causal_lm_loss(logits, tokens):
    """The loss of a language model: the logits at position t against token t + 1, averaged.

    logits: (..., T, V), tokens: (..., T) with T >= 2.
    """
    check_is_tensor("logits", logits)
    validate.check_ndim("logits", logits, 2)
    if tuple(tokens.shape) != tuple(logits.shape[:-1]) or logits.shape[-2] < 2:
        raise ValueError(f"tokens must have shape (..., T) = {validate.shape_str(logits.shape[:-1])} with T >= 2, "
                         f"got {validate.shape_str(tokens.shape)}")
    return cross_entropy(logits[..., :-1, :], tokens[..., 1:])  # predict t + 1 from 0 .. t


def warmup_factor(step, warmup_steps):
    """Vaswani et al.'s schedule divided by its peak: min(s / warmup_steps, sqrt(warmup_steps / s)),
    s = step + 1, with `step` the optimizer steps already taken (as `mha.numpy.warmup_factor`)."""
    step = validate.check_int("step", step, minimum=0)
    warmup_steps = validate.check_int("warmup_steps", warmup_steps)
    s = step + 1
    return min(s / warmup_steps, math.sqrt(warmup_steps / s))


def warmup_schedule(optimizer, warmup_steps):
    """A scheduler that sets the learning rate to (the optimizer's lr) * warmup_factor(step, warmup_steps);
    call its .step() after each optimizer.step()."""
    validate.check_int("warmup_steps", warmup_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(warmup_factor, warmup_steps=warmup_steps))


@torch.no_grad()
def generate_greedy(logits_fn, prompt, n_new, *, max_len=None):
    """Continue `prompt` (..., T_0) by `n_new` tokens, each the argmax of logits_fn's last position;
    the model sees at most the last `max_len` tokens. Returns (..., T_0 + n_new)."""
    check_prompt(prompt)  # its form; logits_fn judges its ids
    n_new = validate.check_int("n_new", n_new, minimum=0)
    tokens = prompt
    for _ in range(n_new):
        context = tokens if max_len is None else tokens[..., -max_len:]  # (..., T)
        logits = logits_fn(context)  # (..., T, V)
        if tuple(logits.shape[:-1]) != tuple(context.shape):
            raise ValueError(f"logits_fn must return logits of shape (..., T, V) = (*{tuple(context.shape)}, V), "
                             f"got shape {validate.shape_str(logits.shape)}")
        next_token = logits[..., -1, :].argmax(dim=-1)  # (...): the last position predicts the next token
        tokens = torch.cat([tokens, next_token[..., None].to(tokens.dtype)], dim=-1)
    return tokens
