"""Chapter 13 in NumPy: today's decoder-only language models as one function.

`transformer_lm(tokens, **params)` computes the logits of a `mha.torch.TransformerLM` from its
`numpy_params()`: embeddings (scaled in Gemma), learned positions (GPT-2) or RoPE in each
attention layer, the blocks with their norms where the family puts them, the final norm, the
output layer (the embeddings' transpose when tied) and Gemma 2's final soft cap; and chapter 17's
parts where the NumPy face has them: attention sinks, Qwen3-Next's output gate, DeepSeek's latent attention
(`latent_attention`, with its indexer) and the mixture of experts (`mixture_of_experts`); and chapter 18's
hybrids (Qwen3-Next, Qwen3.5), whose linear layers are Gated DeltaNets (`gated_delta_net`, prefill from an empty
state, padded inputs zeroed).
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array, soft_cap
from mha.numpy.blocks import feed_forward, layer_norm
from mha.numpy.delta import gated_delta_net
from mha.numpy.experts import mixture_of_experts
from mha.numpy.grouped import grouped_query_attention
from mha.numpy.latent import latent_attention
from mha.numpy.parts import gated_feed_forward, rms_norm


def apply_norm(x, params):
    """The norm `params` describes ({"kind": "rms" or "layer", ...}); None is no norm."""
    if params is None:
        return x
    if params["kind"] == "layer":
        return layer_norm(x, params["gamma"], params["beta"], params["eps"])
    return rms_norm(x, params["weight"], params["eps"], unit_offset=params["unit_offset"])


def lm_feed_forward(x, params):
    """GPT-2's two layers with tanh GELU ("mlp"), a gated feed-forward ("gated"), or a mixture of experts
    ("experts", chapter 17)."""
    params = dict(params)
    kind = params.pop("kind")
    if kind == "mlp":
        return feed_forward(x, **params, activation="gelu_tanh")
    if kind == "experts":
        return mixture_of_experts(x, **params)
    return gated_feed_forward(x, **params)


def lm_attention(x, params, mask=None, positions=None, keep=None):
    """Causal self-attention: grouped-query attention, DeepSeek's latent attention ({"kind": "latent",
    "params", "options"}: `latent_attention`, positions 0 .. T - 1), or a linear layer ({"kind": "linear",
    "params", "options"}: `gated_delta_net`, keep (B, T) its padding, no weights)."""
    if params.get("kind") == "linear":
        return gated_delta_net(x, params["params"], **params["options"], keep=keep), None
    if params.get("kind") == "latent":
        if positions is not None and not np.array_equal(positions, np.broadcast_to(np.arange(x.shape[-2]),
                                                                                     positions.shape)):
            raise ValueError("latent_attention turns positions 0 .. T - 1 only: give no position_ids")
        return latent_attention(x, params["params"], **params["options"], mask=mask, causal=True)
    return grouped_query_attention(x, **params, mask=mask, causal=True, positions=positions)


def lm_block(x, layer, mask=None, positions=None, keep=None):
    """One block: causal self-attention and a feed-forward, each added to x, norms where the
    layer has them (attention_norm_in/out, feed_forward_norm_in/out). Returns x and the weights."""
    a, weights = lm_attention(apply_norm(x, layer["attention_norm_in"]), layer["attention"], mask, positions, keep)
    x = x + apply_norm(a, layer["attention_norm_out"])  # (B, T, d_model)
    f = lm_feed_forward(apply_norm(x, layer["feed_forward_norm_in"]), layer["feed_forward"])
    return x + apply_norm(f, layer["feed_forward_norm_out"]), weights  # (B, T, d_model)


def transformer_lm(tokens, embedding, layers, norm, *, position_table=None, W_out=None, embedding_scale=None,
                   final_logit_cap=None, attention_mask=None, position_ids=None, return_weights=False):
    """Logits (B, T, V) of a decoder-only language model over tokens (B, T).

    embedding: (V, d_model); layers: one dict per block (`TransformerLM.numpy_params()`);
    norm: the final norm; position_table: (max_len, d_model) learned positions, or None;
    W_out: (d_model, V), or None for the embeddings' transpose (tied). attention_mask: (B, T),
    1 for real tokens; position_ids: (B, T), default 0 .. T - 1. With return_weights, also
    every layer's attention weights, (n_layers, B, h, T, T) (not for a hybrid: its linear layers have none).
    """
    tokens = np.asarray(tokens)
    if tokens.dtype.kind not in "iu" or tokens.ndim != 2:
        raise ValueError(f"tokens must be integer ids of shape (B, T), got dtype {tokens.dtype} and shape "
                         f"{validate.shape_str(tokens.shape)}")
    embedding = as_float_array("embedding", embedding)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= len(embedding)):
        raise ValueError(f"tokens must be ids in 0 .. {len(embedding) - 1}, got {tokens.min()} .. {tokens.max()}")
    positions = np.broadcast_to(np.arange(tokens.shape[-1]), tokens.shape) if position_ids is None \
        else np.asarray(position_ids)
    x = embedding[tokens]  # (B, T, d_model)
    if embedding_scale is not None:
        x = x * x.dtype.type(embedding_scale)  # rounded to the embeddings' dtype, as Gemma does
    if position_table is not None:
        x = x + as_float_array("position_table", position_table)[positions]  # (B, T, d_model)
    keep = None if attention_mask is None else np.asarray(attention_mask).astype(bool)  # (B, T)
    mask = None if keep is None else keep[:, None, None, :]  # (B, 1, 1, T)
    linear = [i for i, layer in enumerate(layers) if layer["attention"].get("kind") == "linear"]
    if linear and return_weights:
        raise ValueError(f"return_weights=True is for attention layers; layers {linear} are linear (a Gated "
                         f"DeltaNet's state, no T x T weights): call without it")
    rope_positions = None if position_table is not None else positions  # (B, T)
    all_weights = []
    for layer in layers:
        turns = layer["attention"].get("rope_base") or layer["attention"].get("kind") == "latent"
        x, weights = lm_block(x, layer, mask, rope_positions if turns else None, keep)
        all_weights.append(weights)
    h = apply_norm(x, norm)  # (B, T, d_model)
    logits = h @ (embedding.T if W_out is None else as_float_array("W_out", W_out))  # (B, T, V)
    if final_logit_cap is not None:
        logits = soft_cap(logits, final_logit_cap)
    return (logits, np.stack(all_weights)) if return_weights else logits
