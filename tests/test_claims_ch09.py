"""Chapter 9's claims over seeds (CONTRIBUTING.md, "Claims hold beyond the case tried").

The chapter runs random, untrained decoder blocks on its toy translation pair and says which
output positions change when a token changes. Those claims are about masks, not about the
draw: here they are checked with the blocks, the memory and the noise of 20 seeds. The toy
pair is the chapter's own: its setup cell runs here as it is.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mha.numpy as mnp
import mha.torch as mt

CHAPTER = Path(__file__).resolve().parent.parent / "book" / "09_decoder_attention.ipynb"
SETUP_CELL = "af6fd14f"  # the embeddings, the sources and the targets
SEEDS = range(20)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair():
    """The names that the chapter's setup cell defines (embeddings, X_src, Y, lengths, ...)."""
    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(CHAPTER.read_text())["cells"]}
    names = {"np": np}
    exec(compile(cells[SETUP_CELL], str(CHAPTER), "exec"), names)
    return names


def blocks(seed, d, h, d_ff):
    """A random decoder block's parameters and an encoder block's, drawn from `seed`."""
    torch.manual_seed(seed)
    return mt.DecoderBlock(d, h, d_ff).numpy_params(), mt.EncoderBlock(d, h, d_ff).numpy_params()


def test_with_the_causal_mask_only_the_edited_position_changes_on_every_seed(pair):
    Y, d, h, T, embedding = pair["Y"], pair["d"], pair["h"], pair["T"], pair["embedding"]
    edited = Y[0].copy()
    edited[-1] = embedding["argent"]  # the last word replaced, as in the chapter
    for seed in SEEDS:
        params, _ = blocks(seed, d, h, pair["d_ff"])
        self_params = {k[len("self_"):]: v for k, v in params.items() if k.startswith("self_")}
        for mask in (None, mnp.causal_mask(T)):
            before, _ = mnp.multihead_attention(Y[0], n_heads=h, mask=mask, **self_params)
            after, _ = mnp.multihead_attention(edited, n_heads=h, mask=mask, **self_params)
            change = np.abs(after - before).max(axis=-1)
            if mask is None:
                assert change.min() > 0, seed  # "every position's output changes"
            else:
                assert np.all(change[:-1] == 0) and change[-1] > 0.01, seed  # the chapter's assert


def test_the_future_stays_invisible_through_the_whole_block_on_every_seed(pair):
    Y, X_src, d, h, T = pair["Y"], pair["X_src"], pair["d"], pair["h"], pair["T"]
    source_padding = mnp.padding_mask(pair["source_lengths"], pair["T_k"])
    t = 4
    for seed in SEEDS:
        params, encoder_params = blocks(seed, d, h, pair["d_ff"])
        memory, _ = mnp.encoder_block(X_src, h, mask=source_padding, **encoder_params)
        future = Y.copy()
        future[0, t + 1:] = np.random.default_rng(seed).normal(size=(T - t - 1, d))
        before, _ = mnp.decoder_block(Y, memory, h, memory_mask=source_padding, causal=True, **params)
        after, _ = mnp.decoder_block(future, memory, h, memory_mask=source_padding, causal=True, **params)
        moved = np.abs(after[0] - before[0]).max(axis=-1)
        assert moved[: t + 1].max() == 0 and moved[t + 1:].min() > 0.01, seed  # the chapter's assert
        blind, _ = mnp.decoder_block(future, memory, h, memory_mask=source_padding, **params)
        unmasked, _ = mnp.decoder_block(Y, memory, h, memory_mask=source_padding, **params)
        assert np.abs(blind[0] - unmasked[0]).max(axis=-1)[: t + 1].min() > 0, seed  # without it, all move


def test_a_source_edit_reaches_every_target_position_and_a_target_edit_only_later_ones(pair):
    Y, X_src, d, h, embedding = pair["Y"], pair["X_src"], pair["d"], pair["h"], pair["embedding"]
    for seed in SEEDS:
        params, encoder_params = blocks(seed, d, h, pair["d_ff"])
        memory, _ = mnp.encoder_block(X_src[0], h, **encoder_params)
        base, _ = mnp.decoder_block(Y[0], memory, h, causal=True, **params)
        source = X_src[0].copy()
        source[-1] = embedding["money"]
        new_memory, _ = mnp.encoder_block(source, h, **encoder_params)
        out_source, _ = mnp.decoder_block(Y[0], new_memory, h, causal=True, **params)
        assert np.abs(out_source - base).max(axis=-1).min() > 0, seed  # "all nine target positions change"
        target = Y[0].copy()
        target[3] = embedding["est"]
        out_target, _ = mnp.decoder_block(target, memory, h, causal=True, **params)
        change = np.abs(out_target - base).max(axis=-1)
        assert change[:3].max() == 0 and change[3:].min() > 0, seed


def test_which_padding_masks_a_decoder_needs_on_every_seed(pair):
    Y, X_src, d, h, T, T_k = pair["Y"], pair["X_src"], pair["d"], pair["h"], pair["T"], pair["T_k"]
    tgt_keys, src_keys = mnp.padding_mask([7], T)[0], mnp.padding_mask([6], T_k)[0]
    for seed in SEEDS:
        params, encoder_params = blocks(seed, d, h, pair["d_ff"])
        memory, _ = mnp.encoder_block(X_src, h, mask=mnp.padding_mask(pair["source_lengths"], T_k), **encoder_params)
        noise = np.random.default_rng(seed)
        target, mem = Y[1].copy(), memory[1].copy()
        target_noisy, mem_noisy = target.copy(), mem.copy()
        target_noisy[7:], mem_noisy[6:] = noise.normal(size=(2, d)), noise.normal(size=(4, d))

        def change(tgt, tgt_noisy, mem_noisy, real, **masks):
            clean, _ = mnp.decoder_block(tgt, mem, h, causal=True, **masks, **params)
            noisy, _ = mnp.decoder_block(tgt_noisy, mem_noisy, h, causal=True, **masks, **params)
            return np.abs(noisy[real] - clean[real]).max()

        real = slice(0, 7)
        for use_tgt in (True, False):
            self_mask = tgt_keys if use_tgt else None
            assert change(target, target_noisy, mem_noisy, real, self_mask=self_mask, memory_mask=src_keys) == 0
            assert change(target, target_noisy, mem_noisy, real, self_mask=self_mask) > 0, seed
        left, left_noisy = np.roll(target, 2, axis=0), np.roll(target_noisy, 2, axis=0)
        left_keys = (np.arange(T) >= 2)[None, None, :]
        assert change(left, left_noisy, mem, slice(2, None), self_mask=left_keys, memory_mask=src_keys) == 0
        assert change(left, left_noisy, mem, slice(2, None), memory_mask=src_keys) > 0, seed
