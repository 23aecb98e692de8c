"""The traps of chapters 7 to 12 (issue #25, point 4 and part of 2): every wrong solution of the issue, and
more, fails on a fixed named case, on every seed (0..9), with the hint that fits; a float64 answer where the
text promises float32 fails on its dtype; chunked attention that builds the whole array of scores is refused
for its memory. The named cases that hold the traps, and inputs written in place:
tests/test_checks_cases_ch07_12.py; the right solutions and what each exercise may call:
tests/test_checks_routes_ch07_12.py."""

import math

import numpy as np
import pytest

from learners import failures_on_every_seed, hint_of
from solutions_ch07_12 import (attention_in_chunks, cache_step_with, decoder_block_with,
                               failures_on_every_seed_hinted_on_the_first, sinusoidal_positions)


# Wrong solutions, as learners write them ---------------------------------------------------------------


def offset_over_keys(weights, offset):  # the issue: divided by T_k - |offset|
    A = np.asarray(weights)
    T_q, T_k = A.shape[-2:]
    return sum(A[..., i, i + offset] for i in range(T_q) if 0 <= i + offset < T_k) / (T_k - abs(offset))


def offset_wraps_around(weights, offset):
    A = np.asarray(weights)
    T_q, T_k = A.shape[-2:]
    return sum(A[..., i, (i + offset) % T_k] for i in range(T_q)) / T_q


def softmax_no_shift(scores, allowed=True):
    """A learner's softmax that gives a row with nothing to attend to zeros, but subtracts no maximum."""
    allowed = np.broadcast_to(allowed, scores.shape)
    e = np.exp(np.where(allowed, scores, -np.inf))
    return np.where(allowed.any(axis=-1, keepdims=True), e / e.sum(axis=-1, keepdims=True), 0)


def softmax_global_shift(scores, allowed=True):
    """A learner's softmax that subtracts the maximum of ALL the scores, and divides without a guard."""
    allowed = np.broadcast_to(allowed, scores.shape)
    kept = np.where(allowed, scores, -np.inf)
    finite = kept[np.isfinite(kept)]
    e = np.exp(kept - (finite.max() if finite.size else 0))
    return np.where(allowed.any(axis=-1, keepdims=True), e / e.sum(axis=-1, keepdims=True), 0)


def chunked_with(shift):
    """Chunked attention that keeps no running maximum (shift="none") or one for all queries ("global")."""
    def chunked(Q, K, V, mask=None, chunk=256):
        lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
        allowed = None if mask is None else np.broadcast_to(mask, lead + (Q.shape[-2], K.shape[-2]))
        q, top = Q / Q.shape[-1] ** 0.5, -np.inf
        total, out = np.zeros(lead + (Q.shape[-2],)), np.zeros(lead + (Q.shape[-2], V.shape[-1]))
        for lo in range(0, K.shape[-2], chunk):
            s = np.einsum("...qd,...kd->...qk", q, K[..., lo:lo + chunk, :])
            if allowed is not None:
                s = np.where(allowed[..., lo:lo + chunk], s, -np.inf)
            if shift == "none":
                decay, e = 1.0, np.exp(s)
            else:  # one maximum, of every query's scores
                top, old = max(top, s.max()), top
                subtracted = top if np.isfinite(top) else 0.0  # nothing allowed yet: subtract 0
                decay, e = math.exp(old - subtracted), np.exp(s - subtracted)
            total = decay * total + e.sum(axis=-1)
            out = decay * out + np.einsum("...qk,...kd->...qd", e, V[..., lo:lo + chunk, :])
        return np.divide(out, total[..., None], out=np.zeros_like(out), where=total[..., None] > 0)
    chunked.__name__ = f"chunked_max_{shift}"
    return chunked


