"""Sampling the next token (chapter 14): temperature, top-k and top-p filters, and generation that
draws each new token at random from what the filters leave.

`filter_logits` applies the filters as transformers' `generate(do_sample=True)` does with its
TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper: in that order, with the same tie
rules, on the same sort. `generate` draws with `torch.multinomial`, as transformers does, so after
the same `torch.manual_seed` both write the same tokens.
"""

import torch

from mha import validate
from mha.validate import check_p, check_temperature, check_top_k, check_top_p
from mha.torch.model import check_ids, check_prompt
from mha.torch.tensors import check_is_tensor


def check_logits(logits):
    """Floating-point logits of shape (..., V) with V >= 1."""
    check_is_tensor("logits", logits)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {validate.shape_str(logits.shape)}")


def apply_temperature(logits, temperature):
    """z / tau: the logits (..., V) divided by the temperature tau > 0. Returns (..., V)."""
    check_logits(logits)
    return logits / check_temperature(temperature)


def top_k_filter(logits, k):
    """-inf below the k-th largest logit of each row, (..., V) -> (..., V): ties at the k-th value stay,
    and k >= V keeps every token."""
    check_logits(logits)
    k = min(validate.check_int("k", k), logits.shape[-1])
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits, p):
    """-inf on the least likely tokens whose probabilities add up to at most 1 - p, (..., V) -> (..., V).

    What stays is the smallest set of most likely tokens holding at least p of the mass; the most
    likely token always stays. The tokens are sorted with `torch.sort`, as transformers sorts them;
    that sort is not stable, so when equal logits straddle the cut, which of them stay is the sort's
    choice (how many stay is not)."""
    check_logits(logits)
    p = check_p(p)
    ascending, order = torch.sort(logits, dim=-1)  # (..., V): least likely first
    mass_up_to = ascending.softmax(dim=-1).cumsum(dim=-1)  # (..., V): mass of this token and all below
    drop_sorted = mass_up_to <= 1 - p
    drop_sorted[..., -1] = False  # the most likely token always stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # (..., V): back to the ids' order
    return logits.masked_fill(drop, float("-inf"))


def filter_logits(logits, *, temperature=1.0, top_k=None, top_p=None):
    """The logits (..., V) to sample from: `apply_temperature`, then `top_k_filter` (the k largest, and
    any tied with the k-th) and `top_p_filter` (the smallest set of most likely tokens that holds at
    least p of the probability), in transformers' order. top_k=None, top_p=None or 1.0 rule out
    nothing, as transformers' generate skips them. Returns (..., V), in the logits' dtype."""
    check_logits(logits)
    temperature, top_k, top_p = check_temperature(temperature), check_top_k(top_k), check_top_p(top_p)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return logits


def check_generator(generator):
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be None (PyTorch's global generator) or a torch.Generator, "
                        f"got {type(generator).__name__}")


def known_vocab_size(model):
    """The vocabulary size that a TransformerLM or DecoderOnlyTransformer states, else None."""
    config = getattr(model, "config", None)
    return getattr(config, "vocab_size", None) or getattr(model, "vocab_size", None)


def next_logits(model, tokens, new, cache):
    """The logits (B, V) of the token after `tokens` (B, T): from the cache and the `new` tokens
    when there is one (a TransformerLM, its output layer at the last position only), else from all
    the tokens again."""
    logits = model(new, cache=cache, last_only=True) if cache is not None else model(tokens)  # (B, 1 or T, V)
    seen = new[:, -1:] if cache is not None else tokens  # a TransformerLM with a cache: the last position only
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3 or tuple(logits.shape[:2]) != tuple(seen.shape):
        got = validate.shape_str(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"model must return logits of shape (B, T, V) = (*{tuple(seen.shape)}, V), got {got}")
    return logits[:, -1].float()  # (B, V): in float32, as transformers samples


@torch.inference_mode()
def generate(model, prompt, n_new, *, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Continue `prompt` (T_0,) or (B, T_0) by `n_new` tokens, each drawn at random from the
    filtered distribution (`filter_logits`) of the model's last position. Returns (T_0 + n_new,)
    or (B, T_0 + n_new): the prompt, then the new tokens. The B prompts have one length (no padding).

    model: a TransformerLM, which reads the prompt once and then one token per step with its
    cache, or any callable tokens (B, T) -> logits (B, T, V), called on all the tokens at each step.
    generator: None draws from PyTorch's global generator (`torch.manual_seed`), as transformers'
    generate(do_sample=True) does; a torch.Generator makes the draws reproducible on their own.
    """
    check_prompt(prompt)
    validate.check_ndim("prompt", prompt, 1, 2)
    n_new = validate.check_int("n_new", n_new, minimum=0)
    options = dict(temperature=check_temperature(temperature), top_k=check_top_k(top_k), top_p=check_top_p(top_p))
    check_generator(generator)
    check_ids("prompt", prompt, known_vocab_size(model))
    tokens = prompt if prompt.ndim == 2 else prompt[None]  # (B, T_0)
    cache = model.new_cache() if hasattr(model, "new_cache") else None
    new = tokens
    for step in range(n_new):
        logits = next_logits(model, tokens, new, cache)  # (B, V)
        if step == 0:
            check_ids("prompt", prompt, logits.shape[-1])  # a callable's vocabulary is known only now
        probs = filter_logits(logits, **options).softmax(dim=-1)  # (B, V)
        new = torch.multinomial(probs, num_samples=1, generator=generator).to(tokens.dtype)  # (B, 1)
        tokens = torch.cat([tokens, new], dim=-1)  # (B, T_0 + step + 1)
    return tokens if prompt.ndim == 2 else tokens[0]
