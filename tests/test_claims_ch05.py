"""Chapter 5's claims over draws: its asserts and sentences hold beyond the weights it drew.

The chapter draws W_Q, W_K, W_V and W_O with `np.random.default_rng(1)`, on the word vectors of
noise draw 0; here every claim is checked on 20 seeds of the weights times 5 draws of the noise (the
padding sweep on 10 times 2).
Dropout draws from PyTorch's generator: its asserts are checked on 20 seeds. The timing
exercise states measured ranges (a named machine, fourteen runs); timings are never asserted in
tests (machines are shared and noisy): `benchmarks/` measures the loop against the fused form.
"""

import itertools

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt
from mha.experiments import tasks

H = 2
SECOND = "my money is at the bank".split()
DRAWS = list(itertools.product(range(20), range(5)))  # (seed of the weights, seed of the noise)
FEWER = list(itertools.product(range(10), range(2)))  # for the slower padding sweep

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def embed(words, noise_seed):
    """The chapter's `embed`: the course's vectors, zeros for <pad> at the end."""
    real = [w for w in words if w != "<pad>"]
    vectors = tasks.word_vectors(real, noise_seed)
    return np.concatenate([vectors, np.zeros((len(words) - len(real), vectors.shape[1]))])


def chapter_batch(noise_seed):
    return np.stack([embed(s, noise_seed) for s in (tasks.SENTENCE, SECOND + ["<pad>"] * 4)])  # (B, T, d)


def weights(seed):
    return np.random.default_rng(seed).normal(size=(4, 8, 8)) / np.sqrt(8)


def test_splitting_without_the_transpose_is_far_from_the_right_answer_on_every_draw():
    """The chapter's `assert diff > 0.1` for the split that forgets the transpose."""
    for seed, noise in DRAWS:
        X = chapter_batch(noise)
        B, T, d = X.shape
        W_q, W_k, W_v, W_o = weights(seed)
        right, _ = mnp.multihead_attention(X, W_q, W_k, W_v, W_o, n_heads=H)
        wrong, _ = mnp.scaled_dot_product_attention(*(A.reshape(B, H, T, d // H) for A in (X @ W_q, X @ W_k, X @ W_v)))
        assert np.abs(wrong.reshape(B, T, d) @ W_o - right).max() > 0.1, (seed, noise)


def test_without_a_mask_padding_pulls_the_real_outputs_further_with_every_pad():
    """"the outputs of the real words drift further with every <pad> added, and their norm shrinks
    steadily. With the mask they do not move at all"; the chapter's prediction 1 / (S + 6)."""
    for seed, noise in FEWER:
        W_q, W_k, W_v, W_o = weights(seed)
        six = embed(SECOND, noise)
        alone, _ = mnp.multihead_attention(six, W_q, W_k, W_v, W_o, n_heads=H)
        drift, size = [], []
        for k in range(7):
            padded = np.concatenate([six, np.zeros((k, 8))])
            free, w_free = mnp.multihead_attention(padded, W_q, W_k, W_v, W_o, n_heads=H)
            kept, _ = mnp.multihead_attention(padded[None], W_q, W_k, W_v, W_o, n_heads=H,
                                              mask=mnp.padding_mask([6], 6 + k))
            drift.append(np.abs(free[:6] - alone).max())
            size.append(np.linalg.norm(free[:6], axis=-1).mean())
            assert np.abs(kept[0, :6] - alone).max() < 1e-12
        assert np.all(np.diff(drift) > 0) and np.all(np.diff(size) < 0), (seed, noise)
        q, k = mnp.split_heads(six @ W_q, H), mnp.split_heads(six @ W_k, H)
        real_sum = np.exp(q @ k.swapaxes(-1, -2) / np.sqrt(4)).sum(axis=-1)  # (h, 6)
        assert np.allclose(w_free[:, :6, 6:], (1 / (real_sum + 6))[..., None])


def test_dropout_zeroes_or_doubles_each_weight_and_eval_mode_switches_it_off():
    """The dropout cell's asserts, and "training mode, two calls give the same output: False", on
    20 seeds of PyTorch's generator."""
    x = torch.tensor(chapter_batch(0))
    for seed in range(20):
        torch.manual_seed(seed)
        row = torch.softmax(torch.randn(10, dtype=torch.float64), dim=-1)
        dropped = torch.nn.functional.dropout(row, p=0.5, training=True)
        assert torch.all((dropped == 0) | torch.isclose(dropped, 2 * row))
        dropping = mt.MultiHeadAttention(8, H, dropout=0.5, dtype=torch.float64)
        assert not torch.equal(dropping(x), dropping(x))
        plain = mt.MultiHeadAttention(8, H, dtype=torch.float64)
        plain.load_state_dict(dropping.state_dict())
        dropping.eval()
        assert torch.equal(dropping(x), plain(x)), seed
