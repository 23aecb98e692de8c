"""The decoder's causal property: the output at position t does not depend on the
target tokens after t, in the NumPy and the PyTorch block; and what cross-attention
cannot see (the order of the source)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mha.numpy as mn
from conftest import assert_close, random_decoder_params
from mha.torch import DecoderBlock

@st.composite
def decoder_inputs(draw):
    batch = draw(st.sampled_from([(), (1,), (2,)]))
    T_, S_ = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    h = draw(st.integers(1, 3))
    d_head = draw(st.integers(-(-3 // h), 3))  # d >= 3: LayerNorm over 1 or 2 features hides changes
    t = draw(st.integers(0, T_ - 1))
    return batch, T_, S_, h, h * d_head, t, draw(st.integers(0, 2**16)), draw(st.booleans())


@settings(max_examples=30, deadline=None)
@given(decoder_inputs())
def test_output_at_t_ignores_target_tokens_after_t(inputs):
    batch, T_, S_, h, d, t, seed, norm_first = inputs
    rng = np.random.default_rng(seed)
    params = random_decoder_params(rng, d, 2 * d)
    X, memory = rng.standard_normal((*batch, T_, d)), rng.standard_normal((*batch, S_, d))
    changed = X.copy()
    changed[..., t + 1:, :] = rng.standard_normal(changed[..., t + 1:, :].shape)  # new future tokens
    before, (w_before, _) = mn.decoder_block(X, memory, h, causal=True, norm_first=norm_first, **params)
    after, (w_after, _) = mn.decoder_block(changed, memory, h, causal=True, norm_first=norm_first, **params)
    assert_close(after[..., :t + 1, :], before[..., :t + 1, :], what="outputs up to t")
    assert_close(w_after[..., :t + 1, :], w_before[..., :t + 1, :], what="weights of queries up to t")
    if t + 1 < T_:  # the later positions do see the change
        assert np.abs(after[..., t + 1:, :] - before[..., t + 1:, :]).max() > 1e-6
    block = DecoderBlock(d, h, 2 * d, norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():
        torch_before = block(torch.as_tensor(X), torch.as_tensor(memory), causal=True)
        torch_after = block(torch.as_tensor(changed), torch.as_tensor(memory), causal=True)
    assert_close(torch_after[..., :t + 1, :], torch_before[..., :t + 1, :], what="torch outputs up to t")


def test_without_the_causal_mask_the_past_sees_the_future():
    rng = np.random.default_rng(5)
    params = random_decoder_params(rng, 6, 12)
    X, memory = rng.standard_normal((4, 6)), rng.standard_normal((3, 6))
    changed = X.copy()
    changed[-1] += 1.0  # only the last token
    before, _ = mn.decoder_block(X, memory, 2, **params)
    after, _ = mn.decoder_block(changed, memory, 2, **params)
    assert np.abs(after[0] - before[0]).max() > 1e-3


def test_cross_attention_ignores_the_order_of_the_source():
    """Without positions, shuffling the source tokens (and their mask) changes nothing."""
    rng = np.random.default_rng(6)
    params = random_decoder_params(rng, 6, 12)
    X, memory = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 5, 6))
    memory_mask = mn.padding_mask([5, 3], 5)
    order = rng.permutation(5)
    out, (_, cross) = mn.decoder_block(X, memory, 3, memory_mask=memory_mask, causal=True, **params)
    shuffled, (_, cross_shuffled) = mn.decoder_block(X, memory[:, order], 3, memory_mask=memory_mask[..., order],
                                                     causal=True, **params)
    assert_close(shuffled, out)
    assert_close(cross_shuffled, cross[..., order])
