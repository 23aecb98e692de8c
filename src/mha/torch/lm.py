"""Chapter 13: today's language models, whole, from the course's parts.

`TransformerLM` is one decoder-only model that becomes GPT-2, Llama, Mistral, Qwen2, Qwen3,
Gemma 2, Gemma 3 or OLMo 2 by its `LMConfig` (and, chapter 17, OLMo 3, gpt-oss, Qwen3-MoE, DeepSeek-V3 and
DeepSeek-V3.2: attention sinks, DeepSeek's latent attention, experts, and cross-layer KV sharing; chapter 18,
the hybrids Qwen3-Next and Qwen3.5, whose "linear" layers are Gated DeltaNets with a state of fixed size): token
embeddings (scaled by sqrt(d_model) in Gemma),
learned positions (GPT-2) or RoPE inside attention (the others), a stack of `LMBlock`s, a
final norm, an output layer (tied to the embeddings where the model ties them) and Gemma 2's
final soft-cap. Each block is a `GroupedQueryAttention` (or DeepSeek's `MultiHeadLatentAttention`, or a
`GatedDeltaNet` where `LMConfig.layer_types` says "linear") and a
feed-forward (`FeedForward` with tanh GELU for GPT-2, `GatedFeedForward` for the others, `MixtureOfExperts`
where the model routes tokens to experts), with its norms placed as the model
places them: before each sublayer (pre-norm: GPT-2, Llama), before and after it (Gemma 2
and 3), or after it (OLMo 2).

`from_transformers(model)` copies a Hugging Face causal LM into one (`mha.torch.hf` reads its
config and copies its weights); `numpy_params()` feeds `mha.numpy.transformer_lm`, which computes
the same logits.
"""

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.attention import linear_bias, linear_weight, soft_cap
from mha.torch.blocks import FeedForward
from mha.torch.cache import cache_bytes
from mha.torch.grouped import GroupedQueryAttention
from mha.torch.hf import configuration as hf_configuration
from mha.torch.hf import families as hf_families
from mha.torch.hf import weights as hf_weights
from mha.torch.lm_config import LMConfig
from mha.torch.lm_inputs import (
    check_attention_mask, check_cache, check_lm_tokens, check_positions, layer_mask, linear_keep, positions_from_mask,
)
from mha.torch.model import check_head_mask, check_prompt
from mha.torch.parts import GatedFeedForward, RMSNorm

def make_norm(config, device=None, dtype=None):
    if config.norm == "layer":
        return nn.LayerNorm(config.d_model, eps=config.norm_eps, device=device, dtype=dtype)
    return RMSNorm(config.d_model, config.norm_eps, unit_offset=config.norm_unit_offset, device=device, dtype=dtype)


