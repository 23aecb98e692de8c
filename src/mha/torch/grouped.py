"""Grouped-query attention with rotary positions and a key-value cache: the attention of
Llama, Mistral, Qwen2 and Gemma 1. The PyTorch face of `mha.numpy.grouped`.

`GroupedQueryAttention.from_llama` copies a Hugging Face `LlamaAttention` (or Mistral's, Qwen2's,
Gemma 1's); the module then computes what it computes (tests/test_grouped_llama.py and
tests/test_loader_refusals.py prove it), and a layer it cannot compute is refused (`hf_config`).
"""

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.attention import linear_bias, linear_weight, merge_heads, scaled_dot_product_attention, split_heads
from mha.torch.cache import KVCache
from mha.torch.hf_config import check_computable, sliding_window
from mha.torch.rotary import apply_rotary, rotary_embedding
from mha.torch.tensors import at_least_2d, check_input, check_mask_tensor, check_tensor, under_transform


def repeat_kv(x, n_rep):
    """(..., h_kv, T, d) -> (..., h_kv * n_rep, T, d): output head j is input head j // n_rep,
    as `x.repeat_interleave(n_rep, dim=-3)` and Llama's own `repeat_kv`."""
    check_tensor("x", x)
    validate.check_ndim("x", x, 3)
    n_rep = validate.check_int("n_rep", n_rep)
    *batch, h_kv, T, d = x.shape
    x = x[..., None, :, :].expand(*batch, h_kv, n_rep, T, d)  # (..., h_kv, n_rep, T, d), a view
    return x.reshape(*batch, h_kv * n_rep, T, d)  # (..., h_kv * n_rep, T, d)


def causal_mask_after(T_new, T_past, device=None):
    """(T_new, T_past + T_new) boolean: new query t (at position T_past + t) sees every cached
    key and the new keys up to itself."""
    T_new, T_past = validate.check_int("T_new", T_new), validate.check_int("T_past", T_past, minimum=0)
    return torch.ones(T_new, T_past + T_new, dtype=torch.bool, device=device).tril(diagonal=T_past)


def attend_with_cache(q, k, v, past_keys=None, past_values=None, *, causal=False, mask=None, rope_base=None,
                      return_weights=True):
    """One attention step after T_past cached positions, with grouped heads.

    q: (..., h, T_new, d_head), new queries; k, v: (..., h_kv, T_new, d_head), new keys and
    values, not yet rotated; past_keys, past_values: (..., h_kv, T_past, d_head), already
    rotated, or None for an empty cache. The new positions are T_past .. T_past + T_new - 1:
    with `rope_base`, q and k turn by those positions. causal=True lets new query t see all
    cached keys and the new ones up to itself; `mask` (..., h, T_new, T_past + T_new) must
    allow a key too. Returns out (..., h, T_new, d_head), weights (..., h, T_new, T_past + T_new)
    (None unless `return_weights`; then PyTorch's fused kernel runs), and keys, values
    (..., h_kv, T_past + T_new, d_head), the cache to keep.
    """
    cache = KVCache()
    if (past_keys is None) != (past_values is None):
        raise ValueError("give both past_keys and past_values, or neither (an empty cache)")
    if past_keys is not None:
        cache.append(past_keys, past_values)
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, a)
        validate.check_ndim(name, a, 3)
    validate.check_cache_entries(cache.keys, cache.values, k, v)
    n_rep = validate.check_group_sizes(q.shape[-3], k.shape[-3])
    T_past, T_new = len(cache), q.shape[-2]
    if rope_base is not None:
        cos, sin = rotary_embedding(T_new, q.shape[-1], rope_base, offset=T_past, dtype=q.dtype,
                                    device=q.device)  # (T_new, d_head)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    keys, values = cache.append(k, v)  # (..., h_kv, T_past + T_new, d_head)
    if mask is not None:
        check_mask_tensor(mask, (*q.shape[:-2], T_new, len(cache)), like=q)
        mask = at_least_2d(mask)  # (1, 1) or (1, T_k) for a 0-D or 1-D mask: a shape the fused kernel takes
    explicit = return_weights or any(map(under_transform, (q, keys, values)))  # fused kernels: no forward AD
    kernel_causal = causal and mask is None and T_past == 0 and not explicit  # the kernel's own causal path
    if causal and not kernel_causal and T_new > 1:  # one new query sees everything: no mask needed
        causal_part = causal_mask_after(T_new, T_past, q.device)  # (T_new, T_past + T_new)
        mask = causal_part if mask is None else mask & causal_part
    if explicit:
        out, weights = scaled_dot_product_attention(q, repeat_kv(keys, n_rep), repeat_kv(values, n_rep), mask)
        return out, weights, keys, values
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=kernel_causal,
                                         enable_gqa=n_rep > 1)  # (..., h, T_new, d_head)
    return out, None, keys, values


