"""The key-value cache of generation: the keys and values of every position seen so far.

Decoding one token at a time, a layer's new query needs the keys and values of all
earlier positions. They do not change once computed (a causal layer never looks
ahead), so the cache keeps them and each step computes only the new ones.
"""

import numpy as np

from mha import validate


class KVCache:
    """Keys and values (..., h_kv, T_cached, d_head) of one attention layer, grown by `append`.

    `len(cache)` is the number of positions it holds. `cache.position` is the next token's
    position: the same, unless `keep_last` (a sliding window's cache) dropped the oldest.
    The first `append` fixes the batch shape, the number of key/value heads, d_head
    and the dtype; a later one that differs is a ValueError naming both.
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

    def __repr__(self):
        shape = "empty" if self.keys is None else f"keys {validate.shape_str(self.keys.shape)}"
        return f"{type(self).__name__}({shape})"

    def append(self, k, v):
        """Add the new keys k and values v, (..., h_kv, T_new, d), after the cached ones;
        returns all keys and values, (..., h_kv, T_cached + T_new, d)."""
        k, v = np.asarray(k), np.asarray(v)
        validate.check_cache_entries(self.keys, self.values, k, v)
        if self.keys is None:
            self.keys, self.values = k.copy(), v.copy()
        else:
            self.keys = np.concatenate([self.keys, k], axis=-2)  # (..., h_kv, T_cached + T_new, d)
            self.values = np.concatenate([self.values, v], axis=-2)
        return self.keys, self.values


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

