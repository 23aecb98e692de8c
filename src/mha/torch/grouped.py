"""Grouped-query attention with rotary positions and a key-value cache: the attention of
Llama, Mistral, Qwen2 and Gemma 1. The PyTorch face of `mha.numpy.grouped`.

`GroupedQueryAttention.from_llama` copies a Hugging Face `LlamaAttention` (or Mistral's, Qwen's,
Gemma's, OLMo's); the module then computes what it computes (tests/test_grouped_llama.py and
tests/test_loader_refusals.py prove it), and a layer it cannot compute is refused (`mha.torch.hf`).
"""

import torch
import torch.nn.functional as F
from torch import nn

from mha import rope_scaling as rope_scaling_module
from mha import validate
from mha.torch.attention import linear_bias, linear_weight, merge_heads, scaled_dot_product_attention, split_heads
from mha.torch.cache import KVCache
from mha.torch.hf import configuration as hf_configuration
from mha.torch.hf import weights as hf_weights
from mha.torch.parts import RMSNorm
from mha.torch.rotary import RotaryTables, apply_rotary, rotary_embedding, rotated_by_signed_sin
from mha.torch.sinks import attention_with_sinks, sink_softmax  # noqa: F401 (sink_softmax: mt's name)
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


def causal_mask_after(T_new, T_past, device=None, *, window=None):
    """(T_new, T_past + T_new) boolean: new query t (at position T_past + t) sees every cached
    key and the new keys up to itself; with `window`, only the last `window` of them (itself included)."""
    T_new, T_past = validate.check_int("T_new", T_new), validate.check_int("T_past", T_past, minimum=0)
    mask = torch.ones(T_new, T_past + T_new, dtype=torch.bool, device=device).tril(diagonal=T_past)
    if window is None:
        return mask
    window = validate.check_int("window", window)
    return mask.triu(diagonal=T_past - window + 1)  # key j > position - window


def sliding_window_mask(T, window, device=None):
    """(T, T) boolean: query t sees keys t - window + 1 .. t (Mistral's and Gemma's sliding window)."""
    return causal_mask_after(T, 0, device, window=window)


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
    validate.check_group_sizes(q.shape[-3], k.shape[-3])
    T_past, T_new = len(cache), q.shape[-2]
    if rope_base is not None:
        cos, sin = rotary_embedding(T_new, q.shape[-1], rope_base, offset=T_past, dtype=q.dtype,
                                    device=q.device)  # (T_new, d_head)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    keys, values = cache.append(k, v)  # (..., h_kv, T_past + T_new, d_head)
    out, weights = grouped_attention(q, keys, values, T_past, causal=causal, mask=mask,
                                     return_weights=return_weights)
    return out, weights, keys, values


def grouped_attention(q, keys, values, T_past, *, causal=False, mask=None, window=None, scale=None, logit_cap=None,
                      return_weights=False, sinks=None):
    """Attention of the new queries over the held keys, the last T_new of which are the queries' own.

    q: (..., h, T_new, d_head); keys, values: (..., h_kv, T_past + T_new, d_head), rotated.
    causal: query t sees the T_past held keys and the new ones up to itself; `window` keeps only
    the last `window` of those. `mask` (..., h, T_new, T_past + T_new) must allow a key too.
    `scale` replaces d_head ** -0.5; `logit_cap` soft-caps the scores (then the explicit form runs,
    as it does for `return_weights`); `sinks` (h,) adds gpt-oss's logit per head to each row's
    denominator (`sink_softmax`, explicit form). Returns out (..., h, T_new, d_head) and the weights or None.
    """
    n_rep, T_new, T_k = q.shape[-3] // keys.shape[-3], q.shape[-2], keys.shape[-2]
    if mask is not None:
        check_mask_tensor(mask, (*q.shape[:-2], T_new, T_k), like=q)
        mask = at_least_2d(mask)  # (1, 1) or (1, T_k) for a 0-D or 1-D mask: a shape the fused kernel takes
    explicit = return_weights or logit_cap is not None or sinks is not None or \
        any(map(under_transform, (q, keys, values)))
    kernel_causal = causal and mask is None and T_past == 0 and window is None and not explicit
    needs_window = window is not None and T_k > window  # a single new query's window can hold every key
    if causal and not kernel_causal and (T_new > 1 or needs_window):
        causal_part = causal_mask_after(T_new, T_past, q.device, window=window)  # (T_new, T_past + T_new)
        mask = causal_part if mask is None else mask & causal_part
    if sinks is not None:
        return attention_with_sinks(q, repeat_kv(keys, n_rep), repeat_kv(values, n_rep), mask, sinks, scale=scale,
                                    logit_cap=logit_cap)
    if explicit:
        return scaled_dot_product_attention(q, repeat_kv(keys, n_rep), repeat_kv(values, n_rep), mask,
                                            scale=scale, logit_cap=logit_cap)
    if T_new == 1 and n_rep > 1:  # one new token: a single query per head sees every held key
        return one_query_per_head(q, keys, values, mask, scale), None
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=kernel_causal, scale=scale,
                                         enable_gqa=n_rep > 1)  # (..., h, T_new, d_head)
    return out, None


