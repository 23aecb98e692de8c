"""Chapter 11 in NumPy: a decoder-only Transformer, its loss, its warm-up, and greedy generation.

The model is a small GPT built from the course's own parts: a token embedding (a
lookup table), learned positions (`add_positions`), a stack of pre-norm blocks whose
self-attention is causal (chapter 6's `encoder_block` with causal=True, which applies
chapter 5's causal mask), a final LayerNorm, and a linear output head that gives one
logit per token of the vocabulary. `mha.torch.DecoderOnlyTransformer` is its trainable
twin; its `numpy_params()` are this module's parameters.
"""

import math
import numbers

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array
from mha.numpy.blocks import encoder_block, layer_norm
from mha.numpy.positions import add_positions


def check_id_dtype(name, ids):
    """Token ids must be integers (not booleans); their values are not read. Returns them as an array."""
    ids = np.asarray(ids)
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    return ids


def check_ids(name, ids, vocab_size):
    """Token ids: integers, each in 0 .. vocab_size - 1 (any shape; vocab_size=None: any id >= 0).
    Returns them as an array."""
    ids = check_id_dtype(name, ids)
    if ids.size and ids.min() < 0:
        raise ValueError(f"{name} holds the id {ids.min()}, but token ids start at 0")
    if ids.size and vocab_size is not None and ids.max() >= vocab_size:
        raise ValueError(f"{name} holds the id {ids.max()}, but the vocabulary has ids 0 .. {vocab_size - 1} only")
    return ids


def check_tokens(tokens, vocab_size, max_len=None, name="tokens"):
    """Sequences of token ids, shape (..., T) with 1 <= T (<= max_len when given), each id in
    0 .. vocab_size - 1. Returns them as an array."""
    tokens = check_ids(name, tokens, vocab_size)
    validate.check_ndim(name, tokens, 1)
    validate.check_sequence_length(name, tokens.shape, max_len)
    return tokens


def check_prompt(prompt):
    """A prompt to continue: integer ids of shape (..., T_0), T_0 >= 1, as an array. Its ids are
    not read here: the model reads them, and checks them against its vocabulary, once."""
    prompt = check_id_dtype("prompt", prompt)
    validate.check_ndim("prompt", prompt, 1)
    validate.check_sequence_length("prompt", prompt.shape)
    return prompt


def decoder_only_transformer(tokens, *, embedding, position_table, layers, gamma, beta, W_out, b_out=None,
                             n_heads, activation="gelu", eps=1e-5, head_mask=None):
    """Logits for the next token at every position of `tokens`.

    tokens: (..., T) integer ids; embedding: (V, d); position_table: (max_len, d); layers: one
    dict of `encoder_block` parameters per block; gamma, beta: the final LayerNorm; W_out: (d, V).
    head_mask: None, or booleans (n_layers, h), False switching a head off (its output is zero).
    Returns logits (..., T, V) and the attention weights of every block, (n_layers, ..., h, T, T).
    """
    embedding = as_float_array("embedding", embedding)
    validate.check_matrix("embedding", embedding)
    tokens = check_tokens(tokens, embedding.shape[0], len(position_table))
    X = add_positions(embedding[tokens], position_table)  # (..., T, d)
    head_mask = check_head_mask(head_mask, len(layers), n_heads)
    all_weights = []
    for i, params in enumerate(layers):
        mask = None if head_mask is None else head_mask[i][:, None, None]  # (h, 1, 1): False = head off
        X, weights = encoder_block(X, n_heads, mask=mask, causal=True, norm_first=True, eps=eps,
                                   activation=activation, **params)
        all_weights.append(weights)  # (..., h, T, T)
    logits = layer_norm(X, gamma, beta, eps) @ W_out  # (..., T, V)
    return (logits if b_out is None else logits + b_out), np.stack(all_weights)


def check_head_mask(head_mask, n_layers, n_heads):
    """None, or a boolean array of shape (n_layers, n_heads)."""
    if head_mask is None:
        return None
    head_mask = np.asarray(head_mask)
    if head_mask.dtype != bool or head_mask.shape != (n_layers, n_heads):
        raise ValueError(f"head_mask must be booleans of shape (n_layers, n_heads) = ({n_layers}, {n_heads}), "
                         f"got dtype {head_mask.dtype} and shape {validate.shape_str(head_mask.shape)}")
    return head_mask