class LMBlock(nn.Module):
    """Self-attention and a feed-forward, each added to the residual stream, with the norms
    where `config.norm_placement` puts them: x + sublayer(norm(x)) ("pre"),
    x + norm_out(sublayer(norm_in(x))) ("sandwich"), x + norm(sublayer(x)) ("post")."""

    def __init__(self, config, layer, *, device=None, dtype=None):
        super().__init__()
        options = dict(device=device, dtype=dtype)
        self.linear = config.is_linear(layer)
        self.linear_options = dict(config.linear_attention) if self.linear else None
        if self.linear:
            from mha.torch.delta import GatedDeltaNet  # chapter 18's layer, imported when used
            self.attention = GatedDeltaNet(config.d_model, **config.linear_attention, **options)
        elif config.attention_type == "latent":
            from mha.torch.latent import MultiHeadLatentAttention  # part of the same library, imported when used
            self.attention = MultiHeadLatentAttention(config.d_model, **config.layer(layer), **options)
        else:
            own = {} if config.kv_source(layer) == layer else {"own_kv": False}  # a sharer has no W_k, W_v
            self.attention = GroupedQueryAttention(config.d_model, **config.layer(layer), **own, **options)
        if config.has_experts(layer):
            from mha.torch.experts import MixtureOfExperts
            self.feed_forward = MixtureOfExperts(config.d_model, **config.experts, **options)
        elif config.feed_forward == "mlp_gelu_tanh":
            self.feed_forward = FeedForward(config.d_model, config.d_ff, activation="gelu_tanh", **options)
        else:
            self.feed_forward = GatedFeedForward(config.d_model, config.d_ff, activation=config.feed_forward,
                                                 **options)
        placement = config.norm_placement
        norm_in = placement in ("pre", "sandwich")
        norm_out = placement in ("sandwich", "post")
        self.attention_norm_in = make_norm(config, **options) if norm_in else None
        self.attention_norm_out = make_norm(config, **options) if norm_out else None
        self.feed_forward_norm_in = make_norm(config, **options) if norm_in else None
        self.feed_forward_norm_out = make_norm(config, **options) if norm_out else None

    def forward(self, x, mask=None, *, cache=None, positions=None, return_weights=False, shared_kv=None,
                return_kv=False, keep=None):
        """x: (..., T, d_model) -> (x, weights (..., h, T, T_k) or None). The attention is causal.
        KV sharing: shared_kv, an earlier layer's (keys, values, start), for a layer without its own;
        return_kv=True returns (x, weights, (keys, values, start)) of this layer's attention.
        A linear layer (GatedDeltaNet) takes keep, this call's padding (B, T) (True = real token) or None,
        instead of mask and positions; it has no weights (None) and its cache is its StateCache."""
        a = x if self.attention_norm_in is None else self.attention_norm_in(x)
        kv = None
        if self.linear:
            a, weights = self.attention(a, keep=keep, cache=cache), None  # (..., T, d_model)
        elif return_kv or shared_kv is not None:
            a, weights, kv = self.attention.forward_with_kv(a, mask, return_weights, causal=True, cache=cache,
                                                            positions=positions, shared_kv=shared_kv)
        else:
            a, weights = self.attention(a, mask, return_weights, causal=True, cache=cache, positions=positions)
        x = x + (a if self.attention_norm_out is None else self.attention_norm_out(a))  # (..., T, d_model)
        f = x if self.feed_forward_norm_in is None else self.feed_forward_norm_in(x)
        f = self.feed_forward(f)
        x = x + (f if self.feed_forward_norm_out is None else self.feed_forward_norm_out(f))  # (..., T, d_model)
        return (x, weights, kv) if return_kv else (x, weights)


