"""Multi-head latent attention (DeepSeek-V2, 2024; DeepSeek-V3, 2024): the PyTorch face of
`mha.numpy.latent`, with its cache and the absorbed decoding step.

Keys and values are not projected from x one head at a time: x is first compressed into one
latent c of kv_lora_rank features per token (W_dkv, then an RMSNorm), and every head's keys
without RoPE and its values are up-projections of that latent (W_ukv). RoPE cannot pass through
an up-projection, so each head's key has a second, decoupled part of qk_rope_head_dim features,
one rotary key shared by all heads. The cache holds the latent and the rotary key: r + d_rope
numbers per token and layer, against 2 h d_head for multi-head attention.

At decoding time the up-projections need not be applied to the cached latents (DeepSeek-V2's
"absorption"): head i's score q_i . (W_uk[i]^T c_j) is (W_uk[i] q_i) . c_j, and its output
sum_j w_ij (c_j W_uv[i]) is (sum_j w_ij c_j) W_uv[i]: the key up-projection is folded into the
query, the value up-projection into the output, and the T cached latents are read as they are.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from mha import rope_scaling as rope_scaling_module
from mha import validate
from mha.torch.attention import masked_softmax, merge_heads, split_heads
from mha.torch.grouped import causal_mask_after, grouped_attention
from mha.torch.parts import RMSNorm
from mha.torch.rotary import RotaryTables
from mha.torch.sparse import LightningIndexer
from mha.torch.tensors import check_input, check_is_tensor, check_mask_tensor


class LatentCache:
    """What a latent attention layer keeps of the tokens seen: `latents` (B, T, kv_lora_rank) (after
    the norm), `rotary_keys` (B, T, qk_rope_head_dim) (after RoPE) and, with a lightning indexer,
    `indexer_keys` (B, T, indexer head_dim). The names it shares with `KVCache` mean the same:
    `len(cache)` the positions held, `position` the next token's, `dropped` (always 0 here)."""

    def __init__(self):
        self.latents = None  # (..., T, r), or None while empty
        self.rotary_keys = None  # (..., T, d_rope)
        self.indexer_keys = None  # (..., T, d_index), or None without an indexer
        self.dropped = 0  # nothing is ever dropped: every position stays

    def __len__(self):
        return 0 if self.latents is None else self.latents.shape[-2]

    @property
    def position(self):
        """The position of the next token."""
        return self.dropped + len(self)

    @property
    def nbytes(self):
        """The bytes held: every latent, rotary key and indexer key of every sequence."""
        held = (self.latents, self.rotary_keys, self.indexer_keys)
        return sum(a.numel() * a.element_size() for a in held if a is not None)

    def __repr__(self):
        shape = "empty" if self.latents is None else f"latents {validate.shape_str(self.latents.shape)}"
        return f"{type(self).__name__}({shape})"

    def append(self, latents, rotary_keys, indexer_keys=None):
        """Add the new tokens' latents (..., T_new, r), rotary keys (..., T_new, d_rope) and
        indexer keys (..., T_new, d_index) or None; returns all three, T_held + T_new long."""
        new = {"latents": latents, "rotary_keys": rotary_keys, "indexer_keys": indexer_keys}
        if (indexer_keys is None) != (self.indexer_keys is None) and len(self):
            raise ValueError("indexer_keys must be given at every append or at none (the cache holds "
                             f"{'some' if self.indexer_keys is not None else 'none'})")
        for name, value in new.items():
            if value is None:
                continue
            check_is_tensor(name, value)
            held = getattr(self, name)
            if held is not None and (held.shape[:-2] != value.shape[:-2] or held.shape[-1] != value.shape[-1]
                                     or held.dtype != value.dtype):
                raise ValueError(f"{name} has shape {validate.shape_str(value.shape)} and dtype {value.dtype}, "
                                 f"but the cache holds {validate.shape_str(held.shape)} of {held.dtype}")
            setattr(self, name, value if held is None else torch.cat([held, value], dim=-2))  # (..., T + T_new, .)
        return self.latents, self.rotary_keys, self.indexer_keys


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


def absorbed_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, mask=None):
    """One new token per sequence, attending to the cached latents without expanding them.

    q_nope (..., h, d_nope), q_rope (..., h, d_rope) (rotated); latents (..., T, r); rotary_keys
    (..., T, d_rope) (rotated); W_uk (h, r, d_nope), W_uv (h, r, d_v): head i's keys without RoPE
    are latents @ W_uk[i], its values latents @ W_uv[i]. mask: booleans broadcasting to (..., h, T).
    Returns out (..., h, d_v) and weights (..., h, T)."""
    q_latent = torch.einsum("...hn,hrn->...hr", q_nope, W_uk)  # (..., h, r): W_uk[i] q_i, the absorbed query
    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ rotary_keys.transpose(-2, -1)  # (..., h, T)
    weights = masked_softmax(scores * scale, mask)  # (..., h, T)
    context = weights @ latents  # (..., h, r): each head's weighted sum of latents
    out = torch.einsum("...hr,hrv->...hv", context, W_uv)  # (..., h, d_v): W_uv applied once, after the sum
    return out, weights


