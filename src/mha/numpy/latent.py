"""Multi-head latent attention (DeepSeek-V2, 2024; DeepSeek-V3, 2024): one decoding step from the
latent cache, in the absorbed form and in the expanded form, and what the cache and the step cost.

The cache of a latent attention layer holds, per token, one latent c (kv_lora_rank = r features,
shared by every head) and one rotary key k_rope (qk_rope_head_dim features, also shared). Head i's
key without RoPE is c W_uk[i] and its value c W_uv[i]. One new token's query for head i is
[q_nope_i | q_rope_i], so its score for cached token j is

    scale * (q_nope_i . (c_j W_uk[i]) + q_rope_i . k_rope_j)
  = scale * ((W_uk[i] q_nope_i) . c_j + q_rope_i . k_rope_j)

and its output sum_j w_ij (c_j W_uv[i]) = (sum_j w_ij c_j) W_uv[i]. The expanded form computes the
left-hand sides: every head's T keys and values, then attention. The absorbed form (DeepSeek-V2's
"absorption") computes the right-hand sides: the query moved into the latent space once, the
latents read as they are, the value up-projection applied once to the weighted sum.
"""

import math

import numpy as np

from mha import validate
from mha.numpy.attention import (
    as_float_array, as_mask, masked_softmax, merge_heads, scaled_dot_product_attention, split_heads, transpose,
)
from mha.numpy.parts import rms_norm
from mha.numpy.rotary import apply_rotary, rotary_embedding
from mha.numpy.sparse import lightning_indexer, select_top_k_keys


def check_decode_inputs(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    """The six arrays as floating-point arrays of matching sizes, and scale as a float."""
    names = ("q_nope", "q_rope", "latents", "rotary_keys", "W_uk", "W_uv")
    arrays = [as_float_array(name, a) for name, a in zip(names, (q_nope, q_rope, latents, rotary_keys, W_uk, W_uv))]
    for name, a, ndim in zip(names, arrays, (2, 2, 2, 2, 3, 3)):
        validate.check_ndim(name, a, ndim, 3 if name.startswith("W") else None)
    q_nope, q_rope, latents, rotary_keys, W_uk, W_uv = arrays
    h, d_nope = q_nope.shape[-2:]
    r, d_rope = latents.shape[-1], rotary_keys.shape[-1]
    expected = {"q_rope": (h, d_rope), "W_uk": (h, r, d_nope), "W_uv": (h, r, W_uv.shape[-1])}
    for name, a in (("q_rope", q_rope), ("W_uk", W_uk), ("W_uv", W_uv)):
        got = a.shape[-len(expected[name]):]
        if got != expected[name]:
            raise ValueError(f"{name} has shape {validate.shape_str(a.shape)}, expected (..., "
                             f"{', '.join(map(str, expected[name]))}) for h={h} heads, r={r}, "
                             f"d_nope={d_nope} and d_rope={d_rope}")
    if rotary_keys.shape[-2] != latents.shape[-2]:
        raise ValueError(f"latents hold T={latents.shape[-2]} tokens but rotary_keys {rotary_keys.shape[-2]}")
    validate.broadcast_batch("q_nope", q_nope.shape[:-2], "latents", latents.shape[:-2])
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a number, got {scale!r}")
    return (*arrays, float(scale))


def absorbed_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, mask=None):
    """One new token per sequence over the cached latents, in the absorbed form.

    q_nope (..., h, d_nope) and q_rope (..., h, d_rope) (rotated): the new token's queries;
    latents (..., T, r) and rotary_keys (..., T, d_rope) (rotated): the cache; W_uk (h, r, d_nope)
    and W_uv (h, r, d_v): head i's keys without RoPE are latents @ W_uk[i], its values latents @ W_uv[i];
    scale: the scores' factor; mask: booleans broadcasting to (..., h, T), True = may attend.
    Returns out (..., h, d_v) and weights (..., h, T). No head's T keys or values are ever formed.
    """
    q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale = check_decode_inputs(
        q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale)
    q_latent = np.einsum("...hn,hrn->...hr", q_nope, W_uk)  # (..., h, r): W_uk[i] q_nope_i, the query in latent space
    scores = q_latent @ transpose(latents) + q_rope @ transpose(rotary_keys)  # (..., h, T)
    weights = masked_softmax(scale * scores, mask)  # (..., h, T)
    context = weights @ latents  # (..., h, r): each head's weighted sum of the latents
    out = np.einsum("...hr,hrv->...hv", context, W_uv)  # (..., h, d_v): the value up-projection, once
    return out, weights


