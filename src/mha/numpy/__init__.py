"""Multi-head attention in NumPy: the reference that reads like the math.

Conventions (the same in `mha.torch`):
- inputs are row vectors: shape (..., T, d); leading batch dimensions are optional;
- a projection is `X @ W + b` with `W` of shape (d_in, d_out);
- masks are boolean, True means "may attend", and broadcast to (..., h, T_q, T_k);
- a query that may attend to nothing gets zero weights and a zero output.

The modules, each importing only those above it:
    attention  softmax, scaled dot-product attention, heads, split and merge, masks
    blocks     LayerNorm, feed-forward, encoder and decoder blocks and stacks
    chunked    attention in bounded memory (keys in blocks, online softmax)
    rotary     rotary position embeddings (RoPE), Llama's "rotate half" convention
    cache      the key-value cache of generation
    parts      the parts of today's language models: RMSNorm, gated feed-forwards (SwiGLU, GeGLU)
    experts    a mixture of experts: routing tokens to top-k experts (DeepSeek, Qwen, gpt-oss), the layer
    grouped    grouped-query attention (shared key/value heads), with RoPE, the cache and the
               attention features of today's models (QK-norm, soft-capping, sliding windows)
    positions  positions added to tokens (learned, sinusoidal) or to the scores (ALiBi)
    model      a decoder-only Transformer (a small GPT), its loss, warm-up and greedy generation
    lm         transformer_lm: today's decoder-only models (GPT-2, Llama, Qwen, Gemma, OLMo 2) as one function
    training   a run on text (chapter 14): a BPE merge step, the warm-up + cosine rate, gradient clipping
    sharding   heads across devices, the ranks simulated as a list: tensor, Ulysses and ring parallelism,
               the collectives, the online-softmax merge, and the payload and bytes they move
    rank_lists what one rank computes, as a list: Ulysses' all-to-all, the ring loop, a rank's partial output
    latent     multi-head latent attention: one decoding step absorbed and expanded, the cache's bytes (chapter 17)
    sparse     DeepSeek Sparse Attention: the lightning indexer's scores, top-k key selection (chapter 17)
    quantization  a GGUF file's blocks of 32 weights: Q4_1 and Q8_0 read back, Q4_1 written (chapter 16)
    linear     linear attention (chapter 18): the feature map, recurrent, parallel and chunked forms
    delta      the delta rule and Gated DeltaNet (chapter 18): step, recurrent and chunked forms, the causal
               convolution, the gated RMSNorm, the state's bytes, the whole layer (gated_delta_net)
Import the face, not the modules: `import mha.numpy as mnp`.
"""

from mha.numpy.attention import (
    as_float_array, as_mask, attention_at_offset, attention_shape, causal_mask, head_attention, heads_from_fused,
    masked_softmax, masked_softmax_, matrix, merge_heads, multihead_attention, multihead_attention_loop,
    padding_mask, project, scaled_dot_product_attention, self_attention, sequences, softmax, split_heads,
    symmetric_attention, transpose,
)
from mha.numpy.blocks import (
    ATTENTION_PARAMS, BLOCK_PARAMS, DECODER_BLOCK_PARAMS, OPTIONAL_PARAMS, check_block_params,
    check_decoder_params, decoder, decoder_block, encoder, encoder_block, feed_forward, gelu, gelu_tanh, layer_norm,
    relu,
)
from mha.numpy.cache import KVCache, kv_cache_bytes
from mha.numpy.chunked import chunked_attention
from mha.numpy.grouped import (
    attend_with_cache, causal_mask_after, grouped_query_attention, repeat_kv, rms_norm_per_head, sliding_window_mask,
)
from mha.numpy.model import (
    causal_lm_loss, cross_entropy, decoder_only_transformer, generate_greedy, log_softmax, loss_to_bits_per_character,
    warmup_factor,
)
from mha.numpy.lm import transformer_lm
from mha.numpy.quantization import dequantize_q4_1, dequantize_q8_0, quantize_q4_1
from mha.numpy.parts import gated_feed_forward, geglu, rms_norm, silu, soft_cap, swiglu
from mha.numpy.experts import (
    balance_correction_bias, clamped_swiglu, expert_feed_forward, expert_load, group_limited_experts,
    mixture_of_experts, route_tokens, route_tokens_in_groups,
)
from mha.numpy.latent import (
    absorbed_latent_decode, expanded_latent_decode, latent_attention, latent_cache_bytes, latent_decode_flops,
)
from mha.numpy.sparse import lightning_indexer, lightning_indexer_scores, select_top_k_keys
from mha.numpy.sinks import sink_softmax
from mha.numpy.linear import (
    elu_feature_map, linear_attention_chunked, linear_attention_parallel, linear_attention_recurrent,
    linear_attention_step,
)
from mha.numpy.delta import (
    causal_conv1d, gated_delta_chunk, gated_delta_net, gated_delta_rule_chunked, gated_delta_rule_recurrent,
    gated_delta_state_bytes, gated_delta_step, gated_delta_update, gated_rms_norm, l2_normalize,
)
from mha.numpy.sampling import apply_temperature, filter_logits, generate, top_k_filter, top_p_filter
from mha.numpy.training import clip_grad_norm, merge_pair, warmup_cosine
from mha.numpy.rotary import apply_rotary, ntk_frequencies, rotary_at, rotary_embedding, rotary_frequencies, rotate_half
from mha.numpy.sharding import (
    all_reduce, all_reduce_bytes, all_to_all, attention_partial, merge_partials, payload_per_layer, ring_attention,
    sequence_chunks, shard_by_heads, tensor_parallel_attention, ulysses_attention, wire_bytes,
)
from mha.numpy.rank_lists import rank_partial_output, ring_attention_lists, ulysses_all_to_all
from mha.numpy.positions import (
    add_positions, alibi_bias, alibi_slopes, sinusoidal_frequencies, sinusoidal_positions, sinusoidal_shift,
)

