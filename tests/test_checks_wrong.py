"""Wrong solutions as learners write them: the three of the issue (a softmax that subtracts the
global maximum, multi-head attention scaled by sqrt(d_model // h) from the input's width, an
offset score divided by T_k - |offset|), and more that the named cases alone let through: a
width taken from the wrong array, a shape, a dtype or an option hard-coded, a table of answers.
Every check rejects them, whatever the seed of its random cases."""

import io
import math
import re
from contextlib import redirect_stdout

import numpy as np
import pytest
from learners import cached_attention, own_copy, unguarded

import mha.checks as checks

SOFTMAX, SDPA = own_copy("softmax"), own_copy("scaled_dot_product_attention")
MHA, HEAD = own_copy("multihead_attention"), own_copy("head_attention")


def softmax_global_max(x, axis=-1):  # the issue: the maximum of the whole array, not of each row
    e = np.exp(x - np.max(x))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_float64_only(x, axis=-1):
    return SOFTMAX(x, axis) if x.dtype == np.float64 else np.full_like(x, 1 / x.shape[axis])


def softmax_up_to_3_d(x, axis=-1):
    return SOFTMAX(x, axis) if x.ndim <= 3 else SOFTMAX(x, -1)


def self_attention_uniform_when_alone(X, exclude_self=False):
    out, w = own_copy("self_attention")(X, exclude_self)
    return (X, np.ones_like(w)) if X.shape[-2] == 1 else (out, w)


def self_attention_2_or_3_d(X, exclude_self=False):
    keys = X.T if X.ndim == 2 else X.transpose(0, 2, 1)  # (d, T) or (B, d, T)
    scores = X @ keys / math.sqrt(X.shape[-1])
    w = own_copy("masked_softmax")(scores, ~np.eye(X.shape[-2], dtype=bool) if exclude_self else None)
    return w @ X, w


def symmetric_scaled_by_rows_of_W(X, W):
    E = X @ W
    w = SOFTMAX(E @ np.swapaxes(E, -1, -2) / math.sqrt(W.shape[0]))
    return w @ X, w


def sdpa_scaled_by_values(Q, K, V, mask=None):
    return SDPA(Q * math.sqrt(Q.shape[-1] / V.shape[-1]), K, V, mask)


def sdpa_mask_of_two_axes_only(Q, K, V, mask=None):
    return SDPA(Q, K, V, mask if mask is not None and np.ndim(mask) == 2 else None)


def sdpa_2_or_3_d(Q, K, V, mask=None):
    keys = K.T if K.ndim == 2 else K.transpose(0, 2, 1)
    w = own_copy("masked_softmax")(Q @ keys / math.sqrt(Q.shape[-1]), mask)
    return w @ V, w


def sdpa_uniform_on_a_masked_row(Q, K, V, mask=None):
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    w = SOFTMAX(scores if mask is None else np.where(mask, scores, -1e30))
    return w @ V, w


