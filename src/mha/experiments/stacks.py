"""Chapter 6: random (untrained) encoder stacks, and what residual sums and the place of the
LayerNorm do to them.

- `sentence_vectors`, `random_blocks`, `random_stacks`: chapter 6's sentence and blocks of width
  d = 8, h = 2 heads and d_ff = 32, drawn from torch.manual_seed.
- `token_similarity`, `block_without_residuals`: how alike the words become, and a block without
  its residual sums.
- Sweeps over seeds (`mha.experiments.seeds`), whose stored tables the chapter reads:
  "ch06_residuals" (words collapse without residual sums), "ch06_depth" (the stream through 32
  blocks, post-norm and pre-norm) and "ch06_gradients" (the gradient at each block's input).
"""

import numpy as np
import torch

import mha.numpy as mnp
import mha.torch as mt
from mha.experiments import seeds, tasks

BLOCK_SIZES = (8, 2, 32)  # chapter 6's (d, n_heads, d_ff)


def sentence_vectors():
    """Chapter 6's first sentence: the course's vector of each word, (T, d) = (10, 8)."""
    return tasks.word_vectors(tasks.SENTENCE)


def random_blocks(n_blocks, dtype=None):
    """`n_blocks` untrained `mha.torch.EncoderBlock`s of chapter 6's sizes, drawn one after the other."""
    return [mt.EncoderBlock(*BLOCK_SIZES, dtype=dtype) for _ in range(n_blocks)]


def random_stacks(n_stacks, depth):
    """`n_stacks` lists of `depth` random blocks' NumPy parameters, drawn stack after stack."""
    return [[block.numpy_params() for block in random_blocks(depth)] for stack in range(n_stacks)]


def token_similarity(Z):
    """Mean cosine similarity between the rows of Z (T, d), over every pair of different rows."""
    unit = Z / np.linalg.norm(Z, axis=-1, keepdims=True)  # (T, d), rows of length 1
    n = len(Z)
    return float(((unit @ unit.T).sum() - n) / (n * (n - 1)))  # the diagonal holds n ones


def block_without_residuals(Z, p, n_heads=2):
    """Chapter 6's post-norm encoder block minus its two residual sums: LN_2(FF(LN_1(MHA(Z))))."""
    attention = {k: p[k] for k in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")}
    mixed, _ = mnp.multihead_attention(Z, n_heads=n_heads, **attention)
    Y = mnp.layer_norm(mixed, p["gamma_1"], p["beta_1"])
    return mnp.layer_norm(mnp.feed_forward(Y, p["W_1"], p["b_1"], p["W_2"], p["b_2"]), p["gamma_2"], p["beta_2"])


@seeds.sweep("ch06_residuals", seeds=range(20), tolerance=1e-4, held_out=range(100, 110))
def residual_collapse(seed, n_stacks=8, depth=6):
    """How alike the sentence's words become in `n_stacks` stacks of `depth` random post-norm blocks
    (torch.manual_seed(seed), then the blocks stack after stack), with and without residual sums.

    `with_residuals` and `without_residuals`: after each block, `token_similarity` averaged over
    the stacks, (depth,).
    """
    X = sentence_vectors()
    torch.manual_seed(seed)
    stacks = random_stacks(n_stacks, depth)
    alike = np.zeros((2, n_stacks, depth))  # with, without residual sums
    for n, stack in enumerate(stacks):
        Z_with = Z_without = X
        for s, p in enumerate(stack):
            Z_with, _ = mnp.encoder_block(Z_with, BLOCK_SIZES[1], **p)
            Z_without = block_without_residuals(Z_without, p, BLOCK_SIZES[1])
            alike[:, n, s] = token_similarity(Z_with), token_similarity(Z_without)
    return {"with_residuals": alike[0].mean(axis=0), "without_residuals": alike[1].mean(axis=0)}


@seeds.sweep("ch06_depth", seeds=range(10), tolerance=1e-4, held_out=(100, 101, 102))
def stream_growth(seed, n_stacks=8, depth=32):
    """The sentence through `n_stacks` stacks of `depth` random blocks (torch.manual_seed(seed),
    then the blocks stack after stack), post-norm and pre-norm with the same parameters.

    After each block, averaged over the stacks, (depth,): `<way>_norm`, the mean norm of the
    token vectors, and `<way>_change`, the mean norm of (output - input) over the mean norm of
    the input, for way = post, pre.
    """
    X = sentence_vectors()
    torch.manual_seed(seed)
    stacks = random_stacks(n_stacks, depth)
    row = {}
    for way in ("post", "pre"):
        norm, change = np.zeros((n_stacks, depth)), np.zeros((n_stacks, depth))
        for n, stack in enumerate(stacks):
            stream = X
            for s, p in enumerate(stack):
                out, _ = mnp.encoder_block(stream, BLOCK_SIZES[1], norm_first=way == "pre", **p)
                size = np.linalg.norm(stream, axis=-1).mean()
                change[n, s] = np.linalg.norm(out - stream, axis=-1).mean() / size
                norm[n, s] = np.linalg.norm(out, axis=-1).mean()
                stream = out
        row[f"{way}_norm"], row[f"{way}_change"] = norm.mean(axis=0), change.mean(axis=0)
    return row


@seeds.sweep("ch06_gradients", seeds=range(200), tolerance=1e-4, held_out=range(200, 230))
def gradient_through_depth(seed, depth=12):
    """The norm of the gradient at the input of each of `depth` random blocks (float64,
    torch.manual_seed(seed)), for the loss sum(output * R), R a fixed normal tensor (seed 99).

    `post_norm`, `pre_norm`: the same blocks with their residual sums, post-norm then pre-norm;
    `no_residuals`: the post-norm sublayers without the sums. Each (depth,), block 1 first.
    """
    X = torch.tensor(sentence_vectors())  # (T, d), float64
    torch.manual_seed(seed)
    blocks = random_blocks(depth, dtype=torch.float64)
    probe = torch.randn(X.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(99))
    row = {}
    for way in ("post_norm", "pre_norm", "no_residuals"):
        stream, block_inputs = X.clone().requires_grad_(True), []
        for block in blocks:
            block.norm_first = way == "pre_norm"
            block_inputs.append(stream)
            if way == "no_residuals":
                stream = block.norm_2(block.feed_forward(block.norm_1(block.attention(stream))))
            else:
                stream = block(stream)
        grads = torch.autograd.grad((stream * probe).sum(), block_inputs)
        row[way] = [float(g.norm()) for g in grads]
    for block in blocks:
        block.norm_first = False
    return row
