"""Multi-head attention in PyTorch: the same ideas as `mha.numpy`, as trainable modules.

Same conventions as `mha.numpy`: inputs (..., T, d), boolean masks with True =
"may attend" broadcasting to (..., h, T_q, T_k), a query with nothing to attend
to gets zero weights. Nothing here names a device: every tensor is made on the
device and with the dtype of the input, so the modules run on CPU, GPU or `meta`.

The modules, each importing only those above it:
    tensors    what the face accepts: checks of tensors, masks, dtypes and devices
    devices    default_device(): CUDA, then Apple's MPS, then the CPU, or $MHA_DEVICE; synchronize
    attention  functions (softmax, scaled dot-product attention, split and merge,
               masks) and the attention modules of chapters 2 to 5
    blocks     FeedForward, encoder and decoder blocks and stacks (chapters 6, 9)
    chunked    attention in bounded memory (chapter 8)
    rotary     rotary position embeddings (RoPE), Llama's "rotate half" convention (chapter 12)
    cache      the key-value cache of generation (chapter 12)
    hf         Hugging Face's layouts, read in one room: families (which model types, and where their
               norms sit), configuration (what is read, and what is refused), weights (the tensors copied)
    parts      RMSNorm and the gated feed-forwards SwiGLU and GeGLU of today's models (chapter 13)
    experts    MixtureOfExperts: a router and top-k experts, as DeepSeek-V3, Qwen3-MoE/Next, gpt-oss (chapter 17)
    grouped    grouped-query attention with RoPE and the cache, equal to Llama's (chapter 12), and
               the attention features of today's models (chapter 13)
    sparse     DeepSeek Sparse Attention: the lightning indexer and top-k key selection (chapter 17)
    latent     multi-head latent attention (DeepSeek-V2/V3), its latent cache and the absorbed decode (chapter 17)
    positions  LearnedPositions, SinusoidalPositions and ALiBi's bias (chapter 10)
    model      DecoderOnlyTransformer (a small GPT), its loss, warm-up and greedy generation (chapter 11)
    lm_inputs  what TransformerLM.forward accepts, checked, and each layer's mask (chapters 13, 17, 18)
    lm         TransformerLM and LMConfig: GPT-2, Llama, Mistral, Qwen, Gemma, OLMo 2 from our parts, and
               from_transformers: a Hugging Face causal LM copied into a TransformerLM (chapter 13); the hybrids
               Qwen3-Next and Qwen3.5, whose linear layers are Gated DeltaNets (chapter 18)
    quantization  a GGUF file's Q4_1 and Q8_0 blocks on tensors (chapter 16)
    linear     linear attention (chapter 18): recurrent, parallel and chunked (every chunk at once)
    delta      the delta rule and Gated DeltaNet (chapter 18): the step of decoding, the chunked form of
               prefill (one triangular solve for all chunks), the causal convolution, the gated RMSNorm;
               GatedDeltaNet (from_hf: Qwen3.5's and Qwen3-Next's layers) and its StateCache
Import the face, not the modules: `import mha.torch as mt`.
"""

from mha.torch.attention import (
    HeadAttention, MultiHeadAttention, MultiHeadAttentionLoop, SymmetricAttention, causal_mask, linear_bias,
    linear_weight, masked_softmax, masked_softmax_, merge_heads, padding_mask, scaled_dot_product_attention,
    split_heads, with_causal,
)
from mha.torch.blocks import Decoder, DecoderBlock, Encoder, EncoderBlock, FeedForward, layer_norm
from mha.torch.cache import KVCache, cache_bytes, kv_cache_bytes
from mha.torch.chunked import chunked_attention
from mha.torch.devices import default_device, synchronize
from mha.torch.grouped import (
    GroupedQueryAttention, attend_with_cache, causal_mask_after, repeat_kv, sink_softmax, sliding_window_mask,
)
from mha.torch.latent import (
    LatentCache, MultiHeadLatentAttention, absorbed_latent_decode, expanded_latent_decode, latent_cache_bytes,
    latent_decode_flops,
)
from mha.torch.sparse import LightningIndexer, lightning_indexer_scores, select_top_k_keys
from mha.torch.model import (
    DecoderOnlyTransformer, causal_lm_loss, cross_entropy, generate_greedy, warmup_factor, warmup_schedule,
)
from mha.torch.lm import LMBlock, LMConfig, TransformerLM, from_transformers, positions_from_mask
from mha.torch.quantization import dequantize_q4_1, dequantize_q8_0, quantize_q4_1
from mha.torch.parts import GatedFeedForward, GeGLU, RMSNorm, SwiGLU, soft_cap
from mha.torch.experts import (
    MixtureOfExperts, balance_correction_bias, clamped_swiglu, expert_load, group_limited_experts, route_tokens,
    route_tokens_in_groups,
)
from mha.torch.sampling import apply_temperature, filter_logits, generate, top_k_filter, top_p_filter
from mha.torch.rotary import RotaryTables, apply_rotary, rotary_embedding, rotary_frequencies, rotate_half
from mha.torch.positions import (
    LearnedPositions, SinusoidalPositions, add_positions, alibi_bias, alibi_slopes, sinusoidal_positions,
)
from mha.torch.linear import (
    elu_feature_map, linear_attention_chunked, linear_attention_parallel, linear_attention_recurrent,
    linear_attention_step,
)
from mha.torch.delta import (
    GatedDeltaNet, StateCache, causal_conv1d, gated_delta_chunk, gated_delta_rule_chunked, gated_delta_rule_recurrent,
    gated_delta_state_bytes, gated_delta_step, gated_delta_update, gated_rms_norm, l2_normalize,
)
from mha.torch.tensors import check_input, check_mask_tensor, check_qkv_tensors, check_tensor, check_x_and_context