def expanded_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, mask=None):
    """`absorbed_latent_decode` the direct way: every head's T keys and values formed from the latents,
    then attention. The same arguments and results (equal to float64 rounding)."""
    q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale = check_decode_inputs(
        q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale)
    keys = np.einsum("...tr,hrn->...htn", latents, W_uk)  # (..., h, T, d_nope): head i's keys without RoPE
    values = np.einsum("...tr,hrv->...htv", latents, W_uv)  # (..., h, T, d_v)
    scores = np.einsum("...hn,...htn->...ht", q_nope, keys) + q_rope @ transpose(rotary_keys)  # (..., h, T)
    weights = masked_softmax(scale * scores, mask)  # (..., h, T)
    return np.einsum("...ht,...htv->...hv", weights, values), weights  # (..., h, d_v)


def latent_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, T, *, batch=1, bytes_per_value=2,
                       indexer_head_dim=0):
    """The memory a latent cache holds: per layer, position and sequence, one latent of kv_lora_rank
    values and one shared rotary key of qk_rope_head_dim (and DeepSeek-V3.2's indexer key of
    indexer_head_dim), at `bytes_per_value` each. DeepSeek-V3 (61 layers, r = 512, d_rope = 64) at
    T = 8192 in bfloat16: 61 * 576 * 8192 * 2 bytes = 0.54 GiB per sequence."""
    sizes = {"n_layers": n_layers, "kv_lora_rank": kv_lora_rank, "qk_rope_head_dim": qk_rope_head_dim, "T": T,
             "batch": batch, "bytes_per_value": bytes_per_value, "indexer_head_dim": indexer_head_dim}
    minimum = {"T": 0, "indexer_head_dim": 0}
    s = {name: validate.check_int(name, value, minimum=minimum.get(name, 1)) for name, value in sizes.items()}
    per_token = s["kv_lora_rank"] + s["qk_rope_head_dim"] + s["indexer_head_dim"]
    return s["n_layers"] * per_token * s["T"] * s["batch"] * s["bytes_per_value"]


def latent_decode_flops(T, n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
    """The multiply-adds of one decoding step's attention in one layer, one new token over T cached ones
    (the new token's own projections, the same in every form, left out), as a dict:
    - "expanded": every cached latent up-projected into h keys and values, T r h (d_nope + d_v), then the
      scores T h (d_nope + d_rope) and the outputs T h d_v;
    - "absorbed": W_uk folded into the query, h d_nope r; the scores against the latents, T h (r + d_rope);
      the latents summed, T h r; W_uv applied once, h r d_v;
    - "full_cache": a cache of every head's keys and values (multi-head attention's), nothing to expand:
      T h (d_nope + d_rope + d_v).
    Per cached token the absorbed form does h (2 r + d_rope) against the expanded form's
    r h (d_nope + d_v) + h (d_nope + d_rope + d_v): DeepSeek-V3's sizes, 139,264 against 16,818,176. It
    does more than "full_cache" (40,960) but reads r + d_rope numbers per token instead of 2 h d_head."""
    T = validate.check_int("T", T, minimum=0)
    h, r, d_nope, d_rope, d_v = (validate.check_int(name, value) for name, value in (
        ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
        ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim)))
    expanded = T * r * h * (d_nope + d_v) + T * h * (d_nope + d_rope) + T * h * d_v
    absorbed = h * d_nope * r + T * h * (r + d_rope) + T * h * r + h * r * d_v
    full_cache = T * h * (d_nope + d_rope) + T * h * d_v  # every head's keys and values cached: nothing to expand
    return {"expanded": expanded, "absorbed": absorbed, "full_cache": full_cache}