class TransformerLM(nn.Module):
    """A decoder-only language model of today's kind: tokens (B, T) -> logits (B, T, vocab_size)
    (one sequence (T,) -> (T, vocab_size)).

    forward(tokens, attention_mask=None, *, position_ids=None, cache=None, return_weights=False,
    head_mask=None, last_only=False). attention_mask: (B, T_all), 1 for real tokens and 0 for padding,
    over the cached tokens and the new ones (T_all = cache position + T), as in transformers.
    position_ids: (B, T); default cache position + 0 .. T - 1, as transformers' forward (`generate`
    derives them from the mask). cache: `new_cache()` (or an empty list, filled), one KVCache per
    layer, which the forward fills; a layer with a sliding window keeps only its window; a linear layer
    (a hybrid's GatedDeltaNet) holds a StateCache of fixed size and gets this call's padding mask (its padded
    inputs zeroed, as transformers does; none for one decoded token).
    head_mask: booleans (n_layers, h), False switching a head off. last_only: the logits of the last
    position only, (B, 1, V): all that the next token needs (transformers' logits_to_keep=1).
    return_weights and head_mask are for models whose every layer is attention (a hybrid refuses them).
    """

    def __init__(self, config, *, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be a mha.torch.LMConfig, got {type(config).__name__}")
        self.config = config
        options = dict(device=device, dtype=dtype)
        self.embedding = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.padding_idx, **options)
        self.refused_dropout = []  # a copied model's dropout, not computed here: train() refuses it
        self.positions = None if config.max_positions is None else \
            nn.Embedding(config.max_positions, config.d_model, **options)
        self.blocks = nn.ModuleList(LMBlock(config, i, **options) for i in range(config.n_layers))
        self.kv_sources = tuple(config.kv_source(i) for i in range(config.n_layers))
        self.kv_shared = frozenset(j for i, j in enumerate(self.kv_sources) if j != i)  # layers whose keys are reused
        self.kv_makers = tuple(sorted(set(self.kv_sources)))  # layers that make (and cache) keys
        self.linear_layers = tuple(i for i, block in enumerate(self.blocks) if block.linear)  # GatedDeltaNets
        self.norm = make_norm(config, **options)
        self.output = None if config.tie_embeddings else \
            nn.Linear(config.d_model, config.vocab_size, bias=False, **options)

    def train(self, mode=True):
        """As nn.Module's; but a copy of a model with dropout (`from_transformers`) refuses training mode: it
        computes without dropout, and would be silently different from the model it copies."""
        if mode and self.refused_dropout:
            raise ValueError(f"cannot train this copy: the model it copies has dropout "
                             f"({', '.join(self.refused_dropout)}), which TransformerLM does not compute. Use eval(), "
                             f"or copy a model whose config sets them to 0")
        return super().train(mode)

    @property
    def n_heads(self):
        """The heads of the full-attention layers (a hybrid's linear layers have heads of their own)."""
        full = [block for block in self.blocks if not block.linear]
        return full[0].attention.n_heads if full else None

    def new_cache(self):
        """One empty cache per layer, as each attention layer makes it (`new_cache()`: a KVCache, a
        LatentCache for latent attention, a StateCache of fixed size for a linear layer). A layer that shares an
        earlier layer's keys and values (kv_sharing) holds none of its own: its entry is its source's cache, the
        same object, so that `mha.torch.cache_bytes(cache)` counts the bytes of the layers that make keys (and
        the linear layers' states), once each."""
        caches = [block.attention.new_cache() for block in self.blocks]
        return [caches[j] for j in self.kv_sources]

    def cache_bytes(self, cache):
        """The bytes a filled `new_cache()` holds (each distinct cache once): `mha.torch.cache_bytes(cache)`."""
        return cache_bytes(cache)

    def forward(self, tokens, attention_mask=None, *, position_ids=None, cache=None, return_weights=False,
                head_mask=None, last_only=False):
        if isinstance(tokens, torch.Tensor) and tokens.ndim == 1:  # one sequence: a batch of one, and back
            batch = (lambda a: None if a is None else a[None])
            out = self(tokens[None], batch(attention_mask), position_ids=batch(position_ids), cache=cache,
                       return_weights=return_weights, head_mask=head_mask, last_only=last_only)
            return (out[0][0], out[1][:, 0]) if return_weights else out[0]
        check_lm_tokens(tokens, self.config.vocab_size)
        T = tokens.shape[-1]
        if isinstance(cache, list) and not cache:  # an empty list: filled with new_cache()
            cache.extend(self.new_cache())
        start = check_cache(cache, len(self.blocks), self.kv_makers)
        rope_positions = position_ids  # None: each layer turns by its cache's positions, start .. start + T - 1
        if position_ids is None:
            position_ids = torch.arange(start, start + T, device=tokens.device).expand(tokens.shape)  # (B, T)
        check_positions(position_ids, tokens, self.config.max_positions)
        keep = check_attention_mask(attention_mask, tokens, start)  # (B, T_all) booleans, or None
        self.check_linear_options(return_weights, head_mask)
        if head_mask is not None:
            check_head_mask(head_mask, len(self.blocks), self.n_heads, tokens)
        x = self.embed(tokens, position_ids)  # (B, T, d_model)
        rope_positions = None if self.positions is not None else rope_positions
        all_weights, shared = [], {}  # shared: layer -> (keys, values, start, first held position) for its sharers
        linear_mask = linear_keep(keep, T) if self.linear_layers else None  # (B, T) or None: this call's padding
        for i, block in enumerate(self.blocks):
            source = self.kv_sources[i]
            if block.linear:  # a Gated DeltaNet: this call's padding zeroes its inputs; its cache is a state
                x, weights = block(x, cache=None if cache is None else cache[i], keep=linear_mask)
            elif source != i:  # KV sharing: this layer attends to its source's keys and values of this call
                keys, values, kv_start, first = shared[source]
                mask = layer_mask(keep, None, head_mask, i, first=first)  # (B, 1 or h, 1, T_k) or None
                x, weights = block(x, mask, positions=rope_positions, return_weights=return_weights,
                                   shared_kv=(keys, values, kv_start))
            else:
                layer_cache = None if cache is None else cache[i]
                mask = layer_mask(keep, layer_cache, head_mask, i)  # (B, 1 or h, 1, T_k) or None
                if i in self.kv_shared:
                    first = 0 if layer_cache is None else layer_cache.dropped  # before this call's window trim
                    x, weights, kv = block(x, mask, cache=layer_cache, positions=rope_positions,
                                           return_weights=return_weights, return_kv=True)
                    shared[i] = (*kv, first)
                else:
                    x, weights = block(x, mask, cache=layer_cache, positions=rope_positions,
                                       return_weights=return_weights)
            all_weights.append(weights)
        if last_only:
            x = x[:, -1:]  # (B, 1, d_model)
        logits = self.logits(self.norm(x))  # (B, T or 1, V)
        return (logits, torch.stack(all_weights)) if return_weights else logits

    def check_linear_options(self, return_weights, head_mask):
        """A hybrid's linear layers have no attention weights to return and no heads of the full layers' kind."""
        linear = list(self.linear_layers)
        if linear and (return_weights or head_mask is not None):
            asked = "return_weights=True" if return_weights else "a head_mask"
            raise ValueError(f"{asked} is for attention layers; layers {linear} are linear (GatedDeltaNet), "
                             f"which compute no T x T weights: call without it")

    def embed(self, tokens, position_ids):
        """Token embeddings (scaled by embedding_scale in Gemma), plus learned positions (GPT-2)."""
        x = self.embedding(tokens)  # (B, T, d_model)
        if self.config.embedding_scale is not None:
            x = x * torch.tensor(self.config.embedding_scale, dtype=x.dtype)  # rounded to x's dtype, as Gemma does
        if self.positions is not None:
            x = x + self.positions(position_ids)  # (B, T, d_model)
        return x

    def logits(self, h):
        """The output layer (the embeddings' transpose when tied), then the final soft cap if any."""
        logits = F.linear(h, self.embedding.weight if self.output is None else self.output.weight)  # (B, T, V)
        return logits if self.config.final_logit_cap is None else soft_cap(logits, self.config.final_logit_cap)

    @torch.inference_mode()
    def generate(self, prompt, n_new, *, attention_mask=None, eos_token_id=None, pad_token_id=0):
        """Greedy continuation with the cache: prompt (B, T_0) -> (B, T_0 + at most n_new), as
        transformers' generate(do_sample=False, max_new_tokens=n_new): positions derived from the
        mask; a sequence that wrote eos_token_id continues with pad_token_id, and generation stops
        early once every sequence has."""
        check_prompt(prompt)
        n_new = validate.check_int("n_new", n_new, minimum=0)
        prompt = prompt if prompt.ndim > 1 else prompt[None]  # (B, T_0)
        mask = torch.ones_like(prompt) if attention_mask is None else attention_mask
        check_attention_mask(mask, prompt, 0)
        padded = not bool(mask.all())  # without padding, positions are 0, 1, ... and every key is real
        positions = positions_from_mask(mask) if padded else None  # (B, T_0)
        cache, tokens, new = self.new_cache(), prompt, prompt
        done = torch.zeros(len(prompt), dtype=torch.bool, device=prompt.device)  # (B,)
        for _ in range(n_new):
            logits = self(new, mask if padded else None, position_ids=positions, cache=cache,
                          last_only=True)  # (B, 1, V)
            new = logits[:, -1].argmax(dim=-1, keepdim=True).to(prompt.dtype)  # (B, 1)
            if eos_token_id is not None:
                new = new.masked_fill(done[:, None], pad_token_id)
            tokens = torch.cat([tokens, new], dim=-1)
            if eos_token_id is not None:
                done = done | (new[:, 0] == eos_token_id)
                if bool(done.all()):
                    break
            if padded:
                mask = torch.cat([mask, torch.ones_like(new, dtype=mask.dtype)], dim=-1)  # (B, T_all)
                positions = positions[:, -1:] + 1  # (B, 1)
        return tokens

    def numpy_params(self):
        """The keyword arguments of `mha.numpy.transformer_lm`, weights in the row-vector convention."""
        config = self.config
        return {"embedding": numpy(self.embedding.weight),
                "position_table": None if self.positions is None else numpy(self.positions.weight),
                "layers": [block_params(block) for block in self.blocks],
                "norm": norm_params(self.norm), "W_out": None if self.output is None else linear_weight(self.output),
                "embedding_scale": config.embedding_scale, "final_logit_cap": config.final_logit_cap}