def expanded_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale, mask=None):
    """`absorbed_latent_decode` computed the direct way: every head's T keys and values formed from the
    latents first, then attention. The same arguments and results, equal to float64 rounding."""
    keys = torch.einsum("...tr,hrn->...htn", latents, W_uk)  # (..., h, T, d_nope)
    values = torch.einsum("...tr,hrv->...htv", latents, W_uv)  # (..., h, T, d_v)
    scores = torch.einsum("...hn,...htn->...ht", q_nope, keys) + q_rope @ rotary_keys.transpose(-2, -1)  # (..., h, T)
    weights = masked_softmax(scores * scale, mask)  # (..., h, T)
    return torch.einsum("...ht,...htv->...hv", weights, values), weights  # (..., h, d_v)


def latent_scale(qk_head_dim, rope_scaling=None):
    """The scores' factor: qk_head_dim ** -0.5, times DeepSeek's YaRN mscale squared when the scaling
    has mscale_all_dim (0.1 mscale_all_dim ln(factor) + 1, for factor > 1), as transformers' DeepSeek does."""
    scale = qk_head_dim ** -0.5
    if rope_scaling is not None and rope_scaling.get("mscale_all_dim"):
        factor = rope_scaling["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * rope_scaling["mscale_all_dim"] * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    return scale


def deinterleave(x):
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...): DeepSeek's interleaved rotary pairs laid out
    as halves, so that rotate-half RoPE turns pair (x0, x1) where it turns (x_0, x_{d/2}). Queries and
    keys are permuted alike: their dot products do not change."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)  # (..., d)


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek's multi-head latent attention, with RoPE on a decoupled part, a `LatentCache`, the
    absorbed decoding step and, optionally, DeepSeek-V3.2's lightning indexer.

    Called as GroupedQueryAttention is: forward(x, mask=None, return_weights=False, *, causal=True,
    cache=None, positions=None) returns (out (..., T, d_model), weights (..., h, T, T_k) or None).
    Head i's query is [q_nope | q_rope] (d_nope + d_rope features), its key [c W_uk[i] | k_rope] with
    k_rope shared by the heads, its value c W_uv[i] (d_v features), c the latent of each token.

    q_lora_rank: None (queries straight from x, W_q) or the width of the queries' own compression
    (W_dq, an RMSNorm, W_uq); rope_interleave: RoPE turns pairs (x0, x1), (x2, x3) (DeepSeek's
    checkpoints) instead of halves; scale: default (d_nope + d_rope) ** -0.5, times YaRN's mscale
    squared (DeepSeek's mscale_all_dim); bias: on W_dq, W_dkv and W_o (transformers' attention_bias);
    indexer: dict(n_heads=, head_dim=, top_k=) adds a `LightningIndexer` and each query attends only
    to its top_k keys (needs q_lora_rank); absorbed: a cached step of one token decodes in the
    absorbed form (`absorbed_latent_decode`); a prompt always runs in the expanded form.
    """

    def __init__(self, d_model, n_heads, *, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 q_lora_rank=None, rope_base=10000.0, rope_scaling=None, rope_interleave=False, norm_eps=1e-6,
                 scale=None, bias=False, indexer=None, absorbed=True, device=None, dtype=None):
        super().__init__()
        sizes = dict(d_model=d_model, n_heads=n_heads, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
                     qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim)
        for name, value in sizes.items():
            setattr(self, name, validate.check_int(name, value))
        self.q_lora_rank = None if q_lora_rank is None else validate.check_int("q_lora_rank", q_lora_rank)
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={qk_rope_head_dim} is odd, but RoPE turns features in pairs")
        for name, flag in (("rope_interleave", rope_interleave), ("absorbed", absorbed), ("bias", bias)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.rope_interleave, self.absorbed = rope_interleave, absorbed
        self.rope_scaling = rope_scaling_module.check_rope_scaling(rope_scaling)
        self.rope_base = validate.check_base(rope_base)
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.scale = latent_scale(qk_head_dim, self.rope_scaling) if scale is None else validate.check_scale(scale)
        options = dict(device=device, dtype=dtype)
        if q_lora_rank is None:
            self.W_q = nn.Linear(d_model, n_heads * qk_head_dim, bias=False, **options)
        else:
            self.W_dq = nn.Linear(d_model, q_lora_rank, bias=bias, **options)  # down to the query's latent
            self.q_norm = RMSNorm(q_lora_rank, eps=norm_eps, **options)
            self.W_uq = nn.Linear(q_lora_rank, n_heads * qk_head_dim, bias=False, **options)  # up to the heads
        self.W_dkv = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias, **options)  # latent | rotary key
        self.kv_norm = RMSNorm(kv_lora_rank, eps=norm_eps, **options)
        self.W_ukv = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False, **options)
        self.W_o = nn.Linear(n_heads * v_head_dim, d_model, bias=bias, **options)
        self.rotary = RotaryTables(qk_rope_head_dim, self.rope_base, self.rope_scaling)
        self.indexer = None if indexer is None else self.make_indexer(indexer, norm_eps, options)

    def make_indexer(self, indexer, norm_eps, options):
        if not isinstance(indexer, dict) or set(indexer) != {"n_heads", "head_dim", "top_k"}:
            raise ValueError(f"indexer must be None or dict(n_heads=..., head_dim=..., top_k=...), got {indexer!r}")
        if self.q_lora_rank is None:
            raise ValueError("the lightning indexer reads the compressed query: give q_lora_rank too")
        return LightningIndexer(self.d_model, self.q_lora_rank, rope_head_dim=self.qk_rope_head_dim, **indexer,
                                **options)

    def new_cache(self):
        """An empty `LatentCache` for this layer."""
        return LatentCache()

    def numpy_params(self):
        """The weights as `mha.numpy.latent_attention` takes them: row vectors (W of shape (d_in, d_out)),
        biases only where the layer has them."""
        def array(t):
            return t.detach().cpu().numpy()

        linears = {"W_q": "W_q", "W_dq": "W_dq", "W_uq": "W_uq", "W_dkv": "W_dkv", "W_ukv": "W_ukv", "W_o": "W_o"}
        if self.indexer is not None:
            linears.update({"W_iq": "indexer.W_q", "W_ik": "indexer.W_k", "W_iw": "indexer.W_w"})
        params = {}
        for name, path in linears.items():
            layer = self.get_submodule(path) if hasattr(self, path.split(".")[0]) else None
            if layer is None:
                continue
            params[name] = array(layer.weight).T  # (d_in, d_out)
            if layer.bias is not None:
                params["b" + name[1:]] = array(layer.bias)
        params["kv_norm"] = array(self.kv_norm.weight)
        if self.q_lora_rank is not None:
            params["q_norm"] = array(self.q_norm.weight)
        if self.indexer is not None:
            params["k_norm_weight"], params["k_norm_bias"] = (array(self.indexer.k_norm.weight),
                                                              array(self.indexer.k_norm.bias))
        return params

    def forward(self, x, mask=None, return_weights=False, *, causal=True, cache=None, positions=None):
        """x: (..., T, d_model). mask: booleans broadcasting to (..., h, T, T_k), T_k the positions held
        after this call. positions: integer (..., T), RoPE's positions (default cache.position onwards)."""
        check_input(self, "x", x, self.d_model, weight=self.W_dkv.weight)
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"cache must be a mha.torch.LatentCache (from new_cache()), got {type(cache).__name__}")
        T_past, start = (0, 0) if cache is None else (len(cache), cache.position)
        q_nope, q_rope, q_low = self.queries(x)  # (..., h, T, d_nope), (..., h, T, d_rope), (..., T, q_lora)
        latents, rotary_keys = self.compress(x)  # (..., T, r), (..., 1, T, d_rope)
        q_rope, rotary_keys = self.rotary.rotate(q_rope, rotary_keys, start, positions)
        rotary_keys = rotary_keys.squeeze(-3)  # (..., T, d_rope)
        indexer_keys = None if self.indexer is None else self.indexer.keys(x, self.rotary, start, positions)
        if cache is not None:
            latents, rotary_keys, indexer_keys = cache.append(latents, rotary_keys, indexer_keys)  # (..., T_k, .)
        if self.indexer is not None:
            scores = self.indexer(x, q_low, indexer_keys, self.rotary, start, positions)  # (..., T, T_k)
            mask = self.restrict_to_selected(scores, mask, causal, T_past)
        if cache is not None and x.shape[-2] == 1 and self.absorbed:
            out, weights = self.absorbed_step(q_nope, q_rope, latents, rotary_keys, mask)
            weights = weights if return_weights else None
        else:
            out, weights = self.expanded_attention(q_nope, q_rope, latents, rotary_keys, mask, causal, T_past,
                                                   return_weights)
        return self.W_o(merge_heads(out)), weights  # (..., T, d_model)

    def queries(self, x):
        """q_nope (..., h, T, d_nope), q_rope (..., h, T, d_rope) (not yet rotated), and the compressed
        query (..., T, q_lora_rank) (None without q_lora_rank), which the indexer reads."""
        q_low = None if self.q_lora_rank is None else self.q_norm(self.W_dq(x))  # (..., T, q_lora_rank)
        q = self.W_q(x) if q_low is None else self.W_uq(q_low)  # (..., T, h * (d_nope + d_rope))
        q_nope, q_rope = split_heads(q, self.n_heads).split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, self.pairs_as_halves(q_rope), q_low

    def compress(self, x):
        """The latents (..., T, r) (normed) and the shared rotary keys (..., 1, T, d_rope) (not yet rotated)."""
        latents, rotary_keys = self.W_dkv(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_norm(latents), self.pairs_as_halves(rotary_keys).unsqueeze(-3)  # (..., T, r), (..., 1, T, d)

    def pairs_as_halves(self, x):
        return deinterleave(x) if self.rope_interleave else x

    def up_projections(self):
        """W_uk (h, r, d_nope) and W_uv (h, r, d_v): head i's keys without RoPE are latents @ W_uk[i],
        its values latents @ W_uv[i] (W_ukv's rows, per head [keys | values], transposed)."""
        per_head = self.W_ukv.weight.view(self.n_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        W_uk, W_uv = per_head.split([self.qk_nope_head_dim, self.v_head_dim], dim=-2)  # (h, d_nope, r), (h, d_v, r)
        return W_uk.transpose(-2, -1), W_uv.transpose(-2, -1)  # (h, r, d_nope), (h, r, d_v)

    def expand(self, latents):
        """Every head's keys without RoPE (..., h, T_k, d_nope) and values (..., h, T_k, d_v)."""
        per_head = split_heads(self.W_ukv(latents), self.n_heads)  # (..., h, T_k, d_nope + d_v)
        return per_head.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)

    def expanded_attention(self, q_nope, q_rope, latents, rotary_keys, mask, causal, T_past, return_weights):
        """Attention with every head's keys and values formed: the prompt's form (and transformers')."""
        keys_nope, values = self.expand(latents)  # (..., h, T_k, d_nope), (..., h, T_k, d_v)
        shared = rotary_keys.unsqueeze(-3).expand(*keys_nope.shape[:-1], self.qk_rope_head_dim)  # (..., h, T_k, d_rope)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (..., h, T, d_nope + d_rope)
        keys = torch.cat([keys_nope, shared], dim=-1)  # (..., h, T_k, d_nope + d_rope)
        d_k, d_v = keys.shape[-1], values.shape[-1]
        if return_weights or d_k == d_v:
            return grouped_attention(q, keys, values, T_past, causal=causal, mask=mask, scale=self.scale,
                                     return_weights=return_weights)
        # PyTorch's fused kernels take one width for queries, keys and values (else its slow unfused form runs):
        # zeros added to the narrower side change no score and no output feature (the scale is explicit).
        width = max(d_k, d_v)
        q, keys, values = (F.pad(a, (0, width - a.shape[-1])) for a in (q, keys, values))  # (..., ., width)
        out, _ = grouped_attention(q, keys, values, T_past, causal=causal, mask=mask, scale=self.scale)
        return out[..., :d_v], None  # (..., h, T, d_v)

    def absorbed_step(self, q_nope, q_rope, latents, rotary_keys, mask):
        """One new token per sequence over the held latents, in the absorbed form. Returns out
        (..., h, 1, d_v) and weights (..., h, 1, T_k). One query sees every held key: no causal mask."""
        *batch, h, _, _ = q_nope.shape
        if mask is not None:
            check_mask_tensor(mask, (*batch, h, 1, latents.shape[-2]), like=q_nope)
            mask = torch.broadcast_to(mask, (*batch, h, 1, latents.shape[-2]))[..., 0, :]  # (..., h, T_k)
        W_uk, W_uv = self.up_projections()  # (h, r, d_nope), (h, r, d_v)
        out, weights = absorbed_latent_decode(q_nope[..., 0, :], q_rope[..., 0, :], latents, rotary_keys, W_uk, W_uv,
                                              self.scale, mask)  # (..., h, d_v), (..., h, T_k)
        return out.unsqueeze(-2), weights.unsqueeze(-2)

    def restrict_to_selected(self, scores, mask, causal, T_past):
        """`mask` and the indexer's choice: each query's top_k keys among those it may see (causality
        and the mask, whose heads are merged: the indexer chooses once per query, for every head)."""
        T, T_k = scores.shape[-2:]
        allowed = causal_mask_after(T, T_past, scores.device) if causal else None  # (T, T_k)
        if mask is not None:
            check_mask_tensor(mask, (*scores.shape[:-2], self.n_heads, T, T_k), like=scores)
            merged = mask.any(dim=-3) if mask.dim() >= 3 else mask  # (..., T or 1, T_k)
            allowed = merged if allowed is None else merged & allowed
        selected = self.indexer.select(scores, allowed).unsqueeze(-3)  # (..., 1, T, T_k)
        return selected if mask is None else mask & selected