def log_softmax(x, axis=-1):
    """log(softmax(x)) along `axis`, computed as x - max - log(sum(exp(x - max))): no overflow, no log(0)."""
    x = as_float_array("x", x)
    shifted = x - x.max(axis=axis, keepdims=True)  # the largest entry becomes 0
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def cross_entropy(logits, targets, *, reduction="mean"):
    """-log softmax(logits)[target] for every position: logits (..., V), targets (...) ids in 0 .. V - 1.

    reduction="mean" averages over every position (as torch.nn.functional.cross_entropy),
    "none" returns the loss of each position, shape (...).
    """
    logits = as_float_array("logits", logits)
    validate.check_ndim("logits", logits, 1)
    targets = check_ids("targets", targets, logits.shape[-1])
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {validate.shape_str(logits.shape[:-1])} (the logits' without "
                         f"the vocabulary axis), got {validate.shape_str(targets.shape)}")
    if reduction not in ("mean", "none"):
        raise ValueError(f'reduction must be "mean" or "none", got {reduction!r}')
    picked = np.take_along_axis(log_softmax(logits), targets[..., None], axis=-1)[..., 0]  # (...)
    return -picked.mean() if reduction == "mean" else -picked


def causal_lm_loss(logits, tokens):
    """The loss of a language model: the logits at position t are scored against token t + 1.

    logits: (..., T, V), tokens: (..., T). The last position has no next token and the first
    token is never predicted, so T - 1 predictions are averaged, over every sequence.
    """
    logits = as_float_array("logits", logits)
    validate.check_ndim("logits", logits, 2)
    if np.shape(tokens) != logits.shape[:-1] or logits.shape[-2] < 2:
        raise ValueError(f"tokens must have shape (..., T) = {validate.shape_str(logits.shape[:-1])} with T >= 2, "
                         f"got {validate.shape_str(np.shape(tokens))}")
    return cross_entropy(logits[..., :-1, :], np.asarray(tokens)[..., 1:])  # predict t + 1 from 0 .. t


def warmup_factor(step, warmup_steps):
    """Vaswani et al.'s learning-rate schedule, divided by its peak: it rises linearly for
    `warmup_steps` steps, reaches 1, then decays like 1 / sqrt(step).

    `step` counts the optimizer steps already taken (0 for the first); with s = step + 1,
    the factor is min(s / warmup_steps, sqrt(warmup_steps / s)).
    """
    step = validate.check_int("step", step, minimum=0)
    warmup_steps = validate.check_int("warmup_steps", warmup_steps)
    s = step + 1
    return min(s / warmup_steps, math.sqrt(warmup_steps / s))


def generate_greedy(logits_fn, prompt, n_new, *, max_len=None):
    """Continue `prompt` by `n_new` tokens, each the most likely next token given all before it.

    logits_fn(tokens (..., T)) -> logits (..., T, V); prompt: (..., T_0) integer ids. With
    `max_len`, the model sees at most the last max_len tokens. Returns (..., T_0 + n_new):
    the prompt, then the new tokens.
    """
    tokens = check_prompt(prompt)  # (..., T_0): its form; logits_fn judges its ids
    n_new = validate.check_int("n_new", n_new, minimum=0)
    for _ in range(n_new):
        context = tokens if max_len is None else tokens[..., -max_len:]  # (..., T)
        logits = np.asarray(logits_fn(context))  # (..., T, V)
        if logits.shape[:-1] != context.shape:
            raise ValueError(f"logits_fn must return logits of shape (..., T, V) = (*{context.shape}, V), "
                             f"got shape {validate.shape_str(logits.shape)}")
        next_token = logits[..., -1, :].argmax(axis=-1)  # (...): the last position predicts the next token
        tokens = np.concatenate([tokens, next_token[..., None].astype(tokens.dtype)], axis=-1)
    return tokens


def loss_to_bits_per_character(mean_loss, n_tokens, n_characters):
    """Bits per character of a model whose mean cross-entropy is `mean_loss` nats per token, over `n_tokens`
    tokens that spell `n_characters` characters: mean_loss * n_tokens / n_characters / ln 2.

    mean_loss * n_tokens is the whole text's cost in nats; per character, and in bits (1 bit = ln 2 nats),
    it can be set beside a compressor's bits per character, whatever the tokenizer."""
    if isinstance(mean_loss, bool) or not isinstance(mean_loss, numbers.Real) or not 0 <= mean_loss < math.inf:
        raise ValueError(f"mean_loss must be a number >= 0 (nats per token), got {mean_loss!r}")
    for name, count in (("n_tokens", n_tokens), ("n_characters", n_characters)):
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {count!r}")
    return float(mean_loss) * int(n_tokens) / int(n_characters) / math.log(2)