def from_transformers(model):
    """A `TransformerLM` computing what the Hugging Face causal LM `model` computes (same device and
    dtype): GPT2LMHeadModel, LlamaForCausalLM, and the Mistral, Qwen2, Qwen3, Gemma, Gemma 2,
    Gemma 3 (text) and OLMo 2 causal LMs (tests/test_lm.py); OLMo 3 (per-layer windows), gpt-oss (sinks,
    alternating windows, clamped SwiGLU experts), Qwen3-MoE, DeepSeek-V3 (latent attention, group-limited
    experts) and DeepSeek-V3.2 (with the lightning indexer) (tests/test_lm_remembering.py); the hybrids
    Qwen3-Next (Gated DeltaNet and gated attention, experts with a shared expert) and Qwen3.5's text model
    (Qwen3_5ForCausalLM, dense) (tests/test_lm_hybrid.py). Its logits equal the model's.

    One path for every family (`mha.torch.hf`): the configuration is read into an LMConfig, each
    attention layer as `GroupedQueryAttention.from_llama` reads it; the model is built from it once,
    and every tensor is copied into the module made for it. A config field that changes the answer and
    that nothing here computes is refused with a ValueError naming it. The copy computes without dropout:
    where the model has some (GPT-2's three default to 0.1), the copy refuses train(), naming them."""
    kind = hf_families.family_of(model)  # a ValueError for any other model
    config = LMConfig(**hf_configuration.lm_arguments(model, kind))
    weight = model.lm_head.weight
    ours = TransformerLM(config, device=weight.device, dtype=weight.dtype)
    hf_weights.copy_model(ours, model, kind)
    ours.refused_dropout = hf_configuration.dropouts(model.config)  # train() names them
    return ours.train(model.training)


