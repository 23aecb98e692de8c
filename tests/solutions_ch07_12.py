"""Right solutions of chapters 7 to 12 written from scratch, for the tests of their checks
(tests/test_checks_traps_ch07_12.py, test_checks_cases_ch07_12.py, test_checks_routes_ch07_12.py, and the
gathering of right solutions in tests/learners.py), and what those tests share: the decoder block and the
step of generation built from a given attention or softmax, and the reading of a failure's hint."""

import numpy as np

from learners import FROM_SCRATCH as CHAPTER_12_FROM_SCRATCH
from learners import SEEDS, failures_on_every_seed

import mha.numpy as mnp
from mha.checks import registry

CHAPTERS_7_TO_12 = ["attention_at_offset", "chunked_attention", "decoder_block", "sinusoidal_positions",
                    "alibi_bias", "causal_lm_loss", "generate_greedy", "repeat_kv", "apply_rotary",
                    "attend_with_cache", "kv_cache_bytes"]


def failures_on_every_seed_hinted_on_the_first(name, fn, monkeypatch):
    """As failures_on_every_seed, but the hint is looked for on seed 0 only: a named case fails the same way on
    every seed (the random cases come after it), and matching the mistakes on a large case takes a second."""
    first = failures_on_every_seed(name, fn, seeds=SEEDS[:1])
    with monkeypatch.context() as quick:
        quick.setattr(registry, "matching_hint", lambda *args: None)
        return first + failures_on_every_seed(name, fn, seeds=SEEDS[1:])


# Right solutions written from scratch: NumPy only (or the library functions the text permits), float32
# kept float32 (a Python float, d ** 0.5, never np.sqrt's float64 scalar) -----------------------------


def attention_at_offset(weights, offset):
    A = np.asarray(weights)  # (..., T_q, T_k)
    T_q, T_k = A.shape[-2:]
    rows = [i for i in range(T_q) if 0 <= i + offset < T_k]
    return sum(A[..., i, i + offset] for i in rows) / len(rows)  # (...)


def chunked_attention(Q, K, V, mask=None, chunk=256):
    return attention_in_chunks(Q / Q.shape[-1] ** 0.5, K, V, mask, chunk)


def attention_in_chunks(q, K, V, mask, chunk):
    """softmax(q K^T) V for queries q (..., T_q, d_k) already divided by sqrt(d_k), keys `chunk` at a time: a
    running maximum, sum and output per query, of shapes (..., T_q), (..., T_q) and (..., T_q, d_v)."""
    lead = np.broadcast_shapes(q.shape[:-2], K.shape[:-2], V.shape[:-2])
    T_q, T_k = q.shape[-2], K.shape[-2]
    allowed = None if mask is None else np.broadcast_to(mask, lead + (T_q, T_k))  # a view
    dtype = np.result_type(q, K, V)
    top, total = np.full(lead + (T_q,), -np.inf, dtype), np.zeros(lead + (T_q,), dtype)
    out = np.zeros(lead + (T_q, V.shape[-1]), dtype)
    for lo in range(0, T_k, chunk):
        s = np.einsum("...qd,...kd->...qk", q, K[..., lo:lo + chunk, :])  # (..., T_q, c)
        if allowed is not None:
            s = np.where(allowed[..., lo:lo + chunk], s, -np.inf)
        new_top = np.maximum(top, s.max(axis=-1))
        shift = np.where(np.isfinite(new_top), new_top, 0)  # nothing allowed yet: subtract 0
        decay = np.exp(top - shift)
        e = np.exp(s - shift[..., None])
        total = decay * total + e.sum(axis=-1)
        out = decay[..., None] * out + np.einsum("...qk,...kd->...qd", e, V[..., lo:lo + chunk, :])
        top = new_top
    return out / np.where(total > 0, total, 1)[..., None]


ATTENTION_NAMES = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