class GroupedQueryAttention(nn.Module):
    """n_heads query heads sharing n_kv_heads key/value heads, with optional RoPE and a KV cache.

    n_kv_heads == n_heads is multi-head attention; n_kv_heads == 1 multi-query attention.
    d_head defaults to d_model // n_heads. forward(x, mask=None, return_weights=False, *,
    causal=False, cache=None) returns (out, weights or None); x: (..., T, d_model).
    `sliding_window` (Mistral's) is the most positions, cached and new, that forward accepts:
    beyond it a windowed layer would hide the oldest keys, which this one does not do.
    """

    def __init__(self, d_model, n_heads, n_kv_heads, *, d_head=None, bias=False, rope_base=None,
                 sliding_window=None, device=None, dtype=None):
        super().__init__()
        self.d_model = validate.check_int("d_model", d_model)
        self.n_rep = validate.check_group_sizes(n_heads, n_kv_heads)
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        if d_head is None:
            validate.check_divisible(d_model, n_heads)
            d_head = d_model // n_heads
        self.d_head = validate.check_int("d_head", d_head)
        self.rope_base = None if rope_base is None else validate.check_base(rope_base)
        if self.rope_base is not None and d_head % 2:
            raise ValueError(f"d_head={d_head} is odd, but rotary embeddings turn features in pairs: "
                             f"choose an even d_head, or rope_base=None")
        self.sliding_window = None if sliding_window is None else validate.check_int("sliding_window", sliding_window)
        options = dict(bias=bias, device=device, dtype=dtype)
        self.W_q = nn.Linear(d_model, n_heads * d_head, **options)
        self.W_k = nn.Linear(d_model, n_kv_heads * d_head, **options)
        self.W_v = nn.Linear(d_model, n_kv_heads * d_head, **options)
        self.W_o = nn.Linear(n_heads * d_head, d_model, **options)

    def forward(self, x, mask=None, return_weights=False, *, causal=False, cache=None):
        check_input(self, "x", x, self.d_model)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a mha.torch.KVCache, got {type(cache).__name__}")
        self.check_window(x.shape[-2], 0 if cache is None else len(cache))
        q = split_heads(self.W_q(x), self.n_heads)  # (..., h, T, d_head)
        k = split_heads(self.W_k(x), self.n_kv_heads)  # (..., h_kv, T, d_head)
        v = split_heads(self.W_v(x), self.n_kv_heads)  # (..., h_kv, T, d_head)
        past = (None, None) if cache is None else (cache.keys, cache.values)
        out, weights, keys, values = attend_with_cache(q, k, v, *past, causal=causal, mask=mask,
                                                       rope_base=self.rope_base, return_weights=return_weights)
        if cache is not None:
            cache.keys, cache.values = keys, values
        out = self.W_o(merge_heads(out))  # (..., T, d_model)
        return out, weights

    def check_window(self, T_new, T_past):
        """Refuse more positions than `sliding_window`, where a windowed layer would differ from ours."""
        if self.sliding_window is not None and T_past + T_new > self.sliding_window:
            raise ValueError(f"{T_past + T_new} positions ({T_past} cached + {T_new} new) exceed sliding_window="
                             f"{self.sliding_window}: a windowed layer would hide the oldest keys, and "
                             f"GroupedQueryAttention attends to all of them; expected at most "
                             f"{self.sliding_window} positions")

    @classmethod
    def from_llama(cls, attention, rope_base=10000.0):
        """A copy of a Hugging Face decoder attention layer's q_proj, k_proj, v_proj and o_proj
        (same device and dtype). The rotary embedding lives outside the layer: give its base
        (config.rope_theta) as `rope_base`; rope_base=None copies the projections without RoPE.

        Proven equal, each by a test against Hugging Face on a tiny random config:
        Llama (`LlamaAttention`), Mistral (its `sliding_window` becomes ours: forward refuses
        more positions than the window), Qwen2 (biases on q, k and v), Gemma 1 (head_dim other
        than d_model / n_heads), OLMo 1 without clip_qkv. Refused with a ValueError naming the
        feature, each tested: Qwen3 and OLMo2 (q_norm and k_norm), Gemma 2 (attn_logit_softcapping,
        and scores scaled by query_pre_attn_scalar ** -0.5), Gemma 3 (q_norm and k_norm, that
        scaling, a RoPE per layer type), any RoPE type but 'default' (Llama 3's, YaRN...),
        partial_rotary_factor (GLM), clip_qkv (OLMo 1), sinks (GPT-OSS), Qwen2's
        use_sliding_window. Other families are unproven. See `mha.torch.hf_config`."""
        layers = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        if not all(isinstance(layer, nn.Linear) for layer in layers):
            raise TypeError(f"expected a transformers LlamaAttention with q_proj, k_proj, v_proj and o_proj, "
                            f"got {type(attention).__name__}")
        check_computable(attention, rope_base)
        q_proj, k_proj, v_proj, o_proj = layers
        d_head = attention.head_dim
        weight = q_proj.weight
        ours = cls(q_proj.in_features, q_proj.out_features // d_head, k_proj.out_features // d_head,
                   d_head=d_head, bias=any(layer.bias is not None for layer in layers), rope_base=rope_base,
                   sliding_window=sliding_window(attention), device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for mine, theirs in zip((ours.W_q, ours.W_k, ours.W_v, ours.W_o), layers):
                mine.weight.copy_(theirs.weight)
                if theirs.bias is not None:
                    mine.bias.copy_(theirs.bias)
                elif mine.bias is not None:  # Qwen-style: biases on q, k, v only, none on o
                    mine.bias.zero_()
        return ours.train(attention.training)

    def numpy_params(self):
        """The keyword arguments of `mha.numpy.grouped_query_attention`, in the row-vector convention:
        grouped_query_attention(X, **module.numpy_params()) computes what the module computes."""
        layers = {"q": self.W_q, "k": self.W_k, "v": self.W_v, "o": self.W_o}
        params = {f"W_{n}": linear_weight(layer) for n, layer in layers.items()}
        params.update({f"b_{n}": linear_bias(layer) for n, layer in layers.items()})
        params.update(n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, rope_base=self.rope_base)
        return params
