"""The key-value cache of generation, the PyTorch face of `mha.numpy.cache`.

Pass one `KVCache()` per attention layer as `cache=` to `GroupedQueryAttention`:
each call appends its new keys and values (after RoPE) and attends to all of them.
"""

import torch

from mha import validate
from mha.torch.tensors import check_is_tensor


class KVCache:
    """Keys and values (..., h_kv, T_cached, d_head) of one attention layer, grown by `append`.

    `len(cache)` is the number of positions it holds. `cache.position` is the next token's
    position: the same, unless `keep_last` (a sliding window's cache) dropped the oldest.
    The first `append` fixes the batch shape, the number of key/value heads, d_head,
    the dtype and the device; a later one that differs is a ValueError naming both.
    """

    def __init__(self):
        self.keys = None  # (..., h_kv, T_cached, d_head), or None while empty
        self.values = None  # (..., h_kv, T_cached, d_v)
        self.dropped = 0  # positions seen and no longer held (keep_last)

    def __len__(self):
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def position(self):
        """The position of the next token: every position appended so far, held or dropped."""
        return self.dropped + len(self)

    def keep_last(self, n):
        """Hold only the last n positions (a sliding window of n + 1 needs no more for the next token)."""
        n = validate.check_int("n", n, minimum=0)
        drop = max(len(self) - n, 0)
        if drop:
            self.keys, self.values = self.keys[..., drop:, :], self.values[..., drop:, :]  # (..., h_kv, n, d)
            self.dropped += drop

    @property
    def nbytes(self):
        """The bytes the cache holds: its keys and values (0 while empty)."""
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def __repr__(self):
        shape = "empty" if self.keys is None else f"keys {validate.shape_str(self.keys.shape)}"
        return f"{type(self).__name__}({shape})"

    def append(self, k, v):
        """Add the new keys k and values v, (..., h_kv, T_new, d), after the cached ones;
        returns all keys and values, (..., h_kv, T_cached + T_new, d)."""
        check_is_tensor("k", k)
        check_is_tensor("v", v)
        if not self.fits(k, v):
            validate.check_cache_entries(self.keys, self.values, k, v)  # the full checks, naming what differs
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            if k.device != self.keys.device:
                raise ValueError(f"the cache is on {self.keys.device} but the new keys are on {k.device}")
            self.keys = torch.cat([self.keys, k], dim=-2)  # (..., h_kv, T_cached + T_new, d)
            self.values = torch.cat([self.values, v], dim=-2)
        return self.keys, self.values

    def fits(self, k, v):
        """Whether new keys and values fit the cached ones, tested with a few comparisons (the
        question asked once per layer and token); `validate.check_cache_entries` says why not."""
        keys, values = self.keys, self.values
        return keys is not None and k.dim() >= 3 and k.shape[:-1] == v.shape[:-1] and \
            keys.shape[:-2] == k.shape[:-2] and keys.shape[-1] == k.shape[-1] and \
            values.shape[-1] == v.shape[-1] and k.dtype == keys.dtype and v.dtype == values.dtype


def kv_cache_bytes(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    """The memory a key-value cache holds: keys and values (2) for every layer, key/value head,
    feature and position of every sequence, at `bytes_per_value` each (2 for float16 or bfloat16).

    Llama 2 7B (32 layers, 32 heads of width 128) at T = 8192 in float16: 4 GiB per sequence.
    """
    sizes = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "d_head": d_head, "T": T, "batch": batch,
             "bytes_per_value": bytes_per_value}
    sizes = {name: validate.check_int(name, value, minimum=0 if name == "T" else 1) for name, value in sizes.items()}
    return 2 * sizes["n_layers"] * sizes["n_kv_heads"] * sizes["d_head"] * sizes["T"] * sizes["batch"] \
        * sizes["bytes_per_value"]



def cache_bytes(caches):
    """The bytes held by a model's caches: a list as `TransformerLM.new_cache()` makes it (after a forward
    filled it), or one layer's cache. Each distinct cache is counted once (layers sharing keys and values hold
    their source's cache, the same object) and None (no cache) counts 0; each cache says its own `nbytes`
    (KVCache: keys and values; LatentCache: latents and rotary keys; a linear layer's StateCache: its recurrent
    state and its convolution's last inputs, the same bytes whatever T, beside the KV caches that grow).

    Bytes per token: cache_bytes(cache) / (batch * T) after a forward of T tokens; a sliding window's cache
    holds at most window - 1 positions, so there it is per held position, not per token seen."""
    if caches is None or hasattr(caches, "nbytes"):
        return 0 if caches is None else int(caches.nbytes)
    if not isinstance(caches, (list, tuple)):
        raise TypeError(f"caches must be a cache or a list of caches (model.new_cache()), got {type(caches).__name__}")
    distinct = {id(c): c for c in caches if c is not None}
    for c in distinct.values():
        if not hasattr(c, "nbytes"):
            raise TypeError(f"every cache must say its nbytes (a KVCache or a LatentCache), got {type(c).__name__}")
    return sum(int(c.nbytes) for c in distinct.values())