__all__ = [
    # attention
    "as_float_array", "as_mask", "attention_at_offset", "attention_shape", "causal_mask", "head_attention",
    "heads_from_fused", "masked_softmax", "masked_softmax_", "merge_heads", "multihead_attention",
    "multihead_attention_loop", "padding_mask", "matrix", "sequences", "project", "scaled_dot_product_attention", "self_attention", "softmax", "split_heads",
    "symmetric_attention", "transpose",
    # blocks
    "ATTENTION_PARAMS", "BLOCK_PARAMS", "DECODER_BLOCK_PARAMS", "OPTIONAL_PARAMS", "check_block_params",
    "check_decoder_params", "decoder", "decoder_block", "encoder", "encoder_block", "feed_forward", "gelu",
    "gelu_tanh", "layer_norm", "relu",
    # chunked
    "chunked_attention",
    # rotary, cache and grouped (chapter 12)
    "rotary_embedding", "apply_rotary", "rotate_half", "KVCache", "kv_cache_bytes", "repeat_kv", "causal_mask_after", "sliding_window_mask",
    "attend_with_cache", "grouped_query_attention",
    # positions (chapter 10)
    "sinusoidal_positions", "sinusoidal_frequencies", "sinusoidal_shift", "add_positions", "alibi_slopes",
    "alibi_bias",
    # model (chapter 11)
    "decoder_only_transformer", "log_softmax", "cross_entropy", "causal_lm_loss", "warmup_factor", "generate_greedy",
    # parts of today's models (chapter 13)
    "transformer_lm", "rotary_frequencies", "rotary_at", "rms_norm", "silu", "gated_feed_forward", "swiglu", "geglu", "soft_cap",
    "rms_norm_per_head", "ntk_frequencies",
    # sampling (chapter 14)
    "filter_logits", "generate", "apply_temperature", "top_k_filter", "top_p_filter", "loss_to_bits_per_character",
    # training on text: a BPE merge, the learning rate, gradient clipping (chapter 14)
    "merge_pair", "warmup_cosine", "clip_grad_norm",
    # heads across devices, ranks simulated as a list (chapter 15)
    "shard_by_heads", "tensor_parallel_attention", "all_reduce", "all_to_all", "ulysses_attention", "sequence_chunks",
    "attention_partial", "merge_partials", "ring_attention", "all_reduce_bytes", "payload_per_layer", "wire_bytes",
    # what one rank computes, the ranks as a list: chapter 15's exercises
    "ulysses_all_to_all", "ring_attention_lists", "rank_partial_output",
    # a GGUF file's blocks, read and written (chapter 16)
    "dequantize_q4_1", "dequantize_q8_0", "quantize_q4_1",
    # attention sinks (chapter 17)
    "sink_softmax",
    # a mixture of experts: routing and the layer (chapter 17)
    "route_tokens", "group_limited_experts", "route_tokens_in_groups", "clamped_swiglu", "expert_feed_forward",
    "mixture_of_experts", "expert_load", "balance_correction_bias",
    # latent and sparse attention (chapter 17)
    "absorbed_latent_decode", "expanded_latent_decode", "latent_cache_bytes", "latent_decode_flops",
    "lightning_indexer_scores", "select_top_k_keys", "latent_attention", "lightning_indexer",
    # linear attention, the delta rule and Gated DeltaNet (chapter 18)
    "elu_feature_map", "linear_attention_step", "linear_attention_recurrent", "linear_attention_parallel",
    "linear_attention_chunked", "l2_normalize", "gated_delta_update", "gated_delta_step", "gated_delta_rule_recurrent",
    "gated_delta_chunk", "gated_delta_rule_chunked", "causal_conv1d", "gated_rms_norm", "gated_delta_state_bytes",
    "gated_delta_net",
]
