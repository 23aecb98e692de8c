"""transformers' DeepSeek attention read into `mha.torch.MultiHeadLatentAttention`: DeepseekV3Attention
(DeepSeek-V2/V3's multi-head latent attention) and DeepseekV32Attention (the same, with the lightning
indexer of DeepSeek Sparse Attention).

Where transformers keeps them: q_proj (without q_lora_rank) or q_a_proj, q_a_layernorm, q_b_proj;
kv_a_proj_with_mqa (the latent and the shared rotary key side by side), kv_a_layernorm, kv_b_proj (per head
[keys without RoPE | values]); o_proj; attention_bias on q_a_proj, kv_a_proj_with_mqa and o_proj. The
indexer's wq_b, wk, k_norm (a LayerNorm) and weights_proj. RoPE: rope_interleave (V3's config; V3.2's
main attention always turns interleaved pairs, its indexer halves), the config's RoPE scaling (YaRN
with DeepSeek's mscale_all_dim, which also scales the scores: `scaling`).
"""

import torch
from torch import nn

from mha.torch.hf import configuration

LATENT_CLASSES = {"DeepseekV3Attention": False, "DeepseekV32Attention": True}  # class -> has an indexer
INDEXER_NORM_EPS = 1e-6  # LightningIndexer's LayerNorm, as DeepseekV32Indexer's k_norm


def check_latent_attention(attention):
    kind = type(attention).__name__
    if kind not in LATENT_CLASSES:
        raise TypeError(f"expected a transformers DeepseekV3Attention or DeepseekV32Attention, got {kind}")
    return kind


def refused_features(attention):
    """What the layer does that MultiHeadLatentAttention does not compute, in words."""
    config, found = attention.config, []
    # The latent's keys and values are made for every query head, so num_key_value_heads plays no part, but a
    # value below the heads makes transformers repeat keys that already are per head (its own forward fails).
    # DeepseekV3Config's default (128) above a tiny model's heads is read as one key per head, as its sdpa does.
    if config.num_key_value_heads < config.num_attention_heads:
        found.append(f"num_key_value_heads={config.num_key_value_heads} < num_attention_heads="
                     f"{config.num_attention_heads} (the latent's keys are per query head)")
    eps = {attention.kv_a_layernorm.variance_epsilon}
    if attention.q_lora_rank is not None:
        eps.add(attention.q_a_layernorm.variance_epsilon)
    if len(eps) > 1:
        found.append(f"RMSNorms of different eps {sorted(eps)}")
    indexer = getattr(attention, "indexer", None)
    if indexer is not None and (indexer.k_norm.eps != INDEXER_NORM_EPS or indexer.k_norm.weight is None):
        found.append(f"an indexer k_norm other than a LayerNorm of eps {INDEXER_NORM_EPS}")
    return found


def latent_arguments(attention):
    """Every keyword argument of `MultiHeadLatentAttention` but d_model (kv_a_proj_with_mqa.in_features),
    read from a DeepseekV3Attention or DeepseekV32Attention. A TypeError for another layer; a ValueError
    naming what nothing here computes."""
    kind = check_latent_attention(attention)
    found = refused_features(attention)
    if found:
        configuration.refuse(attention, found)
    config = attention.config
    theta, scaling = configuration.layer_rope(attention)
    arguments = dict(n_heads=attention.num_heads, kv_lora_rank=attention.kv_lora_rank,
                     qk_nope_head_dim=attention.qk_nope_head_dim, qk_rope_head_dim=attention.qk_rope_head_dim,
                     v_head_dim=attention.v_head_dim, q_lora_rank=attention.q_lora_rank,
                     rope_base=float(theta if theta is not None else 10000.0), rope_scaling=scaling,
                     rope_interleave=True if LATENT_CLASSES[kind] else bool(config.rope_interleave),
                     norm_eps=float(attention.kv_a_layernorm.variance_epsilon), scale=float(attention.scaling),
                     bias=attention.kv_a_proj_with_mqa.bias is not None, indexer=None)
    if LATENT_CLASSES[kind]:
        indexer = attention.indexer
        arguments["indexer"] = dict(n_heads=indexer.n_heads, head_dim=indexer.head_dim, top_k=indexer.index_topk)
    return arguments


@torch.no_grad()
def copy_into(mine, theirs, name):
    """theirs' weight (and bias) into mine, refusing a shape that differs."""
    for part in ("weight", "bias"):
        a, b = getattr(mine, part, None), getattr(theirs, part, None)
        if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
            raise ValueError(f"{name}.{part}: ours is {None if a is None else tuple(a.shape)}, theirs "
                             f"{None if b is None else tuple(b.shape)}: build ours with latent_arguments(attention)")
        if a is not None:
            a.copy_(b)


def latent_pairs(ours, attention):
    """(our module, their module, their name) for every layer with weights."""
    pairs = [(ours.W_q, attention.q_proj, "q_proj")] if ours.q_lora_rank is None else [
        (ours.W_dq, attention.q_a_proj, "q_a_proj"), (ours.q_norm, attention.q_a_layernorm, "q_a_layernorm"),
        (ours.W_uq, attention.q_b_proj, "q_b_proj")]
    pairs += [(ours.W_dkv, attention.kv_a_proj_with_mqa, "kv_a_proj_with_mqa"),
              (ours.kv_norm, attention.kv_a_layernorm, "kv_a_layernorm"),
              (ours.W_ukv, attention.kv_b_proj, "kv_b_proj"), (ours.W_o, attention.o_proj, "o_proj")]
    if ours.indexer is not None:
        theirs = attention.indexer
        pairs += [(ours.indexer.W_q, theirs.wq_b, "indexer.wq_b"), (ours.indexer.W_k, theirs.wk, "indexer.wk"),
                  (ours.indexer.k_norm, theirs.k_norm, "indexer.k_norm"),
                  (ours.indexer.W_w, theirs.weights_proj, "indexer.weights_proj")]
    return pairs


def copy_latent_attention(ours, attention):
    """A DeepseekV3Attention's or DeepseekV32Attention's weights into `ours`, a MultiHeadLatentAttention
    built with `latent_arguments(attention)` (cast to ours' dtype and device)."""
    kind = check_latent_attention(attention)
    if (ours.indexer is not None) != LATENT_CLASSES[kind]:
        raise ValueError(f"ours {'has' if ours.indexer is not None else 'has no'} indexer but {kind} "
                         f"{'has one' if LATENT_CLASSES[kind] else 'has none'}: build ours with latent_arguments")
    if (ours.q_lora_rank is None) != (attention.q_lora_rank is None):
        raise ValueError(f"q_lora_rank: ours is {ours.q_lora_rank}, theirs {attention.q_lora_rank}")
    for mine, theirs, name in latent_pairs(ours, attention):
        if not isinstance(theirs, nn.Module):
            raise TypeError(f"{kind} has no {name}")
        copy_into(mine, theirs, name)
    return ours