def decoder_block_with(attention, *, causal_pattern=None):
    """A decoder block that attends with `attention` (mnp.multihead_attention's signature) and builds its causal
    mask with `causal_pattern(T)` (by default, by comparing positions, as the text asks)."""
    def block(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False, norm_first=False, eps=1e-5,
              activation="relu", **params):
        if causal:
            T = X.shape[-2]
            earlier = np.arange(T) <= np.arange(T)[:, None] if causal_pattern is None else causal_pattern(T)
            self_mask = earlier if self_mask is None else self_mask & earlier
        weights = []

        def attend(part, x, context, mask):
            out, w = attention(x, n_heads=n_heads, context=context, mask=mask,
                               **{k: params.get(f"{part}_{k}") for k in ATTENTION_NAMES})
            weights.append(w)
            return out

        sublayers = [lambda x: attend("self", x, None, self_mask), lambda x: attend("cross", x, memory, memory_mask),
                     lambda x: mnp.feed_forward(x, params["W_1"], params.get("b_1"), params["W_2"], params.get("b_2"),
                                                activation)]
        for i, sublayer in enumerate(sublayers, start=1):
            norm = lambda x: mnp.layer_norm(x, params[f"gamma_{i}"], params.get(f"beta_{i}"), eps)  # noqa: E731
            X = X + sublayer(norm(X)) if norm_first else norm(X + sublayer(X))
        return X, (weights[0], weights[1])
    block.__name__ = f"decoder_block_{attention.__name__}"
    return block


decoder_block = decoder_block_with(mnp.multihead_attention)


def sinusoidal_positions(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    angles = np.arange(offset, offset + T, dtype=np.float64)[:, None] / base ** (np.arange(0, d_model, 2) / d_model)
    table = np.empty((T, d_model))  # float64, converted once at the end
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table.astype(dtype)


def alibi_bias(T_q, T_k, slopes):
    slopes = np.asarray(slopes)  # a list or an array
    slopes = slopes if np.issubdtype(slopes.dtype, np.floating) else slopes.astype(np.float64)
    distance = np.abs(np.arange(T_k - T_q, T_k)[:, None] - np.arange(T_k))  # (T_q, T_k)
    return -slopes[:, None, None] * distance.astype(slopes.dtype)


def causal_lm_loss(logits, tokens):
    z, targets = np.asarray(logits)[..., :-1, :], np.asarray(tokens)[..., 1:]
    top = z.max(axis=-1, keepdims=True)
    log_p = z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_p, targets[..., None], axis=-1).mean()


def generate_greedy(logits_fn, prompt, n_new, *, max_len=None):
    tokens = np.asarray(prompt)
    for _ in range(n_new):
        seen = tokens if max_len is None else tokens[..., -max_len:]
        chosen = np.asarray(logits_fn(seen))[..., -1, :].argmax(axis=-1)
        tokens = np.concatenate([tokens, chosen[..., None].astype(tokens.dtype)], axis=-1)
    return tokens


FROM_SCRATCH = {f.__name__: f for f in (attention_at_offset, chunked_attention, sinusoidal_positions, alibi_bias,
                                          causal_lm_loss, generate_greedy)}
FROM_SCRATCH["decoder_block"] = decoder_block
FROM_SCRATCH.update(CHAPTER_12_FROM_SCRATCH)  # repeat_kv, apply_rotary, attend_with_cache, kv_cache_bytes


# One step of generation with the rotary tables and the softmax given: the permitted way (the defaults) and
# the wrong ones.


def cache_step_with(*, table_dtype=None, softmax_rows=None):
    """One step of generation from mnp's permitted functions, with the rotary tables in `table_dtype` (None:
    the inputs' float type, as the text asks) and the softmax `softmax_rows` (None: mnp's attention)."""
    def step(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None, rope_base=None):
        T_past = 0 if past_keys is None else past_keys.shape[-2]
        T_new, d = q.shape[-2:]
        if rope_base is not None:
            dtype = table_dtype or (np.float64 if q.dtype == np.float64 else np.float32)
            cos, sin = mnp.rotary_embedding(T_new, d, rope_base, offset=T_past, dtype=dtype)
            q, k = mnp.apply_rotary(q, cos, sin), mnp.apply_rotary(k, cos, sin)
        keys = k if past_keys is None else np.concatenate([past_keys, k], axis=-2)
        values = v if past_values is None else np.concatenate([past_values, v], axis=-2)
        if causal:
            earlier = np.arange(T_past + T_new) <= T_past + np.arange(T_new)[:, None]
            mask = earlier if mask is None else mask & earlier
        n_rep = q.shape[-3] // keys.shape[-3]
        K, V = mnp.repeat_kv(keys, n_rep), mnp.repeat_kv(values, n_rep)
        if softmax_rows is None:
            out, w = mnp.scaled_dot_product_attention(q, K, V, mask)
        else:
            w = softmax_rows(q @ np.swapaxes(K, -1, -2) / d ** 0.5, True if mask is None else mask)
            out = w @ V
        return out, w, keys, values
    step.__name__ = f"cache_step_{getattr(table_dtype, '__name__', 'tables')}_{getattr(softmax_rows, '__name__', '')}"
    return step