def chunked_all_scores_at_once(Q, K, V, mask=None, chunk=256):  # right answers, ignoring `chunk`
    s = Q @ np.swapaxes(K, -1, -2) / Q.shape[-1] ** 0.5  # (..., T_q, T_k): the whole array
    s = s if mask is None else np.where(mask, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ V


def chunked_with_a_whole_mask_of_booleans(Q, K, V, mask=None, chunk=256):  # in blocks, but a T_q x T_k mask of bools
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    full = lead + (Q.shape[-2], K.shape[-2])
    allowed = np.ones(full, dtype=bool) if mask is None else np.broadcast_to(mask, full)  # 1 byte per score
    return attention_in_chunks(Q / Q.shape[-1] ** 0.5, K, V, allowed, chunk)


def chunked_mask_indexed_as_given(Q, K, V, mask=None, chunk=256):
    """Blocks the masked scores by boolean indexing with the mask's own block: fine for (..., T_q, T_k)
    masks only; a mask of keys (1, T_k) does not index (T_q, chunk) scores."""
    q, top = Q / Q.shape[-1] ** 0.5, None
    total, out = 0.0, 0.0
    for lo in range(0, K.shape[-2], chunk):
        s = q @ np.swapaxes(K[..., lo:lo + chunk, :], -1, -2)
        if mask is not None:
            s[~mask[..., lo:lo + chunk]] = -np.inf
        new_top = s.max(axis=-1, keepdims=True) if top is None else np.maximum(top, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(new_top), new_top, 0)
        decay = 0.0 if top is None else np.exp(top - shift)
        e = np.exp(s - shift)
        total, out = decay * total + e.sum(axis=-1, keepdims=True), decay * out + e @ V[..., lo:lo + chunk, :]
        top = new_top
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def multihead_with(softmax_rows):
    """mnp.multihead_attention as a learner writes it, with a softmax of their own."""
    def mha(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None, b_q=None, b_k=None, b_v=None, b_o=None):
        source = X if context is None else context

        def heads(A, W, b):  # (..., T, h * d_head) -> (..., h, T, d_head)
            A = A @ W if b is None else A @ W + b
            return np.swapaxes(A.reshape(*A.shape[:-1], n_heads, -1), -3, -2)
        Q, K, V = heads(X, W_q, b_q), heads(source, W_k, b_k), heads(source, W_v, b_v)
        w = softmax_rows(Q @ np.swapaxes(K, -1, -2) / Q.shape[-1] ** 0.5, True if mask is None else mask)
        out = np.swapaxes(w @ V, -3, -2)
        out = out.reshape(*out.shape[:-2], -1) @ W_o
        return (out if b_o is None else out + b_o), w
    mha.__name__ = f"multihead_{softmax_rows.__name__}"
    return mha


def sinusoidal_angles_in_dtype(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    theta = (base ** (-np.arange(0, d_model, 2) / d_model)).astype(dtype)
    angles = np.arange(offset, offset + T, dtype=dtype)[:, None] * theta  # float32 positions times frequencies
    table = np.empty((T, d_model), dtype=dtype)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table


def sinusoidal_always_float64(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    return sinusoidal_positions(T, d_model, base=base, offset=offset)  # `dtype` forgotten


def alibi_of_an_array_only(T_q, T_k, slopes):
    return -slopes[:, None, None] * np.abs(np.arange(T_k - T_q, T_k)[:, None] - np.arange(T_k))  # a list: TypeError


def lm_loss_exp_divide_log(logits, tokens):
    e = np.exp(logits[..., :-1, :])
    log_p = np.log(e / e.sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_p, tokens[..., 1:, None], axis=-1).mean()


def lm_loss_one_maximum(logits, tokens):
    z = logits[..., :-1, :] - logits.max()  # the maximum of every logit of every sequence
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_p, tokens[..., 1:, None], axis=-1).mean()


def kv_bytes_without_layers(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    return 2 * n_kv_heads * d_head * T * batch * bytes_per_value


def kv_bytes_float32_arithmetic(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    return int(np.float32(2) * n_layers * n_kv_heads * d_head * T * batch * bytes_per_value)


def kv_bytes_int32_arithmetic(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    with np.errstate(over="ignore"):
        return int(np.prod([2, n_layers, n_kv_heads, d_head, T, batch, bytes_per_value], dtype=np.int32))


def apply_rotary_in_table_dtype(x, cos, sin):  # float64 tables turn a float32 x into float64
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


# (check, wrong solution, words of the hint it must get or None, the fixed named case it fails on)
TRAPPED = [
    ("attention_at_offset", offset_over_keys, "average over the queries i whose key i + offset exists",
     "more keys than queries"),
    ("attention_at_offset", offset_wraps_around, "do not wrap around", "one head, the previous token"),
    ("chunked_attention", chunked_with("none"), "exp overflows on scores above 709", "scores above 709"),
    ("chunked_attention", chunked_with("global"), "keep one running maximum per query", "scores above 709"),
    ("chunked_attention", chunked_mask_indexed_as_given, None, "one sequence, chunk does not divide T, a mask of keys"),
    ("decoder_block", decoder_block_with(multihead_with(softmax_no_shift)), "softmax overflows on scores above 709",
     "no biases, a source with no real token, self-attention scores above 709"),
    ("decoder_block", decoder_block_with(multihead_with(softmax_global_shift)), "not the maximum of all the scores",
     "no biases, a source with no real token, self-attention scores above 709"),
    ("sinusoidal_positions", sinusoidal_angles_in_dtype, "compute the angles in float64",
     "float32, positions 100000 to 100009"),
    ("alibi_bias", alibi_of_an_array_only, None, "one head, T_q = T_k = 3, the slopes as a Python list"),
    ("causal_lm_loss", lm_loss_exp_divide_log, "log(softmax) computed as exp, divide, then log",
     "a batch of 3 sequences of 5 tokens"),
    ("causal_lm_loss", lm_loss_one_maximum, "subtract each position's own maximum",
     "a batch of 3 sequences of 5 tokens"),
    ("attend_with_cache", cache_step_with(softmax_rows=softmax_no_shift), "exp overflows on scores above 709",
     "3 cached positions, 2 new tokens"),
    ("attend_with_cache", cache_step_with(softmax_rows=softmax_global_shift), "not the maximum of all the scores",
     "3 cached positions, 2 new tokens"),
    ("attend_with_cache", cache_step_with(table_dtype=np.float64), "make the rotary tables in float32",
     "100000 cached positions"),
    ("kv_cache_bytes", kv_bytes_without_layers, "multiply by n_layers", "3 layers"),
    ("kv_cache_bytes", kv_bytes_int32_arithmetic, "int32 wraps around", "3 layers"),
]


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{n}-{fn.__name__}" for n, fn, _, _ in TRAPPED])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case, monkeypatch):
    messages = failures_on_every_seed_hinted_on_the_first(name, fn, monkeypatch)
    if hint:
        assert hint in hint_of(messages[0]), messages[0]
    for message in messages:
        assert f"on the case '{case}" in message, message
        if not hint:
            assert message.startswith(f"{name} raised "), message  # a crash: the case's label says what to do


def test_a_cache_size_counted_in_float32_fails_exactly_on_the_first_named_case():
    """6720201600 has more digits than float32 holds: the total comes back a few bytes off, and whole numbers
    are compared exactly. (No hint: the registry matches a mistake's answer within a relative 1e-5.)"""
    for message in failures_on_every_seed("kv_cache_bytes", kv_bytes_float32_arithmetic):
        assert "on the case '3 layers" in message and "result: expected 6720201600, got 67202" in message, message


# A float32 answer where the text promises float32 (the registry adds its own hint on the dtype)
DTYPE_TRAPS = [("sinusoidal_positions", sinusoidal_always_float64, "float32, positions 100000 to 100009"),
               ("apply_rotary", apply_rotary_in_table_dtype, "heads of a batch, d_head = 8, x in float32")]


@pytest.mark.parametrize("name,fn,case", DTYPE_TRAPS, ids=[fn.__name__ for _, fn, _ in DTYPE_TRAPS])
def test_a_float64_answer_where_the_text_promises_float32_fails_on_a_named_case(name, fn, case):
    for message in failures_on_every_seed(name, fn):
        assert f"on the case '{case}" in message and "expected dtype float32, got float64" in message, message


def test_chunked_attention_that_builds_every_score_fails_on_its_memory_with_no_other_hint(monkeypatch):
    """The whole (T_q, T_k) array of scores passes every other case; the long case refuses it, for its memory
    (tracemalloc) and not for its answer, with no mistake's hint (its answer is right). So does a solution in
    blocks that makes a whole T_q x T_k mask of booleans (1 byte each) when none is given."""
    messages = failures_on_every_seed_hinted_on_the_first("chunked_attention", chunked_all_scores_at_once, monkeypatch)
    assert "never build the whole T_q x T_k array of scores" in messages[0] and not hint_of(messages[0]), messages[0]
    messages += failures_on_every_seed("chunked_attention", chunked_with_a_whole_mask_of_booleans)
    for message in messages:
        assert "on the case 'a long sequence" in message and "MiB allowed" in message, message
        assert not hint_of(message), message