def latent_scale(qk_head_dim, rope_scaling=None):
    """The scores' factor: qk_head_dim ** -0.5, times DeepSeek's YaRN mscale squared where the scaling
    has mscale_all_dim (0.1 mscale_all_dim ln(factor) + 1, for factor > 1)."""
    scale = qk_head_dim ** -0.5
    if rope_scaling is not None and rope_scaling.get("mscale_all_dim"):
        factor = rope_scaling["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * rope_scaling["mscale_all_dim"] * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    return scale


def deinterleave(x):
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...): interleaved rotary pairs laid out as halves."""
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def latent_attention(X, params, *, n_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_base=10000.0,
                     rope_scaling=None, rope_interleave=False, scale=None, norm_eps=1e-6, indexer=None, mask=None,
                     causal=True):
    """Multi-head latent attention over a prompt X (..., T, d_model), the expanded form; returns
    (out (..., T, d_model), weights (..., h, T, T)). `mha.torch.MultiHeadLatentAttention.numpy_params()`
    gives `params`: W_q (d_model, h (d_nope + d_rope)), or W_dq, b_dq, q_norm, W_uq (the compressed query);
    W_dkv, b_dkv (the latent and the rotary key), kv_norm, W_ukv (per head [keys | values]), W_o, b_o;
    with `indexer` (dict(n_heads=, head_dim=, top_k=)) the indexer's W_iq, W_ik, k_norm_weight, k_norm_bias,
    W_iw. mask: booleans broadcasting to (..., h, T, T), True = may attend, besides causality."""
    X = as_float_array("X", X)
    h, d_nope, d_rope = n_heads, qk_nope_head_dim, qk_rope_head_dim
    pairs = deinterleave if rope_interleave else (lambda x: x)
    scale = latent_scale(d_nope + d_rope, rope_scaling) if scale is None else scale
    cos, sin = rotary_embedding(X.shape[-2], d_rope, rope_base, dtype=X.dtype, scaling=rope_scaling)  # (T, d_rope)
    q_low = None
    if "W_q" in params:
        Q = X @ params["W_q"]  # (..., T, h (d_nope + d_rope))
    else:
        q_low = rms_norm(X @ params["W_dq"] + params.get("b_dq", 0), params["q_norm"], norm_eps)  # (..., T, q_lora)
        Q = q_low @ params["W_uq"]
    Q = split_heads(Q, h)  # (..., h, T, d_nope + d_rope)
    Q = np.concatenate([Q[..., :d_nope], apply_rotary(pairs(Q[..., d_nope:]), cos, sin)], axis=-1)
    compressed = X @ params["W_dkv"] + params.get("b_dkv", 0)  # (..., T, r + d_rope)
    r = compressed.shape[-1] - d_rope
    latents = rms_norm(compressed[..., :r], params["kv_norm"], norm_eps)  # (..., T, r)
    rotary_keys = apply_rotary(pairs(compressed[..., r:]), cos, sin)  # (..., T, d_rope), shared by the heads
    per_head = split_heads(latents @ params["W_ukv"], h)  # (..., h, T, d_nope + d_v)
    shared = np.broadcast_to(rotary_keys[..., None, :, :], (*per_head.shape[:-1], d_rope))  # (..., h, T, d_rope)
    keys, values = np.concatenate([per_head[..., :d_nope], shared], axis=-1), per_head[..., d_nope:]
    T = X.shape[-2]
    allowed = np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)  # (T, T)
    if mask is not None:
        allowed = allowed & as_mask(mask, (*Q.shape[:-1], T))  # (..., h, T, T)
    if indexer is not None:
        scores = lightning_indexer(X, q_low, params, cos, sin, n_heads=indexer["n_heads"],
                                   head_dim=indexer["head_dim"], norm_eps=norm_eps)  # (..., T, T)
        merged = allowed.any(axis=-3) if allowed.ndim >= 3 else allowed  # the indexer chooses for every head
        allowed = allowed & select_top_k_keys(scores, indexer["top_k"], merged)[..., None, :, :]
    out, weights = scaled_dot_product_attention(Q, keys, values, allowed, scale=scale)  # (..., h, T, d_v)
    return merge_heads(out) @ params["W_o"] + params.get("b_o", 0), weights  # (..., T, d_model)