def one_query_per_head(q, keys, values, mask=None, scale=None):
    """Attention of one new query per head, (..., h, 1, d_head), over grouped keys and values
    (..., h_kv, T_k, d_head), with no causal mask to apply: the n_rep query heads of a group become
    n_rep queries of its key/value head. Every key is then read once per group, where PyTorch's
    enable_gqa repeats the keys and values n_rep times (transformers' pack_gqa does the same).
    mask: booleans broadcasting to (..., h, 1, T_k). Returns out (..., h, 1, d_head)."""
    *batch, h, _, d_head = q.shape
    h_kv = keys.shape[-3]
    q = q.reshape(*batch, h_kv, h // h_kv, d_head)  # (..., h_kv, n_rep, d_head): head j is group j // n_rep
    if mask is not None and mask.dim() >= 3 and mask.shape[-3] == h:  # one mask row per head
        mask = mask.reshape(*mask.shape[:-3], h_kv, h // h_kv, mask.shape[-1])  # (..., h_kv, n_rep, T_k)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)  # (..., h_kv, n_rep, d_head)
    return out.reshape(*batch, h, 1, d_head)  # (..., h, 1, d_head)


class GroupedQueryAttention(nn.Module):
    """n_heads query heads sharing n_kv_heads key/value heads, with optional RoPE and a KV cache.

    n_kv_heads == n_heads is multi-head attention; n_kv_heads == 1 multi-query attention.
    d_head defaults to d_model // n_heads. forward(x, mask=None, return_weights=False, *,
    causal=False, cache=None, positions=None) returns (out, weights or None); x: (..., T, d_model).

    The features of today's models, each off by default:
    - rope_scaling: a dict as transformers' rope_parameters (linear, dynamic, yarn, llama3);
    - qk_norm: "head" (an RMSNorm of width d_head on every query and key head: Qwen3, Gemma 3)
      or "all" (one over all heads' queries, one over all keys, before the split: OLMo 2), with
      norm_eps, and norm_unit_offset=True for Gemma's (1 + w);
    - scale: the scores' factor instead of d_head ** -0.5 (Gemma's query_pre_attn_scalar ** -0.5);
    - logit_cap: scores become logit_cap * tanh(scores / logit_cap) (Gemma 2);
    - sliding_window: a causal query sees only the last sliding_window positions, itself included
      (Mistral; Gemma's sliding layers); a cache then keeps only the last sliding_window - 1;
    - sinks: a learned logit per head, the parameter `sinks` (h,), in each row's softmax denominator
      (gpt-oss, 2025; `sink_softmax`): a head may give most of its attention to no token;
    - output_gate: Qwen3-Next's gated attention (Qiu et al., 2025): W_q makes, per head, the query and
      a gate of d_head features ([query | gate], 2 * d_head outputs a head); the heads' outputs are
      multiplied by sigmoid(gate) before W_o;
    - rotary_dim: RoPE on the first rotary_dim features of each query and key head only, the others
      unturned (Qwen3-Next's partial_rotary_factor, halves rotated as Llama's); default all d_head;
    - own_kv=False: the layer has no W_k, W_v and attends to the keys and values of an earlier layer,
      given as `shared_kv` (cross-layer KV sharing: Brandon et al., 2024; Gemma 3n's shared layers).
    `new_cache()` is a KVCache for this layer (None for a layer that makes no keys).
    """

    def __init__(self, d_model, n_heads, n_kv_heads, *, d_head=None, bias=False, rope_base=None,
                 rope_scaling=None, qk_norm=None, norm_eps=1e-6, norm_unit_offset=False, scale=None,
                 logit_cap=None, sliding_window=None, sinks=False, output_gate=False, own_kv=True, rotary_dim=None,
                 device=None, dtype=None):
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
        if rope_scaling is not None and self.rope_base is None:
            raise ValueError("rope_scaling scales RoPE's frequencies: give rope_base too")
        self.rope_scaling = rope_scaling_module.check_rope_scaling(rope_scaling)
        self.scale = validate.check_scale(scale)
        self.logit_cap = None if logit_cap is None else validate.check_cap(logit_cap)
        self.sliding_window = None if sliding_window is None else validate.check_int("sliding_window", sliding_window)
        for name, flag in (("sinks", sinks), ("output_gate", output_gate), ("own_kv", own_kv)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.output_gate, self.own_kv = output_gate, own_kv
        options = dict(bias=bias, device=device, dtype=dtype)
        self.W_q = nn.Linear(d_model, n_heads * d_head * (2 if output_gate else 1), **options)  # [query | gate] a head
        self.W_k = nn.Linear(d_model, n_kv_heads * d_head, **options) if own_kv else None
        self.W_v = nn.Linear(d_model, n_kv_heads * d_head, **options) if own_kv else None
        self.W_o = nn.Linear(n_heads * d_head, d_model, **options)
        self.sinks = nn.Parameter(torch.zeros(n_heads, device=device, dtype=dtype)) if sinks else None
        if qk_norm not in (None, "head", "all"):
            raise ValueError(f'qk_norm must be None, "head" (per head, Qwen3 and Gemma 3) or "all" (over all '
                             f'heads, OLMo 2), got {qk_norm!r}')
        self.qk_norm = qk_norm
        if qk_norm is not None:
            widths = (d_head, d_head) if qk_norm == "head" else (n_heads * d_head, n_kv_heads * d_head)
            norm = dict(eps=norm_eps, unit_offset=norm_unit_offset, device=device, dtype=dtype)
            self.q_norm, self.k_norm = RMSNorm(widths[0], **norm), RMSNorm(widths[1], **norm)
        self.rotary_dim = d_head if rotary_dim is None else validate.check_int("rotary_dim", rotary_dim)
        if rotary_dim is not None and (rotary_dim > d_head or rotary_dim % 2 or self.rope_base is None):
            raise ValueError(f"rotary_dim must be even, at most d_head={d_head}, and come with rope_base, "
                             f"got rotary_dim={rotary_dim}, rope_base={rope_base}")
        self.rotary = None if self.rope_base is None else \
            RotaryTables(self.rotary_dim, self.rope_base, self.rope_scaling)

    def forward(self, x, mask=None, return_weights=False, *, causal=False, cache=None, positions=None,
                shared_kv=None):
        """x: (..., T, d_model). mask: booleans broadcasting to (..., h, T, T_k), T_k the keys held
        after this call (with a cache: its held positions, then the T new ones). positions: integer
        (..., T), the RoPE positions of the new tokens (default cache.position + 0 .. T - 1).
        shared_kv: for a layer without its own keys (own_kv=False), what `forward_with_kv` of the layer
        it shares with returned this call."""
        out, weights, _ = self.forward_with_kv(x, mask, return_weights, causal=causal, cache=cache,
                                               positions=positions, shared_kv=shared_kv)
        return out, weights

    def new_cache(self):
        """An empty KVCache for this layer's keys and values; None if it makes none (own_kv=False)."""
        return KVCache() if self.own_kv else None

    def forward_with_kv(self, x, mask=None, return_weights=False, *, causal=False, cache=None, positions=None,
                        shared_kv=None):
        """As `forward`, and also the keys and values it attended to: (out, weights, shared) with shared =
        (keys, values, start), keys and values (..., h_kv, T_held, d_head) (rotated; all held before this
        call's window trim, the T new ones last) and start the position of the first new token, which a
        later layer sharing them (own_kv=False) takes as its `shared_kv`."""
        check_input(self, "x", x, self.d_model, weight=self.W_q.weight)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a mha.torch.KVCache, got {type(cache).__name__}")
        if not self.own_kv:
            return self.attend_shared(x, mask, return_weights, causal, positions, shared_kv)
        if shared_kv is not None:
            raise ValueError("shared_kv is for a layer without its own keys and values (own_kv=False)")
        q, gate, k, v = self.project_gated(x)  # (..., h, T, d_head), gate (..., T, h * d_head) or None, k, v
        T_past = 0 if cache is None else len(cache)
        start = 0 if cache is None else cache.position
        if self.rotary is not None:  # apply_rotary with this layer's stored tables
            q, k = self.turn(q, k, start, positions)
        elif positions is not None:
            raise ValueError("positions are RoPE's positions, but this layer has no RoPE (rope_base=None)")
        keys, values = (k, v) if cache is None else cache.append(k, v)  # (..., h_kv, T_past + T, d_head)
        out, weights = grouped_attention(q, keys, values, T_past, causal=causal, mask=mask, window=self.sliding_window,
                                         scale=self.scale, logit_cap=self.logit_cap, return_weights=return_weights,
                                         sinks=self.sinks)
        if cache is not None and self.sliding_window is not None:
            cache.keep_last(self.sliding_window - 1)  # the next query's window holds these and itself
        return self.output(out, gate), weights, (keys, values, start)

    def attend_shared(self, x, mask, return_weights, causal, positions, shared_kv):
        """The queries of x over an earlier layer's keys and values, shared_kv = (keys, values, start)."""
        if not (isinstance(shared_kv, tuple) and len(shared_kv) == 3):
            raise ValueError("this layer has no W_k, W_v (own_kv=False): give shared_kv=(keys, values, start), what "
                             f"the layer it shares with returned from forward_with_kv, got {type(shared_kv).__name__}")
        keys, values, start = shared_kv
        q, gate = self.queries(x)  # (..., h, T, d_head), (..., T, h * d_head) or None
        if self.rotary is not None:
            q, _ = self.turn(q, None, start, positions)
        elif positions is not None:
            raise ValueError("positions are RoPE's positions, but this layer has no RoPE (rope_base=None)")
        T_past = keys.shape[-2] - q.shape[-2]  # the new tokens' keys are the last ones held
        out, weights = grouped_attention(q, keys, values, T_past, causal=causal, mask=mask, window=self.sliding_window,
                                         scale=self.scale, logit_cap=self.logit_cap, return_weights=return_weights,
                                         sinks=self.sinks)
        return self.output(out, gate), weights, shared_kv

    def turn(self, q, k, start, positions):
        """q and k (None: q alone) turned by RoPE at positions start .. (or `positions`): all d_head features,
        or the first rotary_dim of them (partial RoPE), the others passed through."""
        r = self.rotary_dim
        cos, signed_sin = self.rotary.rows(q.shape[-2], start, positions, q.dtype, q.device, signed=True)
        turned = []
        for a in (q, k):
            if a is None:
                turned.append(None)
            elif r == self.d_head:
                turned.append(rotated_by_signed_sin(a, cos, signed_sin))
            else:
                turned.append(torch.cat([rotated_by_signed_sin(a[..., :r], cos, signed_sin), a[..., r:]], dim=-1))
        return turned

    def output(self, out, gate):
        """The heads' outputs (..., h, T, d_head), merged, gated (output_gate), through W_o: (..., T, d_model)."""
        out = merge_heads(out)  # (..., T, h * d_head)
        if gate is not None:
            out = out * torch.sigmoid(gate)  # Qwen3-Next: each head's output, feature by feature
        return self.W_o(out)  # (..., T, d_model)

    def queries(self, x):
        """Queries (..., h, T, d_head), QK-normed if asked, and the output gate (..., T, h * d_head) or None."""
        q, gate = self.W_q(x), None  # (..., T, h * d_head), or (..., T, h * 2 * d_head) with the gate
        if self.output_gate:
            *batch, T, _ = q.shape
            q, gate = q.view(*batch, T, self.n_heads, 2 * self.d_head).chunk(2, dim=-1)  # (..., T, h, d_head) each
            q = q.reshape(*batch, T, self.n_heads * self.d_head)  # (..., T, h * d_head)
            gate = gate.reshape(*batch, T, self.n_heads * self.d_head)  # (..., T, h * d_head)
        if self.qk_norm == "all":
            q = self.q_norm(q)
        q = split_heads(q, self.n_heads)  # (..., h, T, d_head)
        if self.qk_norm == "head":
            q = self.q_norm(q)
        return q, gate

    def project_gated(self, x):
        """Queries, the output gate (or None), keys and values: see `queries` and `project`."""
        q, gate = self.queries(x)
        k = self.W_k(x)  # (..., T, h_kv * d_head)
        if self.qk_norm == "all":
            k = self.k_norm(k)
        k = split_heads(k, self.n_kv_heads)  # (..., h_kv, T, d_head)
        if self.qk_norm == "head":
            k = self.k_norm(k)
        return q, gate, k, split_heads(self.W_v(x), self.n_kv_heads)  # (..., h_kv, T, d_head)

    def project(self, x):
        """Queries (..., h, T, d_head), keys and values (..., h_kv, T, d_head), QK-normed if asked
        (without the output gate: `project_gated` returns it too)."""
        q, _, k, v = self.project_gated(x)
        return q, k, v

    @classmethod
    def from_llama(cls, attention, rope_base=10000.0):
        """A copy of a Hugging Face decoder attention layer (same device and dtype): its q_proj,
        k_proj, v_proj, o_proj, and q_norm, k_norm where it has them. The rotary embedding lives
        outside the layer: give its base (the layer's rope_theta) as `rope_base`, and the config's
        RoPE scaling for this layer is read; rope_base=None copies the projections without RoPE.

        Proven equal, each by a test against Hugging Face on a tiny random config: Llama, Mistral
        (its window), Qwen2 (biases on q, k and v; use_sliding_window), Qwen3 (q_norm, k_norm per
        head), OLMo 2 (over all heads), Gemma 1, Gemma 2 (query_pre_attn_scalar, soft-capping,
        sliding layers), Gemma 3 (a RoPE per layer type), OLMo 1 without clip_qkv, OLMo 3 (its sliding
        layers), gpt-oss (sinks, sliding layers), Qwen3-Next's full-attention layer (output gate,
        partial RoPE), and RoPE scaling (linear, dynamic, YaRN, Llama 3). Refused with a ValueError
        naming the feature, each tested: clip_qkv (OLMo 1), GLM's partial RoPE (another layout), other
        RoPE types, unknown norms. Hugging Face's layouts are read in `mha.torch.hf`
        (from_transformers reads a whole model's layers the same way)."""
        arguments = hf_configuration.attention_arguments(attention, rope_base)  # sizes and features, or refused
        q_proj = attention.q_proj  # (n_heads * d_head, d_model), as nn.Linear stores it
        ours = cls(q_proj.in_features, **arguments, device=q_proj.weight.device, dtype=q_proj.weight.dtype)
        hf_weights.copy_attention(ours, attention)  # q_proj, k_proj, v_proj, o_proj into W_q, W_k, W_v, W_o
        ours.refused_dropout = hf_configuration.dropouts(getattr(attention, "config", None))  # train() names them
        return ours.train(attention.training)

    def train(self, mode=True):
        """As nn.Module's; but a copy of a layer with attention dropout (`from_llama`) refuses training mode: it
        computes without dropout, and would be silently different from the layer it copies."""
        if mode and getattr(self, "refused_dropout", None):
            raise ValueError(f"cannot train this copy: the layer it copies has dropout "
                             f"({', '.join(self.refused_dropout)}), which GroupedQueryAttention does not compute. "
                             f"Use eval(), or copy a layer whose "
                             f"attention_dropout is 0")
        return super().train(mode)

    def numpy_params(self):
        """The keyword arguments of `mha.numpy.grouped_query_attention`, in the row-vector convention:
        grouped_query_attention(X, **module.numpy_params()) computes what the module computes (sinks, the
        output gate as W_g and b_g, a partial RoPE as rotary_dim). A layer without its own keys (own_kv=False)
        is refused: the NumPy face has no shared keys."""
        if not self.own_kv:
            raise ValueError("mha.numpy.grouped_query_attention does not compute own_kv=False (shared keys)")
        layers = {"q": self.W_q, "k": self.W_k, "v": self.W_v, "o": self.W_o}
        params = {f"W_{n}": linear_weight(layer) for n, layer in layers.items()}
        params.update({f"b_{n}": linear_bias(layer) for n, layer in layers.items()})
        if self.output_gate:  # W_q's rows are, per head, [query | gate]: split into W_q and W_g
            W = params["W_q"].reshape(self.d_model, self.n_heads, 2, self.d_head)  # (d_model, h, 2, d_head)
            params["W_q"], params["W_g"] = (W[:, :, i].reshape(self.d_model, -1) for i in (0, 1))
            if params["b_q"] is not None:
                b = params["b_q"].reshape(self.n_heads, 2, self.d_head)  # (h, 2, d_head)
                params["b_q"], params["b_g"] = b[:, 0].reshape(-1), b[:, 1].reshape(-1)
        if self.sinks is not None:
            params["sinks"] = self.sinks.detach().cpu().numpy()
        if self.rotary_dim < self.d_head:
            params["rotary_dim"] = self.rotary_dim
        params.update(n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, rope_base=self.rope_base,
                      rope_scaling=self.rope_scaling, scale=self.scale, logit_cap=self.logit_cap,
                      sliding_window=self.sliding_window)
        if self.qk_norm is not None:
            params.update(q_norm=self.q_norm.weight.detach().cpu().numpy(),
                          k_norm=self.k_norm.weight.detach().cpu().numpy(),
                          norm_eps=self.q_norm.eps, norm_unit_offset=self.q_norm.unit_offset)
        return params
