"""Automatic checks for the exercises: `check_NAME(fn)` tests a learner's `fn`.

`fn` is called exactly as `mha.numpy.NAME` is called, on seeded random inputs
and edge cases. On success the check prints one line and returns None. On
failure it raises `CheckFailed` saying which input, what was expected and what
came back, with a hint when the answer matches a classic mistake. A stub that
still raises NotImplementedError makes the check raise NotImplementedError too,
so a handout run top to bottom stops there.

    from mha.checks import check_softmax
    check_softmax(my_softmax)

Each chapter's checks live in `mha.checks.ch01` ... `mha.checks.ch09`, with
their cases and their catalogue of classic mistakes side by side; the machinery
that registers and runs them is `mha.checks.registry`.
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
]
