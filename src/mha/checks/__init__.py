"""Automatic checks for the exercises: `check_NAME(fn)` tests a learner's `fn`.

`fn` is called exactly as `mha.numpy.NAME` is called: first on named cases (the
edge cases that the exercise mentions, which carry the hints), then on random ones
drawn afresh on every call (shapes with batches of 4 dimensions and lengths of 1,
weights that are not square, extreme logits, rows with nothing to attend to,
float32 as well as float64). On success the check prints one line, counting the
named cases, and returns None. On failure it raises `CheckFailed` saying which
input, what was expected and what came back, with a hint when the answer matches a
classic mistake, and the seed of the random cases: `check_NAME(fn, seed=...)` draws
the same ones again. A stub that still raises NotImplementedError makes the check
raise NotImplementedError too, so a handout run top to bottom stops there.

    from mha.checks import check_softmax
    check_softmax(my_softmax)

The answers are compared with a copy of `mha.numpy` taken when `mha.checks` is
imported (`mha.checks.reference`), so reassigning `mha.numpy.softmax` changes
nothing; and a solution that calls the very function it should replace is refused
(`mha.checks.own_work`). Each chapter's checks live in `mha.checks.ch01` ...
`mha.checks.ch18` (chapter 13's in two: `ch13` and `ch13_queries_keys`; chapter 14's in `ch14` and
`ch14_training`; chapter 15's in `ch15` and `ch15_ranks`; chapter 17's in `ch17` and `ch17_choices`; chapter 18's in
`ch18` and `ch18_chunk`), with their
cases and their catalogue of classic mistakes side by side; what several chapters share is in `mha.checks.common` (no chapter's module imports
another's); the machinery that registers and runs them is `mha.checks.registry`.
"""

from mha.checks.ch01 import check_self_attention, check_softmax
from mha.checks.ch02 import check_symmetric_attention
from mha.checks.ch03 import check_head_attention, check_scaled_dot_product_attention
from mha.checks.ch04 import check_multihead_attention_loop
from mha.checks.ch05 import (check_causal_mask, check_merge_heads, check_multihead_attention,
                             check_padding_mask, check_split_heads)
from mha.checks.ch06 import check_encoder_block, check_feed_forward, check_layer_norm
from mha.checks.ch07 import check_attention_at_offset
from mha.checks.ch08 import check_chunked_attention
from mha.checks.ch09 import check_decoder_block
from mha.checks.ch10 import check_alibi_bias, check_sinusoidal_positions
from mha.checks.ch11 import check_causal_lm_loss, check_generate_greedy
from mha.checks.ch12 import check_apply_rotary, check_attend_with_cache, check_kv_cache_bytes, check_repeat_kv
from mha.checks.ch13 import check_rms_norm, check_sliding_window_mask, check_soft_cap, check_swiglu
from mha.checks.ch13_queries_keys import check_ntk_frequencies, check_rms_norm_per_head
from mha.checks.ch14 import (check_apply_temperature, check_loss_to_bits_per_character, check_top_k_filter,
                             check_top_p_filter)
from mha.checks.ch14_training import check_clip_grad_norm, check_merge_pair, check_warmup_cosine
from mha.checks.ch15 import check_all_reduce_bytes, check_merge_partials, check_shard_by_heads
from mha.checks.ch15_ranks import check_rank_partial_output, check_ring_attention_lists, check_ulysses_all_to_all
from mha.checks.ch16 import check_dequantize_q4_1
from mha.checks.ch17 import check_absorbed_latent_decode, check_sink_softmax
from mha.checks.ch17_choices import check_route_tokens, check_select_top_k_keys
from mha.checks.ch18 import check_gated_delta_chunk, check_gated_delta_update, check_linear_attention_step
from mha.checks.registry import CheckFailed

__all__ = [
    "CheckFailed",
    "check_softmax", "check_self_attention",  # chapter 1
    "check_symmetric_attention",  # chapter 2
    "check_scaled_dot_product_attention", "check_head_attention",  # chapter 3
    "check_multihead_attention_loop",  # chapter 4
    "check_split_heads", "check_merge_heads", "check_causal_mask", "check_padding_mask",
    "check_multihead_attention",  # chapter 5
    "check_layer_norm", "check_feed_forward", "check_encoder_block",  # chapter 6
    "check_attention_at_offset",  # chapter 7
    "check_chunked_attention",  # chapter 8
    "check_decoder_block",  # chapter 9
    "check_sinusoidal_positions", "check_alibi_bias",  # chapter 10
    "check_causal_lm_loss", "check_generate_greedy",  # chapter 11
    "check_repeat_kv", "check_apply_rotary", "check_attend_with_cache", "check_kv_cache_bytes",  # chapter 12
    "check_rms_norm", "check_swiglu", "check_soft_cap", "check_sliding_window_mask", "check_rms_norm_per_head",
    "check_ntk_frequencies",  # chapter 13
    "check_apply_temperature", "check_top_k_filter", "check_top_p_filter",
    "check_loss_to_bits_per_character", "check_merge_pair", "check_warmup_cosine", "check_clip_grad_norm",  # chapter 14
    "check_shard_by_heads", "check_merge_partials", "check_all_reduce_bytes",  # chapter 15
    "check_ulysses_all_to_all", "check_ring_attention_lists", "check_rank_partial_output",  # chapter 15, the ranks
    "check_dequantize_q4_1",  # chapter 16
    "check_absorbed_latent_decode", "check_sink_softmax", "check_select_top_k_keys", "check_route_tokens",  # ch. 17
    "check_linear_attention_step", "check_gated_delta_update", "check_gated_delta_chunk",  # chapter 18
]
