"""The traps of chapters 7 to 12 (issue #25, point 4 and part of 2): every wrong solution of the issue, and
more, fails on a fixed named case, on every seed (0..9), with the hint that fits; an input written in place
is refused; chunked attention that builds the whole array of scores is refused for its memory; a right
solution written from scratch passes on every seed; and what each exercise may not call (`forbids`,
`packages`) agrees with its text, so that a student edition of mha without those functions refuses the
library's routes and keeps the permitted functions working."""

import math
import re

import numpy as np
import pytest
from learners import FROM_SCRATCH as CHAPTER_12_FROM_SCRATCH

from learners import SEEDS, exercise_texts, failures_on_every_seed, run, student_edition

import mha.numpy as mnp
from mha.checks import registry
from mha.checks.compare import compare_result
from mha.checks.registry import CHECKS, expected_answer

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


def hint_of(message):
    """The hint of a failure message ("" when it has none)."""
    return message.split("\n  hint: ")[1].split("\n")[0] if "\n  hint: " in message else ""


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


def test_every_check_of_chapters_7_to_12_has_a_solution_from_scratch_here():
    assert sorted(FROM_SCRATCH) == sorted(CHAPTERS_7_TO_12)
    modules = {f"mha.checks.ch{n:02d}" for n in range(7, 13)}
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ in modules} == set(CHAPTERS_7_TO_12)


@pytest.mark.parametrize("name", CHAPTERS_7_TO_12)
def test_a_right_solution_from_scratch_passes_on_every_seed(name):
    for seed in SEEDS:
        assert run(name, FROM_SCRATCH[name], seed).startswith(f"check_{name}: all "), seed


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


def test_the_named_traps_are_in_the_named_cases_not_left_to_the_draw():
    cases = {name: CHECKS[name].named_cases(0) for name in CHAPTERS_7_TO_12}

    def labelled(name, words):
        return next(case for case in cases[name] if words in case.label)
    long = labelled("chunked_attention", "a long sequence")
    Q, K, V = long.args
    T_q, T_k, chunk = Q.shape[-2], K.shape[-2], long.kwargs["chunk"]
    assert min(T_q, T_k) >= 2048 and T_k % chunk and "mask" not in long.kwargs
    assert 8 * T_q * chunk * 4 <= long.peak_bytes < T_q * T_k  # 4 blocks of scores fit, T_q x T_k booleans do not
    key_mask = labelled("chunked_attention", "a mask of keys").kwargs["mask"]
    assert key_mask.shape[-2] == 1 and labelled("chunked_attention", "a mask of keys").args[0].shape[-2] > 1
    assert labelled("chunked_attention", "a mask with a batch axis").kwargs["mask"].ndim == 3
    for name, words in [("chunked_attention", "scores above 709"), ("chunked_attention", "a long sequence"),
                        ("attend_with_cache", "scores above 709")]:
        assert scores_far_apart(name, labelled(name, words)), (name, words)
    far = labelled("causal_lm_loss", "logits above 1000").args[0]
    row_max = far.max(axis=-1)
    assert far.max() > 710 and row_max.max() - row_max.min() > 800
    assert isinstance(labelled("alibi_bias", "Python list").args[2], list)
    table = labelled("sinusoidal_positions", "float32")
    assert table.kwargs["dtype"] == np.float32 and table.kwargs["offset"] >= 10**5
    rotary = labelled("apply_rotary", "float32 at positions 100000")
    assert rotary.args[0].dtype == np.float32 and rotary.args[1].dtype == np.float32
    assert np.array_equal(rotary.args[1], mnp.rotary_embedding(3, 2, 100.0, 100_000, dtype=np.float32)[0])
    step = labelled("attend_with_cache", "100000 cached positions")
    assert step.args[0].dtype == np.float32 and step.args[3].shape[-2] >= 10**5 and step.kwargs["rope_base"]
    key_padding = labelled("attend_with_cache", "a left-padding mask of keys")
    assert key_padding.kwargs["mask"].shape[-2] == 1 and key_padding.kwargs["mask"].shape[0] > 1
    first = cases["kv_cache_bytes"][0]
    total = mnp.kv_cache_bytes(*first.args, **first.kwargs)
    assert first.args[0] != 2 and int(np.float32(total)) != total and total > 2**31


