"""The counts of mha.experiments.counting against real modules and against a count by hand."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import mha.torch as mt
from mha.experiments.counting import (attention_multiply_adds, attention_parameters, block_multiply_adds,
                                      head_width)


def numel(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("d_model, n_heads, d_head", [
    (8, 2, None),  # narrow: d_head = 4
    (8, 2, 8),  # wide
    (12, 3, 5),  # neither: an odd head width
    (6, 1, None),  # one head
    (512, 8, None),  # the Transformer's base size
    (512, 8, 512),  # its wide version
])
def test_parameters_match_the_loop_module(d_model, n_heads, d_head):
    # MultiHeadAttentionLoop has no biases; meta tensors have shapes but no memory.
    module = mt.MultiHeadAttentionLoop(d_model, n_heads, d_head, device="meta")
    assert attention_parameters(d_model, n_heads, d_head, bias=False) == numel(module)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("d_model, n_heads", [(8, 2), (6, 3), (64, 1), (512, 8)])
def test_parameters_match_the_fused_modules(d_model, n_heads, bias):
    ours = mt.MultiHeadAttention(d_model, n_heads, bias=bias, device="meta")
    theirs = torch.nn.MultiheadAttention(d_model, n_heads, bias=bias, device="meta")
    expected = attention_parameters(d_model, n_heads, bias=bias)
    assert expected == numel(ours)
    assert expected == numel(theirs)


def test_narrow_parameters_do_not_depend_on_the_number_of_heads():
    counts = {attention_parameters(512, h) for h in (1, 2, 4, 8, 16)}
    assert counts == {4 * 512 * 512}
    assert attention_parameters(512, 8, 512) == 8 * 4 * 512 * 512  # wide: h times more


def test_bias_adds_three_head_widths_and_one_model_width():
    assert attention_parameters(8, 2, 3, bias=True) - attention_parameters(8, 2, 3) == 3 * 2 * 3 + 8


def test_multiply_adds_by_hand():
    # T_q=2 queries, T_k=3 keys, d=4, h=2 heads of width 2, counted product by product:
    # Q: (2, 4) @ (4, 4) -> 2*4*4 = 32; K and V: (3, 4) @ (4, 4) -> 3*4*4 = 48 each;
    # W_o: (2, 4) @ (4, 4) -> 32.  Per head, Q K^T: (2, 2) @ (2, 3) -> 2*2*3 = 12,
    # weights @ V: (2, 3) @ (3, 2) -> 2*3*2 = 12; two heads give 24 each.
    cost = attention_multiply_adds(T_q=2, T_k=3, d_model=4, n_heads=2, d_head=2)
    assert cost.projections == 32 + 48 + 48 + 32
    assert cost.scores == 24
    assert cost.weighted_sum == 24
    assert cost.attention == 48
    assert cost.total == 208


def test_narrow_is_the_default_head_width():
    assert head_width(12, 3) == 4
    assert attention_multiply_adds(5, 5, 12, 3) == attention_multiply_adds(5, 5, 12, 3, 4)


def test_wide_costs_h_times_narrow():
    narrow = attention_multiply_adds(128, 128, 512, 8)
    wide = attention_multiply_adds(128, 128, 512, 8, d_head=512)
    assert wide.projections == 8 * narrow.projections
    assert wide.attention == 8 * narrow.attention
    assert narrow.projections == 4 * 128 * 512 * 512
    assert narrow.attention == 2 * 128 * 128 * 512


@pytest.mark.parametrize("T_q, T_k, d_model, n_heads, d_head", [
    (5, 5, 8, 2, None), (5, 5, 8, 2, 8), (3, 7, 12, 3, 5), (1, 4, 6, 1, None),
])
def test_multiply_adds_match_pytorchs_flop_counter(T_q, T_k, d_model, n_heads, d_head):
    # PyTorch counts 2 floating-point operations (a multiply and an add) per multiply-add.
    module = mt.MultiHeadAttentionLoop(d_model, n_heads, d_head, device="meta")
    x, context = torch.empty(T_q, d_model, device="meta"), torch.empty(T_k, d_model, device="meta")
    with FlopCounterMode(display=False) as counter:
        module(x, context)
    assert counter.get_total_flops() == 2 * attention_multiply_adds(T_q, T_k, d_model, n_heads, d_head).total


def test_fused_module_costs_the_same_as_the_loop():
    module = mt.MultiHeadAttention(8, 2, bias=False, device="meta")
    with FlopCounterMode(display=False) as counter:
        module(torch.empty(6, 8, device="meta"), return_weights=True)
    assert counter.get_total_flops() == 2 * attention_multiply_adds(6, 6, 8, 2).total


def test_block_multiply_adds_by_hand():
    # T=4 tokens, d=6, h=2 heads of width 3, d_ff=10. Projections: 4 products (4, 6) @ (6, 6) = 576.
    # Feed-forward: (4, 6) @ (6, 10) and (4, 10) @ (10, 6): 240 each. Attention: 2 heads, 16 pairs,
    # width 3, for the scores and again for the weighted sums: 2 * 2 * 16 * 3 = 192; causal: 10 pairs.
    full = block_multiply_adds(4, 6, 2, 10)
    assert (full.projections, full.attention, full.feed_forward, full.total) == (576, 192, 480, 1248)
    causal = block_multiply_adds(4, 6, 2, 10, causal=True)
    assert (causal.projections, causal.attention, causal.feed_forward) == (576, 120, 480)


@pytest.mark.parametrize("T, d_model, n_heads, d_ff", [(5, 8, 2, 32), (3, 12, 3, 7), (1, 6, 1, 24)])
def test_block_multiply_adds_match_pytorchs_flop_counter_on_an_encoder_block(T, d_model, n_heads, d_ff):
    block = mt.EncoderBlock(d_model, n_heads, d_ff, device="meta")
    with FlopCounterMode(display=False) as counter:
        block(torch.empty(T, d_model, device="meta"), return_weights=True)
    assert counter.get_total_flops() == 2 * block_multiply_adds(T, d_model, n_heads, d_ff).total


def test_the_block_crossovers_of_chapter_8():
    """Attention equals everything else at T = 6d in a block with d_ff = 4d; the layer alone at T = 2d;
    causal attention halves the attention part (T = 12d, to within the diagonal's share)."""
    d = 512
    layer = attention_multiply_adds(2 * d, 2 * d, d, 8)
    assert layer.attention == layer.projections
    block = block_multiply_adds(6 * d, d, 8, 4 * d)
    assert block.attention == block.projections + block.feed_forward
    assert block.feed_forward == 2 * block.projections == 8 * 6 * d * d * d
    causal = block_multiply_adds(12 * d, d, 8, 4 * d, causal=True)
    assert causal.attention / (causal.projections + causal.feed_forward) == pytest.approx(1, rel=1e-3)
    for T in (1, 7, 64):
        full, half = block_multiply_adds(T, 64, 4, 256), block_multiply_adds(T, 64, 4, 256, causal=True)
        assert half.attention * 2 * T == full.attention * (T + 1)


@pytest.mark.parametrize("call, error, message", [
    (lambda: attention_parameters(10, 3), ValueError, "d_model=10 is not divisible by n_heads=3"),
    (lambda: attention_parameters(8, 0), ValueError, "n_heads must be at least 1"),
    (lambda: attention_parameters(8, 2, 0), ValueError, "d_head must be at least 1"),
    (lambda: attention_parameters(8.0, 2), TypeError, "d_model must be an integer"),
    (lambda: attention_parameters(8, 2, bias=1), TypeError, "bias must be True or False"),
    (lambda: attention_multiply_adds(0, 4, 8, 2), ValueError, "T_q must be at least 1"),
    (lambda: block_multiply_adds(4, 8, 2, 0), ValueError, "d_ff must be at least 1"),
    (lambda: block_multiply_adds(4, 8, 2, 32, causal=1), TypeError, "causal must be True or False"),
    (lambda: block_multiply_adds(0, 8, 2, 32), ValueError, "T must be at least 1"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