def head_values_from_X(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    source = X if context is None else context
    return SDPA(X @ W_q, source @ W_k, X if W_v is None else source @ W_v, mask)


def head_scaled_by_input(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    scale = math.sqrt(W_q.shape[1] / X.shape[-1])
    return HEAD(X, W_q * scale, W_k, W_v, context=context, mask=mask)


def loop_offsets_by_own_width(X, heads, W_o, *, context=None, mask=None):
    source = X if context is None else context
    shape = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
    full = None if mask is None else np.broadcast_to(mask, shape)
    total, maps = 0, []
    for i, head in enumerate(heads):
        out, w = HEAD(X, *head, context=context, mask=None if full is None else full[..., i, :, :])
        total = total + out @ W_o[i * out.shape[-1]:(i + 1) * out.shape[-1]]  # right while all heads are as wide
        maps.append(w)
    return total, np.stack(maps, -3)


def loop_without_context(X, heads, W_o, *, context=None, mask=None):
    return own_copy("multihead_attention_loop")(X, heads, W_o, mask=mask)


def split_heads_2_or_3_d(X, n_heads):
    if X.ndim == 2:
        return X.reshape(X.shape[0], n_heads, -1).transpose(1, 0, 2)
    B, T, d = X.shape
    return X.reshape(B, T, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def merge_heads_3_or_4_d(X):
    if X.ndim == 3:
        return X.transpose(1, 0, 2).reshape(X.shape[1], -1)
    B, h, T, d_head = X.shape
    return X.transpose(0, 2, 1, 3).reshape(B, T, h * d_head)


def causal_mask_table(T):
    known = {1: [[True]], 4: np.tril(np.ones((4, 4), bool)), 7: np.tril(np.ones((7, 7), bool))}
    return np.array(known.get(T, np.ones((T, T), bool)))


def causal_mask_floats(T):
    return np.tril(np.ones((T, T)))


def padding_mask_for_batches_of_three(lengths, T):
    lengths = np.asarray(lengths)
    real = np.arange(T) < lengths[:, None] if len(lengths) in (1, 3) else np.ones((len(lengths), T), bool)
    return real[:, None, None, :]


def padding_mask_length_0_is_full(lengths, T):
    lengths = np.where(np.asarray(lengths) == 0, T, lengths)  # an empty sentence taken for a full one
    return (np.arange(T) < lengths[:, None])[:, None, None, :]


def fused_attention(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None, b_q=None, b_k=None, b_v=None,
                    b_o=None, cut_by_input_width=False):
    """Multi-head attention from scratch, scaled by sqrt(d_model // h) with d_model the input's width,
    and (cut_by_input_width) heads cut to that width too: right only while W_q is square."""
    d_head = X.shape[-1] // n_heads
    source = X if context is None else context

    def heads(A, W, b):
        A = A @ W + (0 if b is None else b)
        return np.swapaxes(A.reshape(*A.shape[:-1], n_heads, d_head if cut_by_input_width else -1), -3, -2)
    Q, K, V = heads(X, W_q, b_q), heads(source, W_k, b_k), heads(source, W_v, b_v)
    w = unguarded(own_copy("masked_softmax"))(Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_head), mask)  # as if by hand
    out = np.swapaxes(w @ V, -3, -2)
    return out.reshape(*out.shape[:-2], -1) @ W_o + (0 if b_o is None else b_o), w


def mha_scaled_from_input_width(X, W_q, W_k, W_v, W_o, n_heads, **kw):  # the issue
    return fused_attention(X, W_q, W_k, W_v, W_o, n_heads, **kw)


def mha_heads_cut_from_input_width(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    return fused_attention(X, W_q, W_k, W_v, W_o, n_heads, cut_by_input_width=True, **kw)


def mha_ignores_context(X, W_q, W_k, W_v, W_o, n_heads, context=None, **kw):
    return MHA(X, W_q, W_k, W_v, W_o, n_heads, **kw)


def layer_norm_needs_beta(X, gamma, beta, eps=1e-5):
    return own_copy("layer_norm")(X, gamma, beta + 0, eps)


def layer_norm_default_eps(X, gamma, beta, eps=1e-5):
    return own_copy("layer_norm")(X, gamma, beta)


def feed_forward_needs_biases(X, W_1, b_1, W_2, b_2, activation="relu"):
    return own_copy("feed_forward")(X, W_1, b_1 + 0, W_2, b_2 + 0, activation)


def feed_forward_always_relu(X, W_1, b_1, W_2, b_2, activation="relu"):
    return own_copy("feed_forward")(X, W_1, b_1, W_2, b_2)


def encoder_default_eps(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    return own_copy("encoder_block")(X, n_heads, mask=mask, norm_first=norm_first, activation=activation, **params)


def encoder_mask_for_3_d_only(X, n_heads, *, mask=None, **options):
    return own_copy("encoder_block")(X, n_heads, mask=mask if X.ndim == 3 else None, **options)


def offset_divided_by_keys(weights, offset):  # the issue: T_k - |offset|
    return np.diagonal(weights, offset, axis1=-2, axis2=-1).sum(-1) / (weights.shape[-1] - abs(offset))


def offset_assumes_square(weights, offset):
    T = weights.shape[-1]
    picked = [weights[..., i, i + offset] for i in range(min(T, weights.shape[-2])) if 0 <= i + offset < T]
    return sum(picked) / (T - abs(offset))


def chunked_scaled_by_values(Q, K, V, mask=None, chunk=256):
    return SDPA(Q * math.sqrt(Q.shape[-1] / V.shape[-1]), K, V, mask)[0]


def chunked_float64_only(Q, K, V, mask=None, chunk=256):  # in chunks: the long named case's memory passes
    right = own_copy("chunked_attention")
    return right(Q, K, V, mask, chunk) if Q.dtype == np.float64 else np.zeros((*Q.shape[:-1], V.shape[-1]))


def decoder_causal_replaces_self_mask(X, memory, n_heads, *, self_mask=None, causal=False, **options):
    mask = np.tril(np.ones((X.shape[-2],) * 2, bool)) if causal else self_mask
    return own_copy("decoder_block")(X, memory, n_heads, self_mask=mask, **options)


def decoder_default_eps(X, memory, n_heads, *, eps=1e-5, **options):
    return own_copy("decoder_block")(X, memory, n_heads, **options)


def repeat_kv_concatenated(x, n_rep):  # torch's .repeat: the whole stack of heads, n_rep times over
    return np.concatenate([x] * n_rep, axis=-3)


def repeat_kv_3_or_4_d(x, n_rep):
    heads = np.arange(x.shape[-3] * n_rep) // n_rep
    return x[heads] if x.ndim == 3 else x[:, heads]


def apply_rotary_complex(x, cos, sin):  # Meta's original code: pairs (2i, 2i + 1) as complex numbers
    half = x.shape[-1] // 2
    turned = (x[..., 0::2] + 1j * x[..., 1::2]) * (cos[..., :half] + 1j * sin[..., :half])  # (..., T, d/2)
    return np.stack([turned.real, turned.imag], axis=-1).reshape(x.shape)


def attend_positions_from_0(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None, rope_base=None):
    return cached_attention(q, k, v, past_keys, past_values, causal, mask, rope_base, offset=False)


def attend_mask_top_left(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None, rope_base=None):
    return cached_attention(q, k, v, past_keys, past_values, causal, mask, rope_base, shifted=False)


def attend_causal_replaces_mask(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None,
                                rope_base=None):
    return cached_attention(q, k, v, past_keys, past_values, causal, None if causal else mask, rope_base)


def kv_cache_bytes_keys_only(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    return n_layers * n_kv_heads * d_head * T * batch * bytes_per_value


def kv_cache_bytes_float32_default(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=4):
    return 2 * n_layers * n_kv_heads * d_head * T * batch * bytes_per_value


def kv_cache_bytes_int32(n_layers, n_kv_heads, d_head, T, *, batch=1, bytes_per_value=2):
    sizes = np.array([2, n_layers, n_kv_heads, d_head, T, batch, bytes_per_value], dtype=np.int32)
    return np.prod(sizes, dtype=np.int32)  # overflows past 2 GiB


WRONG = [
    ("softmax", softmax_global_max), ("softmax", softmax_float64_only), ("softmax", softmax_up_to_3_d),
    ("self_attention", self_attention_uniform_when_alone), ("self_attention", self_attention_2_or_3_d),
    ("symmetric_attention", symmetric_scaled_by_rows_of_W),
    ("scaled_dot_product_attention", sdpa_scaled_by_values), ("scaled_dot_product_attention", sdpa_2_or_3_d),
    ("scaled_dot_product_attention", sdpa_mask_of_two_axes_only),
    ("scaled_dot_product_attention", sdpa_uniform_on_a_masked_row),
    ("head_attention", head_values_from_X), ("head_attention", head_scaled_by_input),
    ("multihead_attention_loop", loop_offsets_by_own_width), ("multihead_attention_loop", loop_without_context),
    ("split_heads", split_heads_2_or_3_d), ("merge_heads", merge_heads_3_or_4_d),
    ("causal_mask", causal_mask_table), ("causal_mask", causal_mask_floats),
    ("padding_mask", padding_mask_for_batches_of_three), ("padding_mask", padding_mask_length_0_is_full),
    ("multihead_attention", mha_scaled_from_input_width), ("multihead_attention", mha_heads_cut_from_input_width),
    ("multihead_attention", mha_ignores_context),
    ("layer_norm", layer_norm_needs_beta), ("layer_norm", layer_norm_default_eps),
    ("feed_forward", feed_forward_needs_biases), ("feed_forward", feed_forward_always_relu),
    ("encoder_block", encoder_default_eps), ("encoder_block", encoder_mask_for_3_d_only),
    ("attention_at_offset", offset_divided_by_keys), ("attention_at_offset", offset_assumes_square),
    ("chunked_attention", chunked_scaled_by_values), ("chunked_attention", chunked_float64_only),
    ("decoder_block", decoder_causal_replaces_self_mask), ("decoder_block", decoder_default_eps),
    ("repeat_kv", repeat_kv_concatenated), ("repeat_kv", repeat_kv_3_or_4_d), ("apply_rotary", apply_rotary_complex),
    ("attend_with_cache", attend_positions_from_0), ("attend_with_cache", attend_mask_top_left),
    ("attend_with_cache", attend_causal_replaces_mask),
    ("kv_cache_bytes", kv_cache_bytes_keys_only), ("kv_cache_bytes", kv_cache_bytes_float32_default),
    ("kv_cache_bytes", kv_cache_bytes_int32),
]


@pytest.mark.parametrize("name,fn", WRONG, ids=[fn.__name__ for _, fn in WRONG])
def test_a_wrong_solution_is_rejected_whatever_the_seed(name, fn):
    for seed in (None, 0, 1, 2):
        with pytest.raises(checks.CheckFailed), redirect_stdout(io.StringIO()):
            getattr(checks, f"check_{name}")(fn, seed=seed)


@pytest.mark.parametrize("name,fn,hint", [
    ("softmax", softmax_global_max, "subtract each row's own maximum"),
    ("multihead_attention", mha_scaled_from_input_width, "the scale is 1/sqrt(d_head), the width of one head's"),
    ("attention_at_offset", offset_divided_by_keys, "average over the queries i whose key i + offset exists"),
], ids=["global maximum", "sqrt(d_model // h)", "T_k - |offset|"])
def test_the_wrong_solutions_of_the_issue_get_their_hints(name, fn, hint):
    with pytest.raises(checks.CheckFailed, match=re.escape(f"hint: {hint}")), redirect_stdout(io.StringIO()):
        getattr(checks, f"check_{name}")(fn)


@pytest.mark.parametrize("name,fn,hint", [
    ("repeat_kv", repeat_kv_concatenated, "consecutive query heads share a key/value head"),
    ("apply_rotary", apply_rotary_complex, "Hugging Face's Llama pairs feature i with feature i + d_head/2"),
    ("attend_with_cache", attend_positions_from_0, "the new tokens sit at positions T_past"),
    ("attend_with_cache", attend_mask_top_left, "new query t is at position T_past + t"),
    ("kv_cache_bytes", kv_cache_bytes_keys_only, "the cache holds keys AND values"),
    ("kv_cache_bytes", kv_cache_bytes_float32_default, "2 bytes (float16, bfloat16) by default"),
], ids=["tiled heads", "interleaved pairs", "positions from 0", "top-left causal mask", "keys only", "float32"])
def test_the_wrong_solutions_of_chapter_12_get_their_hints(name, fn, hint):
    with pytest.raises(checks.CheckFailed, match=re.escape("hint: ") + ".*" + re.escape(hint)), \
            redirect_stdout(io.StringIO()):
        getattr(checks, f"check_{name}")(fn)