def numpy(parameter):
    return parameter.detach().cpu().numpy()


def norm_params(norm):
    """{"kind": "rms" or "layer", and its weights and eps} for `mha.numpy.transformer_lm`; None stays None."""
    if norm is None:
        return None
    if isinstance(norm, nn.LayerNorm):
        return {"kind": "layer", "gamma": numpy(norm.weight), "beta": linear_bias(norm), "eps": norm.eps}
    return {"kind": "rms", **norm.numpy_params()}


def block_params(block):
    """One LMBlock's weights for `mha.numpy.transformer_lm`: its attention (grouped, or {"kind": "latent",
    "params": ..., "options": ...} for `mha.numpy.latent_attention`, or {"kind": "linear", ...} for
    `mha.numpy.gated_delta_net`), its feed-forward ("mlp", "gated" or
    "experts", `mha.numpy.mixture_of_experts`'s arguments) and its norms."""
    ff = block.feed_forward
    kind = "mlp" if isinstance(ff, FeedForward) else "gated" if isinstance(ff, GatedFeedForward) else "experts"
    attention = linear_params(block) if block.linear else attention_params(block.attention)
    return {"attention": attention,
            "feed_forward": {"kind": kind, **ff.numpy_params()},
            **{name: norm_params(getattr(block, name)) for name in
               ("attention_norm_in", "attention_norm_out", "feed_forward_norm_in", "feed_forward_norm_out")}}


def linear_params(block):
    """A linear layer's GatedDeltaNet for `mha.numpy.gated_delta_net`: {"kind": "linear", "params": its
    numpy_params(), "options": its sizes and norm_eps, as the block's LMConfig.linear_attention gave them}."""
    options = {name: block.linear_options[name] for name in
               ("n_key_heads", "n_value_heads", "key_head_dim", "value_head_dim")}
    options["norm_eps"] = block.linear_options.get("norm_eps", 1e-6)
    return {"kind": "linear", "params": block.attention.numpy_params(), "options": options}


def attention_params(attention):
    """A block's attention for `mha.numpy.transformer_lm`: GroupedQueryAttention's numpy_params, or a latent
    attention's weights and sizes, as `mha.numpy.latent_attention` takes them."""
    if isinstance(attention, GroupedQueryAttention):
        return attention.numpy_params()
    if type(attention).__name__ != "MultiHeadLatentAttention":
        raise ValueError(f"mha.numpy.transformer_lm has no {type(attention).__name__}")
    indexer = attention.indexer
    options = dict(n_heads=attention.n_heads, qk_nope_head_dim=attention.qk_nope_head_dim,
                   qk_rope_head_dim=attention.qk_rope_head_dim, v_head_dim=attention.v_head_dim,
                   rope_base=attention.rope_base, rope_scaling=attention.rope_scaling,
                   rope_interleave=attention.rope_interleave, scale=attention.scale, norm_eps=attention.kv_norm.eps,
                   indexer=None if indexer is None else dict(n_heads=indexer.n_heads, head_dim=indexer.head_dim,
                                                             top_k=indexer.top_k))
    return {"kind": "latent", "params": attention.numpy_params(), "options": options}