__all__ = [
    "scaled_dot_product_attention", "chunked_attention", "split_heads", "merge_heads", "causal_mask",
    "padding_mask", "masked_softmax", "SymmetricAttention", "HeadAttention", "MultiHeadAttentionLoop",
    "MultiHeadAttention", "EncoderBlock", "Encoder", "DecoderBlock", "Decoder", "layer_norm",
    # added with the packages: the feed-forward module, and the helpers other modules build on
    "FeedForward", "masked_softmax_", "with_causal", "check_tensor", "check_mask_tensor", "check_qkv_tensors",
    "linear_weight", "linear_bias", "check_input", "check_x_and_context",
    # chapter 12: rotary positions, the key-value cache, grouped-query attention
    "rotary_embedding", "apply_rotary", "rotate_half", "KVCache", "kv_cache_bytes", "repeat_kv", "causal_mask_after",
    "attend_with_cache", "GroupedQueryAttention", "sliding_window_mask",
    # positions (chapter 10)
    "sinusoidal_positions", "add_positions", "alibi_slopes", "alibi_bias", "LearnedPositions",
    "SinusoidalPositions",
    # chapter 11: a decoder-only Transformer
    "DecoderOnlyTransformer", "cross_entropy", "causal_lm_loss", "warmup_factor", "warmup_schedule", "generate_greedy",
    # where the chapters that show speed or memory compute
    "default_device", "synchronize",
    # parts of today's models (chapter 13)
    "rotary_frequencies", "RotaryTables", "TransformerLM", "LMConfig", "LMBlock", "from_transformers", "positions_from_mask",
    "RMSNorm", "GatedFeedForward", "SwiGLU", "GeGLU", "soft_cap",
    # sampling (chapter 14)
    "filter_logits", "generate", "apply_temperature", "top_k_filter", "top_p_filter",
    # a GGUF file's blocks, read and written (chapter 16)
    "dequantize_q4_1", "dequantize_q8_0", "quantize_q4_1",
    # attention sinks, and the bytes a model's caches hold (chapter 17)
    "sink_softmax", "cache_bytes",
    # a mixture of experts: routing and the layer (chapter 17)
    "route_tokens", "group_limited_experts", "route_tokens_in_groups", "clamped_swiglu", "MixtureOfExperts",
    "expert_load", "balance_correction_bias",
    # latent and sparse attention (chapter 17)
    "MultiHeadLatentAttention", "LatentCache", "latent_cache_bytes", "latent_decode_flops", "absorbed_latent_decode",
    "expanded_latent_decode", "LightningIndexer", "lightning_indexer_scores", "select_top_k_keys",
    # linear attention, the delta rule and Gated DeltaNet (chapter 18)
    "elu_feature_map", "linear_attention_step", "linear_attention_recurrent", "linear_attention_parallel",
    "linear_attention_chunked", "l2_normalize", "gated_delta_update", "gated_delta_step", "gated_delta_rule_recurrent",
    "gated_delta_chunk", "gated_delta_rule_chunked", "causal_conv1d", "gated_rms_norm", "gated_delta_state_bytes",
    "GatedDeltaNet", "StateCache",
]
