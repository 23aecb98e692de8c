"""What `TransformerLM.forward` accepts, checked, and the masks each layer gets (chapters 13, 17 and 18).

The tokens, the positions, the padding mask over the cached and new tokens, and the cache: one per layer, a
KVCache (growing with T), a LatentCache (DeepSeek's latents) or a StateCache (a Gated DeltaNet's fixed state,
chapter 18), all at the same position. `layer_mask` gives an attention layer its keys' mask and heads;
`linear_keep` gives a linear-attention layer this call's padding (its padded inputs are zeroed, as
transformers does); `positions_from_mask` derives positions from a left-padded mask, as `generate` does.
"""

from mha import validate
from mha.torch.cache import KVCache
from mha.torch.model import check_ids


def check_lm_tokens(tokens, vocab_size):
    check_ids("tokens", tokens, vocab_size)
    if tokens.ndim != 2 or tokens.shape[-1] < 1:
        raise ValueError(f"tokens must have shape (B, T) with T >= 1, got {validate.shape_str(tokens.shape)}")


def check_cache(cache, n_layers, makers=None):
    """A cache is one cache per layer (a KVCache, LatentCache or StateCache: `is_cache`), all at the same
    position; returns that position (0 without one). An empty list is filled with one empty KVCache per layer.
    makers: the layers that make keys or hold a state (KV sharing; default all): only their caches are read."""
    if cache is None:
        return 0
    if isinstance(cache, list) and not cache:
        cache.extend(KVCache() for _ in range(n_layers))
    makers = range(n_layers) if makers is None else makers
    if not isinstance(cache, (list, tuple)) or len(cache) != n_layers or \
            not all(is_cache(cache[i]) for i in makers):
        found = type(cache).__name__ if not isinstance(cache, (list, tuple)) else \
            f"a list of {len(cache)}: {', '.join(sorted({type(c).__name__ for c in cache}))}"
        raise TypeError(f"cache must be a list of {n_layers} mha.torch.KVCache (or LatentCache, StateCache: "
                        f"model.new_cache()), got {found}")
    positions = {cache[i].position for i in makers}
    if len(positions) != 1:
        raise ValueError(f"the layers' caches are at different positions {sorted(positions)}: use one "
                         f"model.new_cache() per sequence")
    return positions.pop()


def check_positions(position_ids, tokens, max_positions):
    if tuple(position_ids.shape) != tuple(tokens.shape) or position_ids.is_floating_point():
        raise ValueError(f"position_ids must be integers of the tokens' shape {validate.shape_str(tokens.shape)}, "
                         f"got {position_ids.dtype} of shape {validate.shape_str(position_ids.shape)}")
    if max_positions is not None and position_ids.numel() and int(position_ids.max()) >= max_positions:
        raise ValueError(f"position {int(position_ids.max())} is past the learned table's {max_positions} rows")


def check_attention_mask(attention_mask, tokens, start):
    """(B, start + T) of 0 and 1 (or booleans) -> booleans, True for real tokens; None stays None."""
    if attention_mask is None:
        return None
    expected = (*tokens.shape[:-1], start + tokens.shape[-1])
    if tuple(attention_mask.shape) != expected or attention_mask.is_floating_point():
        raise ValueError(f"attention_mask must be 0/1 integers or booleans of shape (B, cached + new tokens) = "
                         f"{expected}, got {attention_mask.dtype} of shape {validate.shape_str(attention_mask.shape)}")
    if attention_mask.device != tokens.device:
        raise ValueError(f"attention_mask is on {attention_mask.device}, tokens on {tokens.device}")
    return attention_mask.bool()


def is_cache(c):
    """A layer's cache: a KVCache, another attention's cache with the same interface (LatentCache: append), or
    a linear layer's state (StateCache: position, dropped, nbytes and reset, no append: it holds a fixed-size
    state, not the tokens)."""
    if isinstance(c, KVCache):
        return True
    held = all(hasattr(c, name) for name in ("position", "dropped", "nbytes"))
    return held and (hasattr(c, "append") or hasattr(c, "reset"))


def layer_mask(keep, cache, head_mask, i, first=None):
    """The mask of layer i: the keys it holds that are real tokens, (B, 1, 1, T_k), and its heads. first: the
    first position held (default: the positions the cache dropped)."""
    mask = None
    if keep is not None:
        if first is None:
            first = 0 if cache is None else cache.dropped  # a window's cache no longer holds the oldest keys
        mask = keep[:, None, None, first:]  # (B, 1, 1, T_k)
    if head_mask is not None:
        heads = head_mask[i][:, None, None]  # (h, 1, 1): False = head off
        mask = heads if mask is None else mask & heads
    return mask


def positions_from_mask(attention_mask):
    """Positions as transformers' generate() derives them: the count of real tokens before each, 0 on padding."""
    positions = attention_mask.long().cumsum(-1) - 1  # (B, T)
    return positions.masked_fill(attention_mask == 0, 0)


def linear_keep(keep, T):
    """A linear-attention layer's padding of this call: keep's last T columns (B, T), True for real tokens, or
    None where nothing is padded; none for a single decoded token (never padding), as transformers gives it."""
    if keep is None or T == 1:
        return None
    keep = keep[:, -T:]  # (B, T)
    return None if bool(keep.all()) else keep
