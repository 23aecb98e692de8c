"""Bad input gets a clear ValueError/TypeError naming what was expected and what was given."""

import re

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt

X = np.ones((2, 4, 6))
W = np.ones((6, 6))
PARAMS = {f"W_{n}": W for n in "qkvo"}
x = torch.ones(2, 4, 6)
MHA = mt.MultiHeadAttention(6, 2)
BLOCK = {**PARAMS, "gamma_1": np.ones(6), "W_1": np.ones((6, 8)), "W_2": np.ones((8, 6)), "gamma_2": np.ones(6)}

CASES = {
    # d_model not divisible by n_heads
    "numpy split_heads 10/3": (lambda: mn.split_heads(np.ones((4, 10)), 3), ValueError,
                               "d_model=10 is not divisible by n_heads=3"),
    "numpy multihead 6/4": (lambda: mn.multihead_attention(X, n_heads=4, **PARAMS), ValueError,
                            "d_model=6 is not divisible by n_heads=4"),
    "torch module 10/3": (lambda: mt.MultiHeadAttention(10, 3), ValueError,
                          "d_model=10 is not divisible by n_heads=3"),
    "torch split_heads 6/4": (lambda: mt.split_heads(x, 4), ValueError, "d_model=6 is not divisible by n_heads=4"),
    "torch loop narrow 10/3": (lambda: mt.MultiHeadAttentionLoop(10, 3), ValueError, "not divisible"),
    # n_heads < 1 or not an integer
    "numpy n_heads 0": (lambda: mn.split_heads(X, 0), ValueError, "n_heads must be at least 1, got n_heads=0"),
    "torch n_heads 0": (lambda: mt.MultiHeadAttention(6, 0), ValueError, "n_heads must be at least 1"),
    "numpy n_heads float": (lambda: mn.multihead_attention(X, n_heads=2.0, **PARAMS), TypeError,
                            "n_heads must be an integer, got float 2.0"),
    "torch d_model bool": (lambda: mt.MultiHeadAttention(True, 1), TypeError, "d_model must be an integer"),
    # wrong rank
    "numpy vector input": (lambda: mn.self_attention(np.ones(6)), ValueError,
                           r"X must have at least 2 dimensions, got 1 \(shape \(6,\)\)"),
    "numpy merge rank 2": (lambda: mn.merge_heads(np.ones((4, 6))), ValueError, "at least 3 dimensions, got 2"),
    "torch vector input": (lambda: MHA(torch.ones(6)), ValueError, "x must have at least 2 dimensions, got 1"),
    "numpy W rank 1": (lambda: mn.symmetric_attention(X, np.ones(6)), ValueError,
                       r"W must be a matrix \(2 dimensions\), got shape \(6,\)"),
    "numpy empty sequence": (lambda: mn.self_attention(np.ones((0, 6))), ValueError, "T >= 1"),
    # last dimensions that do not match the weights
    "numpy W_q rows": (lambda: mn.head_attention(X, np.ones((5, 2)), np.ones((6, 2))), ValueError,
                       r"W_q has shape \(5, 2\), so it expects vectors of width 5, but X has width d=6"),
    "numpy W_q/W_k widths": (lambda: mn.head_attention(X, np.ones((6, 2)), np.ones((6, 3))), ValueError,
                             r"query and key widths must match: W_q.shape\[1\]=2 but W_k.shape\[1\]=3"),
    "numpy W_o rows": (lambda: mn.multihead_attention(X, W, W, W, np.ones((4, 6)), 2), ValueError,
                       r"W_o has shape \(4, 6\).*merged heads has width d=6"),
    "numpy loop W_o rows": (lambda: mn.multihead_attention_loop(X, [(W, W, W)], np.ones((4, 6))), ValueError,
                            r"W_o has shape \(4, 6\)"),
    "numpy bias shape": (lambda: mn.multihead_attention(X, n_heads=2, b_q=np.ones(5), **PARAMS), ValueError,
                         r"b_q must have shape \(6,\), got shape \(5,\)"),
    "numpy gamma shape": (lambda: mn.layer_norm(X, np.ones(5), np.ones(6)), ValueError,
                          r"gamma must have shape \(6,\), got shape \(5,\)"),
    "numpy feed-forward rows": (lambda: mn.feed_forward(X, np.ones((5, 8)), None, np.ones((8, 6)), None),
                                ValueError, r"W_1 has shape \(5, 8\)"),
    "torch input width": (lambda: MHA(torch.ones(2, 4, 5)), ValueError,
                          r"x has shape \(2, 4, 5\), so width 5, but the module expects width 6"),
    "torch block input width": (lambda: mt.EncoderBlock(6, 2, 8)(torch.ones(3, 4)), ValueError, "expects width 6"),
    "numpy sdpa Q/K widths": (lambda: mn.scaled_dot_product_attention(np.ones((3, 4)), np.ones((5, 2)), np.ones((5, 2))),
                              ValueError, r"Q.shape\[-1\]=4 but K.shape\[-1\]=2"),
    "torch sdpa K/V lengths": (lambda: mt.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(5, 4), torch.ones(6, 4)),
                               ValueError, r"numbers of keys and values must match: K.shape\[-2\]=5 but V.shape\[-2\]=6"),
    "numpy batches": (lambda: mn.scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((3, 3, 4)), np.ones((3, 3, 4))),
                      ValueError, r"batch dimensions of Q \(2,\) and K \(3,\) do not broadcast"),
    # context with a different d
    "numpy context width": (lambda: mn.multihead_attention(X, n_heads=2, context=np.ones((2, 3, 5)), **PARAMS),
                            ValueError, "but context has width d=5"),
    "torch context width": (lambda: MHA(x, torch.ones(2, 3, 5)), ValueError,
                            r"context has shape \(2, 3, 5\), so width 5, but the module expects width 6"),
    # masks of the wrong shape or dtype
    "numpy mask shape": (lambda: mn.multihead_attention(X, n_heads=2, mask=np.ones((2, 5), bool), **PARAMS),
                         ValueError, r"mask has shape \(2, 5\) but scores have shape \(2, 2, 4, 4\)"),
    "numpy mask grows scores": (lambda: mn.scaled_dot_product_attention(np.ones((4, 3)), np.ones((4, 3)), np.ones((4, 3)),
                                                                        np.ones((2, 4, 4), bool)),
                                ValueError, r"mask has shape \(2, 4, 4\) but scores have shape \(4, 4\)"),
    "numpy mask dtype": (lambda: mn.multihead_attention(X, n_heads=2, mask=np.ones((4, 4)), **PARAMS),
                         TypeError, "mask must be boolean .*, got dtype float64"),
    "torch mask shape": (lambda: MHA(x, mask=torch.ones(3, 3, dtype=torch.bool)), ValueError,
                         r"mask has shape \(3, 3\) but scores have shape \(2, 2, 4, 4\)"),
    "torch mask dtype": (lambda: MHA(x, mask=torch.ones(4, 4)), TypeError, "got dtype torch.float32"),
    "torch mask not a tensor": (lambda: MHA(x, mask=np.ones((4, 4), bool)), TypeError, "got ndarray"),
    "torch loop mask shape": (lambda: mt.MultiHeadAttentionLoop(6, 2)(x, mask=torch.ones(5, 5, dtype=torch.bool)),
                              ValueError, r"mask has shape \(5, 5\)"),
    # lengths longer than T, negative or not integers
    "numpy lengths > T": (lambda: mn.padding_mask([3, 5], 4), ValueError, r"lengths\[1\]=5 is outside 0..T with T=4"),
    "numpy lengths < 0": (lambda: mn.padding_mask([-1], 4), ValueError, r"lengths\[0\]=-1 is outside"),
    "numpy lengths float": (lambda: mn.padding_mask([1.5], 4), TypeError, "lengths must be integers, got dtype float64"),
    "numpy lengths 2-D": (lambda: mn.padding_mask([[1, 2]], 4), ValueError, r"lengths must be 1-D.*\(1, 2\)"),
    "torch lengths > T": (lambda: mt.padding_mask(torch.tensor([7]), 4), ValueError, r"lengths\[0\]=7 is outside"),
    "torch lengths float": (lambda: mt.padding_mask(torch.tensor([1.0]), 4), TypeError, "lengths must be integers"),
    "numpy causal T=0": (lambda: mn.causal_mask(0), ValueError, "T must be at least 1, got T=0"),
    "torch causal T float": (lambda: mt.causal_mask(2.5), TypeError, "T must be an integer, got float 2.5"),
    # wrong types and options
    "torch numpy input": (lambda: MHA(np.ones((2, 4, 6))), TypeError, "x must be a torch.Tensor, got ndarray"),
    "torch integer input": (lambda: MHA(torch.ones(2, 4, 6, dtype=torch.long)), TypeError,
                            "x must be a floating-point tensor, got dtype torch.int64"),
    "numpy string input": (lambda: mn.softmax(np.array(["a", "b"])), TypeError, "x must be an array of numbers"),
    "numpy activation": (lambda: mn.feed_forward(X, W, None, W, None, activation="tanh"), ValueError,
                         'activation must be "relu" or "gelu", got \'tanh\''),
    "torch activation": (lambda: mt.EncoderBlock(6, 2, 8, activation="swish"), ValueError, "got 'swish'"),
    "numpy block params": (lambda: mn.encoder_block(X, 2, **{**BLOCK, "W_3": W}), TypeError,
                           r"unknown: \['W_3'\], missing: \[\]"),
    "numpy block missing": (lambda: mn.encoder_block(X, 2, **PARAMS), TypeError,
                            r"missing: \['gamma_1', 'W_1', 'W_2', 'gamma_2'\]"),
    "numpy no heads": (lambda: mn.multihead_attention_loop(X, [], W), ValueError, "at least one"),
    "numpy no layers": (lambda: mn.encoder(X, [], 2), ValueError, "at least one"),
    "torch from_torch type": (lambda: mt.MultiHeadAttention.from_torch(torch.nn.Linear(2, 2)), TypeError,
                              "expected a torch.nn.MultiheadAttention, got Linear"),
    "torch from_torch kdim": (lambda: mt.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(6, 2, kdim=4)),
                              ValueError, "kdim = vdim = embed_dim"),
    "torch encoder final norm": (lambda: mt.Encoder.from_torch(torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(6, 2, 8), 2, norm=torch.nn.LayerNorm(6), enable_nested_tensor=False)),
        ValueError, "final norm"),
    # tensors of another kind, dtype or device than expected (no raw torch error may reach a user)
    "torch split_heads ndarray": (lambda: mt.split_heads(np.ones((4, 6)), 2), TypeError,
                                  "x must be a torch.Tensor, got ndarray"),
    "torch merge_heads ndarray": (lambda: mt.merge_heads(np.ones((2, 4, 3))), TypeError,
                                  "x must be a torch.Tensor, got ndarray"),
    "torch masked_softmax ndarray": (lambda: mt.masked_softmax(np.ones((3, 3))), TypeError,
                                     "scores must be a torch.Tensor, got ndarray"),
    "torch masked_softmax integers": (lambda: mt.masked_softmax(torch.ones(3, 3, dtype=torch.long)), TypeError,
                                      "scores must be a floating-point tensor, got dtype torch.int64"),
    "torch masked_softmax int mask": (lambda: mt.masked_softmax(torch.ones(3, 3), torch.ones(3, 3, dtype=torch.long)),
                                      TypeError, "mask must be boolean .*, got dtype torch.int64"),
    "torch masked_softmax float mask": (lambda: mt.masked_softmax(torch.ones(3, 3), torch.ones(3, 3)), TypeError,
                                        "mask must be boolean"),
    "torch masked_softmax mask shape": (lambda: mt.masked_softmax(torch.ones(3, 3), torch.ones(4, 3, dtype=torch.bool)),
                                        ValueError, r"mask has shape \(4, 3\) but scores have shape \(3, 3\)"),
    "torch float64 into float32": (lambda: MHA(x.double()), TypeError,
                                   "x has dtype torch.float64 but MultiHeadAttention's parameters are torch.float32"),
    "torch float64 into a block": (lambda: mt.EncoderBlock(6, 2, 8)(x.double()), TypeError,
                                   "x has dtype torch.float64 but EncoderBlock's parameters are torch.float32"),
    "torch float64 into a feed-forward": (lambda: mt.FeedForward(6, 8)(x.double()), TypeError,
                                          "x has dtype torch.float64 but FeedForward's parameters are torch.float32"),
    "torch Q and K dtypes": (lambda: mt.scaled_dot_product_attention(x, x.double(), x), TypeError,
                             "Q has dtype torch.float32 but K has dtype torch.float64"),
    "torch mask on meta": (lambda: MHA(x, mask=torch.ones(4, 4, dtype=torch.bool, device="meta")), ValueError,
                           "mask is on meta, the input on cpu"),
    "torch padding mask on meta": (lambda: MHA(x, mask=mt.padding_mask(torch.tensor([4, 2], device="meta"), 4)),
                                   ValueError, "mask is on meta, the input on cpu"),
    "torch input on meta": (lambda: MHA(x.to("meta")), ValueError,
                            "x is on meta, MultiHeadAttention's parameters on cpu"),
    "torch sdpa mask device": (lambda: mt.scaled_dot_product_attention(x, x, x, torch.ones(4, 4, dtype=torch.bool,
                                                                                             device="meta")),
                               ValueError, "mask is on meta, the input on cpu"),
    "torch chunked mask device": (lambda: mt.chunked_attention(x, x, x, torch.ones(4, dtype=torch.bool, device="meta")),
                                  ValueError, "mask is on meta"),
    "torch decoder mask device": (lambda: mt.DecoderBlock(6, 2, 8)(x, x, torch.ones(4, 4, dtype=torch.bool,
                                                                                    device="meta")),
                                  ValueError, "self_mask is on meta"),
    "torch dropout negative": (lambda: mt.MultiHeadAttention(6, 2, dropout=-0.5), ValueError,
                               r"dropout must be a probability in \[0, 1\), got -0.5"),
    "torch block dropout 1.5": (lambda: mt.EncoderBlock(6, 2, 8, dropout=1.5), ValueError, "got 1.5"),
    "torch dropout string": (lambda: mt.FeedForward(6, 8, dropout="0.1"), ValueError, "got '0.1'"),
    # NumPy input that cannot mean what it seems to
    "numpy complex input": (lambda: mn.softmax(np.array([1 + 2j, 3])), TypeError,
                            "x must hold real numbers, got dtype complex128"),
    "numpy complex weights": (lambda: mn.head_attention(X, W + 1j, W), TypeError, "W_q must hold real numbers"),
    "numpy W_k wider, with biases": (lambda: mn.multihead_attention(X, W, np.ones((6, 12)), W, W, 2,
                                                                    b_q=np.ones(6), b_k=np.ones(6)),
                                     ValueError, r"query and key widths must match: W_q.shape\[1\]=6 but "
                                                 r"W_k.shape\[1\]=12"),
    "numpy values not divisible": (lambda: mn.multihead_attention(X, W, W, np.ones((6, 5)), np.ones((5, 6)), 2),
                                   ValueError, "the values' width d_v=5 is not divisible by n_heads=2"),
    "numpy heads_from_fused 6/4": (lambda: mn.heads_from_fused(W, W, W, 4), ValueError,
                                   "the width of W_q=6 is not divisible by n_heads=4"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_rejected_with_a_clear_message(case):
    call, error, pattern = case
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"expected exactly {error.__name__}, got {type(info.value).__name__}"
    assert re.search(pattern, str(info.value)), f"message {str(info.value)!r} does not match {pattern!r}"


def test_a_good_call_next_to_each_bad_one_works():
    """The rejections above are not a library that rejects everything."""
    assert mn.split_heads(np.ones((4, 9)), 3).shape == (3, 4, 3)
    assert mn.padding_mask(np.array([0, 4]), 4).shape == (2, 1, 1, 4)
    assert MHA(x, mask=torch.ones(4, 4, dtype=torch.bool)).shape == (2, 4, 6)
    assert mn.encoder_block(X, 2, **BLOCK)[0].shape == X.shape
    assert mn.padding_mask([], 4).shape == (0, 1, 1, 4) and mt.padding_mask([], 4).shape == (0, 1, 1, 4)
    assert MHA(x, mask=torch.tensor(True)).shape == (2, 4, 6)  # a 0-D mask broadcasts like any other


def test_nan_and_inf_pass_through_as_in_pytorch():
    """NaN or inf in the inputs is not an error: like PyTorch, attention lets it reach every
    output that depends on it, and only those. Both faces agree with F.scaled_dot_product_attention."""
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    K[0, 1, 0] = np.nan  # a NaN key in sequence 0 reaches all of sequence 0's outputs
    V[1, 2, 1] = np.inf  # an infinite value in sequence 1 reaches its column 1
    expected = torch.nn.functional.scaled_dot_product_attention(*(torch.as_tensor(a) for a in (Q, K, V))).numpy()
    assert np.isnan(expected[0]).all() and np.isfinite(expected[1, :, 0]).all()
    for out in (mn.scaled_dot_product_attention(Q, K, V)[0],
                mt.scaled_dot_product_attention(*(torch.as_tensor(a) for a in (Q, K, V)))[0].numpy(),
                mn.chunked_attention(Q, K, V, chunk=2)):
        np.testing.assert_array_equal(np.isfinite(out), np.isfinite(expected))
        np.testing.assert_allclose(out[np.isfinite(out)], expected[np.isfinite(expected)], rtol=1e-12)