def scores_far_apart(name, case):
    """True when the case's allowed attention scores reach above 709 in one row and a row's largest score is
    more than 745 below another's (exp(-745) is 0 in float64)."""
    if name == "chunked_attention":
        Q, K = case.args[0], case.args[1]
        mask = case.kwargs.get("mask", True)
    else:  # attend_with_cache, without RoPE: the new queries against every key, cached and new
        q, k, past_keys = case.args[0], case.args[1], case.args[3]
        Q, K = q, np.repeat(np.concatenate([past_keys, k], axis=-2), q.shape[-3] // k.shape[-3], axis=-3)
        T_past, T_new = past_keys.shape[-2], q.shape[-2]
        mask = case.kwargs["mask"] & (np.arange(T_past + T_new) <= T_past + np.arange(T_new)[:, None])
    scores = np.where(mask, Q @ np.swapaxes(K, -1, -2) / Q.shape[-1] ** 0.5, -np.inf)
    row_max = scores.max(axis=-1)[np.isfinite(scores.max(axis=-1))]
    return scores.max() > 709 and row_max.max() - row_max.min() > 745


# Inputs written in place --------------------------------------------------------------------------------


def chunked_scales_Q_in_place(Q, K, V, mask=None, chunk=256):
    Q /= Q.shape[-1] ** 0.5  # the scale, into the caller's array
    return attention_in_chunks(Q, K, V, mask, chunk)


def decoder_block_adds_in_place(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                                norm_first=False, eps=1e-5, activation="relu", **params):
    if norm_first:
        return decoder_block(X, memory, n_heads, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                             norm_first=True, eps=eps, activation=activation, **params)
    if causal:
        earlier = np.arange(X.shape[-2]) <= np.arange(X.shape[-2])[:, None]
        self_mask = earlier if self_mask is None else self_mask & earlier
    weights = []

    def attend(part, x, context, mask):
        out, w = mnp.multihead_attention(x, n_heads=n_heads, context=context, mask=mask,
                                         **{k: params.get(f"{part}_{k}") for k in ATTENTION_NAMES})
        weights.append(w)
        return out
    X += attend("self", X, None, self_mask)  # the residual, into the caller's array
    X = mnp.layer_norm(X, params["gamma_1"], params.get("beta_1"), eps)
    X = mnp.layer_norm(X + attend("cross", X, memory, memory_mask), params["gamma_2"], params.get("beta_2"), eps)
    ff = mnp.feed_forward(X, params["W_1"], params.get("b_1"), params["W_2"], params.get("b_2"), activation)
    return mnp.layer_norm(X + ff, params["gamma_3"], params.get("beta_3"), eps), tuple(weights)


def lm_loss_shifts_in_place(logits, tokens):
    logits -= logits.max(axis=-1, keepdims=True)  # the log-softmax's shift, into the caller's array
    return causal_lm_loss(logits, tokens)


def apply_rotary_into_x(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half].copy(), x[..., half:].copy()
    c, s = cos[..., :half].astype(x.dtype), sin[..., :half].astype(x.dtype)
    x[..., :half], x[..., half:] = a * c - b * s, b * c + a * s
    return x


def cache_step_rotates_k_in_place(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None,
                                  rope_base=None):
    if rope_base is not None:
        T_past = 0 if past_keys is None else past_keys.shape[-2]
        cos, sin = mnp.rotary_embedding(k.shape[-2], k.shape[-1], rope_base, offset=T_past,
                                        dtype=np.float64 if q.dtype == np.float64 else np.float32)
        k[...] = mnp.apply_rotary(k, cos, sin)  # the new keys, rotated where they lie
        q = mnp.apply_rotary(q, cos, sin)
    return cache_step_with()(q, k, v, past_keys, past_values, causal=causal, mask=mask)


IN_PLACE = [("chunked_attention", chunked_scales_Q_in_place, "Q"), ("decoder_block", decoder_block_adds_in_place, "X"),
            ("causal_lm_loss", lm_loss_shifts_in_place, "logits"), ("apply_rotary", apply_rotary_into_x, "x"),
            ("attend_with_cache", cache_step_rotates_k_in_place, "k")]


@pytest.mark.parametrize("name,fn,argument", IN_PLACE, ids=[fn.__name__ for _, fn, _ in IN_PLACE])
def test_an_input_written_in_place_is_refused_on_every_seed(name, fn, argument):
    for message in failures_on_every_seed(name, fn):
        assert f"{argument} was changed in place" in message and "work on a copy" in message, message


# An unknown name where the text requires an error ---------------------------------------------------


def test_no_exercise_of_chapters_7_to_12_asks_for_an_error():
    """Chapter 6's feed-forward asks for a ValueError on an unknown activation (a Case with raises=ValueError).
    The exercises of chapters 7 to 12 ask for none: if one ever does, it needs such a case."""
    texts = {name: text for chapter in range(7, 13) for name, text in exercise_texts(chapter).items()}
    assert sorted(texts) == sorted(CHAPTERS_7_TO_12)
    for name, text in texts.items():
        assert not re.search(r"ValueError|TypeError|\braise", text), name


# What each exercise may not call, and may ------------------------------------------------------------

# The library functions that each exercise's text permits (the rest of `may_use` is NumPy).
PERMITTED = {"decoder_block": {"multihead_attention", "layer_norm", "feed_forward"},
             "attend_with_cache": {"repeat_kv", "rotary_embedding", "apply_rotary", "scaled_dot_product_attention"}}


@pytest.mark.parametrize("name", CHAPTERS_7_TO_12)
def test_forbids_names_library_functions_and_never_what_the_text_permits(name):
    check = CHECKS[name]
    assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
    for allowed in PERMITTED.get(name, ()):
        assert f"mnp.{allowed}" in check.may_use and allowed not in check.forbids, allowed
    for forbidden in check.forbids:
        assert not re.search(rf"(?<!not )(?<!without )mnp\.{forbidden}\b", check.may_use), forbidden
    assert "torch" not in check.packages
    assert set(check.packages) == ({"scipy"} if name == "decoder_block" else set())  # GELU's erf


@pytest.mark.parametrize("name,routes", [
    ("chunked_attention", {"scaled_dot_product_attention", "softmax", "masked_softmax", "head_attention",
                           "multihead_attention", "attend_with_cache", "grouped_query_attention", "log_softmax"}),
    ("decoder_block", {"decoder", "causal_mask", "causal_mask_after"}),
    ("sinusoidal_positions", {"rotary_embedding", "sinusoidal_frequencies", "sinusoidal_shift"}),
    ("causal_lm_loss", {"cross_entropy", "log_softmax", "softmax"}),
    ("repeat_kv", {"attend_with_cache", "grouped_query_attention"}),
    ("apply_rotary", {"rotate_half", "attend_with_cache", "grouped_query_attention"}),
    ("attend_with_cache", {"grouped_query_attention", "causal_mask_after", "causal_mask"}),
])
def test_the_library_routes_of_the_issue_are_forbidden(name, routes):
    assert routes <= set(CHECKS[name].forbids)


def test_apply_rotary_may_not_use_rotate_half_as_its_text_says():
    assert re.search(r"without `?rotate_half", exercise_texts(12)["apply_rotary"])
    assert "without mnp.rotate_half" in CHECKS["apply_rotary"].may_use


# The library's routes to each exercise's answer, as the issue found them ---------------------------


def repeat_kv_by_attend_with_cache(x, n_rep):
    """Each query reads only its own position (an identity mask), so the output is the repeated values."""
    h, T = x.shape[-3] * n_rep, x.shape[-2]
    q = np.zeros(x.shape[:-3] + (h, T, x.shape[-1]), dtype=x.dtype)
    return mnp.attend_with_cache(q, x, x, mask=np.eye(T, dtype=bool))[0]


def apply_rotary_by_rotate_half(x, cos, sin):
    return x * cos.astype(x.dtype) + mnp.rotate_half(x) * sin.astype(x.dtype)


def sinusoidal_by_rotary_embedding(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    cos, sin = mnp.rotary_embedding(T, d_model, base, offset)  # (T, d): column i holds angle i (i < d/2)
    table = np.empty((T, d_model))
    table[:, 0::2], table[:, 1::2] = sin[:, :d_model // 2], cos[:, :d_model // 2]
    return table.astype(dtype)


def causal_lm_loss_by_cross_entropy(logits, tokens):
    return mnp.cross_entropy(logits[..., :-1, :], tokens[..., 1:])


def decoder_block_by_decoder(X, memory, n_heads, **options):
    out, weights = mnp.decoder(X, memory, [{k: options.pop(k) for k in list(options) if k in
                                            mnp.DECODER_BLOCK_PARAMS}], n_heads, **options)
    return out, weights[0]


def causal_mask_of_the_library(T):
    return mnp.causal_mask(T)  # looked up when called: the student edition's, in grading


def chunked_by_blocks_of_queries(Q, K, V, mask=None, chunk=256):
    """mnp.scaled_dot_product_attention on `chunk` queries at a time: small blocks, the library's attention."""
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    Q = np.broadcast_to(Q, lead + Q.shape[-2:])
    full = None if mask is None else np.broadcast_to(mask, lead + (Q.shape[-2], K.shape[-2]))
    return np.concatenate([mnp.scaled_dot_product_attention(
        Q[..., lo:lo + chunk, :], K, V, None if full is None else full[..., lo:lo + chunk, :])[0]
        for lo in range(0, Q.shape[-2], chunk)], axis=-2)


def cache_step_by_grouped_query_attention(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None,
                                          rope_base=None):
    """q, k and v side by side in X, picked out again by identity projections; the cache in a KVCache."""
    h, h_kv, d = q.shape[-3], k.shape[-3], q.shape[-1]

    def merged(a):  # (..., heads, T, d) -> (..., T, heads * d)
        return np.concatenate(list(np.moveaxis(a, -3, 0)), axis=-1)
    X = np.concatenate([merged(q), merged(k), merged(v)], axis=-1)
    eye = np.eye(X.shape[-1], dtype=q.dtype)
    cache = mnp.KVCache()
    if past_keys is not None:
        cache.keys, cache.values = past_keys, past_values
    out, weights = mnp.grouped_query_attention(
        X, eye[:, :h * d], eye[:, h * d:(h + h_kv) * d], eye[:, (h + h_kv) * d:], np.eye(h * d, dtype=q.dtype), h,
        h_kv, mask=mask, causal=causal, rope_base=rope_base, cache=cache)
    return np.stack(np.split(out, h, axis=-1), axis=-3), weights, cache.keys, cache.values


ROUTES = [("repeat_kv", repeat_kv_by_attend_with_cache), ("apply_rotary", apply_rotary_by_rotate_half),
          ("sinusoidal_positions", sinusoidal_by_rotary_embedding),
          ("causal_lm_loss", causal_lm_loss_by_cross_entropy), ("decoder_block", decoder_block_by_decoder),
          ("decoder_block", decoder_block_with(mnp.multihead_attention, causal_pattern=causal_mask_of_the_library)),
          ("chunked_attention", chunked_by_blocks_of_queries),
          ("attend_with_cache", cache_step_by_grouped_query_attention)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[fn.__name__ for _, fn in ROUTES])
def test_a_library_route_is_right_but_refused_in_the_notebook_and_fails_in_the_student_edition(name, route,
                                                                                               monkeypatch):
    """The route gives the right answer on every named case, where nothing looks; the notebook's check refuses it,
    naming the library function it calls (as the grader's verdict is), and in the student edition it fails."""
    check = CHECKS[name]
    for case in check.named_cases(0):
        assert compare_result(expected_answer(name, case), case.call(route), check.returns) is None, case.label
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
        assert re.search(rf"^{name} calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route):
            assert "this is the exercise" in message, message


# Solutions that use what the text permits, as the book's do: they pass in the student edition.
PERMITTED_ROUTES = [("decoder_block", decoder_block), ("attend_with_cache", cache_step_with())]


@pytest.mark.parametrize("name,solution", PERMITTED_ROUTES, ids=[n for n, _ in PERMITTED_ROUTES])
def test_a_solution_that_calls_only_what_the_text_permits_passes_in_the_student_edition(name, solution, monkeypatch):
    assert set(PERMITTED) == {n for n, _ in PERMITTED_ROUTES}
    with student_edition(name, monkeypatch):
        for seed in SEEDS:
            run(name, solution, seed)
