"""GGUF's Q4_1 and Q8_0 blocks (mha.numpy.quantization, mha.torch.quantization) against the `gguf` package.

Every comparison is bit for bit (float32 words compared as integers, bytes as bytes): on random
blocks, on hand-made blocks whose answer is written out, and on real tensors of SmolLM2's file.
"""

import gguf
import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from mha.experiments import smollm2

Q4_1, Q8_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0


def bits(x):
    """float32 values as their 32-bit words (a tensor becomes an array): equal bits, equal words."""
    x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    assert x.dtype == np.float32
    return x.view(np.uint32)


def random_blocks(rng, n, n_bytes, n_scales):
    """n random blocks of n_bytes, whose first n_scales float16 (d, and m for Q4_1) are finite."""
    blocks = rng.integers(0, 256, size=(n, n_bytes), dtype=np.uint8)
    scales = (rng.standard_normal((n, n_scales)) * 10.0 ** rng.integers(-4, 2, size=(n, 1))).astype("<f2")
    blocks[:, :2 * n_scales] = scales.view(np.uint8)  # (n, 2 * n_scales)
    return blocks


@pytest.fixture(scope="module")
def real_file():
    """SmolLM2's GGUF file, read once (its tensors map the file)."""
    return smollm2.read_gguf(smollm2.smollm2_path())


# Hand-made blocks: the answer written out ---------------------------------------------------------------------


def q4_1_block(d, m, q):
    """One Q4_1 block from d, m and 32 integers q: byte j holds q[j] (low nibble) and q[j + 16] (high)."""
    q = np.asarray(q, dtype=np.uint8)
    packed = q[:16] | (q[16:] << 4)
    return np.concatenate([np.array([d, m], dtype="<f2").view(np.uint8), packed])  # (20,)


@pytest.mark.parametrize("face", [mn, mt])
def test_a_q4_1_block_is_d_times_q_plus_m_with_weight_j_and_j_plus_16_in_byte_j(face):
    q = np.array([*range(16), *range(15, -1, -1)])  # weights 0..15 rise, 16..31 fall
    block = q4_1_block(0.5, -3.0, q)
    assert block[4] == 0xF0 and block[5] == 0xE1  # byte 0: q_0 = 0 low, q_16 = 15 high; byte 1: 1 and 14
    blocks = block if face is mn else torch.from_numpy(block)
    expected = (0.5 * q - 3.0).astype(np.float32)
    assert np.array_equal(bits(face.dequantize_q4_1(blocks)), bits(expected))


@pytest.mark.parametrize("face", [mn, mt])
def test_a_q8_0_block_is_d_times_signed_q(face):
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.array([0.25], dtype="<f2").view(np.uint8), q.view(np.uint8)])  # (34,)
    blocks = block if face is mn else torch.from_numpy(block)
    assert np.array_equal(bits(face.dequantize_q8_0(blocks)), bits((0.25 * q).astype(np.float32)))


@pytest.mark.parametrize("face", [mn, mt])
def test_equal_weights_give_d_zero_and_come_back_exactly(face):
    w = np.full((2, 32), -1.75, dtype=np.float32)
    w[1] = 3.0
    blocks = face.quantize_q4_1(w if face is mn else torch.from_numpy(w))
    blocks = np.asarray(blocks)
    assert np.array_equal(blocks, gguf.quants.quantize(w, Q4_1))
    assert np.all(blocks[:, :2].view("<f2") == 0) and np.all(blocks[:, 4:] == 0)  # d = 0, every q = 0
    assert blocks[0, 2:4].view("<f2")[0] == -1.75 and blocks[1, 2:4].view("<f2")[0] == 3.0  # m is the weight
    assert np.array_equal(mn.dequantize_q4_1(blocks), w)


@pytest.mark.parametrize("face", [mn, mt])
def test_a_negative_minimum_on_a_grid_comes_back_exactly(face):
    """Weights -8 + 0.5 q (q in 0..15): m = -8 and d = 0.5, both exact in float16, so q and w return exactly."""
    q = np.random.default_rng(3).permutation(np.arange(32) % 16)  # every q from 0 to 15, twice, shuffled
    w = (-8 + 0.5 * q).astype(np.float32)[None]  # (1, 32)
    blocks = np.asarray(face.quantize_q4_1(w if face is mn else torch.from_numpy(w)))
    assert np.array_equal(blocks, gguf.quants.quantize(w, Q4_1))
    assert blocks[0, :4].view("<f2").tolist() == [0.5, -8.0]
    assert np.array_equal(blocks[0], q4_1_block(0.5, -8.0, q))
    assert np.array_equal(mn.dequantize_q4_1(blocks), w)


# Random blocks against gguf ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_dequantize_equals_gguf_on_random_blocks_in_both_faces(seed):
    rng = np.random.default_rng(seed)
    q4, q8 = random_blocks(rng, 500, 20, 2), random_blocks(rng, 500, 34, 1)
    for blocks, ours, kind in ((q4, "dequantize_q4_1", Q4_1), (q8, "dequantize_q8_0", Q8_0)):
        expected = gguf.quants.dequantize(blocks, kind)  # (500, 32)
        got_numpy = getattr(mn, ours)(blocks)
        got_torch = getattr(mt, ours)(torch.from_numpy(blocks))
        assert got_numpy.dtype == np.float32 and got_torch.dtype == torch.float32
        assert np.array_equal(bits(got_numpy), bits(expected)) and np.array_equal(bits(got_torch), bits(expected))


@pytest.mark.parametrize("seed", range(5))
def test_quantize_equals_gguf_byte_for_byte_in_both_faces(seed):
    rng = np.random.default_rng(100 + seed)
    w = (rng.standard_normal((400, 32)) * 10.0 ** rng.integers(-3, 3, size=(400, 1))
         + rng.standard_normal((400, 1))).astype(np.float32)  # blocks of many scales, some all one sign
    expected = gguf.quants.quantize(w, Q4_1)  # (400, 20)
    assert np.array_equal(mn.quantize_q4_1(w), expected)
    assert np.array_equal(mt.quantize_q4_1(torch.from_numpy(w)).numpy(), expected)
    assert np.array_equal(mn.quantize_q4_1(w.astype(np.float64)), expected), "float64 is rounded to float32 first"


def test_leading_axes_are_kept():
    blocks = random_blocks(np.random.default_rng(7), 6, 20, 2).reshape(2, 3, 20)
    assert mn.dequantize_q4_1(blocks).shape == (2, 3, 32)
    assert tuple(mt.dequantize_q4_1(torch.from_numpy(blocks)).shape) == (2, 3, 32)
    assert mn.quantize_q4_1(np.zeros((4, 1, 32))).shape == (4, 1, 20)


# Real tensors of SmolLM2's file ------------------------------------------------------------------------------


def test_the_file_holds_the_types_the_chapter_names(real_file):
    types = [t.type_name for t in real_file.tensors.values()]
    assert (types.count("Q4_1"), types.count("Q8_0"), types.count("F32"), len(types)) == (210, 1, 61, 272)


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.29.ffn_down.weight", "token_embd.weight"])
def test_real_tensors_dequantize_as_gguf_does(real_file, name):
    tensor = real_file.tensors[name]
    n_bytes = {"Q4_1": 20, "Q8_0": 34}[tensor.type_name]
    kind = gguf.GGMLQuantizationType[tensor.type_name]
    expected = gguf.quants.dequantize(tensor.raw, kind)  # (rows, columns)
    blocks = np.asarray(tensor.raw).reshape(tensor.shape[0], -1, n_bytes)  # (rows, blocks, bytes)
    face = {"Q4_1": "dequantize_q4_1", "Q8_0": "dequantize_q8_0"}[tensor.type_name]
    got_numpy = getattr(mn, face)(blocks).reshape(tensor.shape)  # (rows, blocks, 32) -> (rows, columns)
    got_torch = getattr(mt, face)(torch.from_numpy(np.array(blocks))).reshape(tensor.shape)
    assert expected.shape == tensor.shape
    assert np.array_equal(bits(got_numpy), bits(expected)) and np.array_equal(bits(got_torch), bits(expected))


def test_real_weights_quantize_as_gguf_does(real_file):
    """The embedding's first 300 rows (dequantized from Q8_0) written as Q4_1: byte for byte gguf's."""
    tensor = real_file.tensors["token_embd.weight"]
    w = gguf.quants.dequantize(np.asarray(tensor.raw)[:300], Q8_0)  # (300, 576)
    expected = gguf.quants.quantize(w, Q4_1)  # (300, 18 * 20)
    blocks = w.reshape(300, -1, 32)  # (300, 18, 32)
    assert np.array_equal(mn.quantize_q4_1(blocks).reshape(300, -1), expected)
    assert np.array_equal(mt.quantize_q4_1(torch.from_numpy(blocks)).reshape(300, -1).numpy(), expected)


# Bad input --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", [mn, mt])
def test_bad_blocks_are_refused_naming_what_was_expected(face):
    as_input = (lambda a: a) if face is mn else torch.from_numpy
    with pytest.raises(TypeError, match="uint8"):
        face.dequantize_q4_1(as_input(np.zeros((2, 20), dtype=np.float32)))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 20\).*got shape \(2, 18\)"):
        face.dequantize_q4_1(as_input(np.zeros((2, 18), dtype=np.uint8)))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 34\).*got shape \(3, 20\)"):
        face.dequantize_q8_0(as_input(np.zeros((3, 20), dtype=np.uint8)))
    with pytest.raises(TypeError, match="floating"):
        face.quantize_q4_1(as_input(np.zeros((1, 32), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 32\).*got shape \(1, 64\)"):
        face.quantize_q4_1(as_input(np.zeros((1, 64), dtype=np.float32)))
    with pytest.raises(ValueError, match="finite"):
        face.quantize_q4_1(as_input(np.full((1, 32), np.nan, dtype=np.float32)))


def test_the_torch_face_wants_a_tensor():
    with pytest.raises(TypeError, match="torch.Tensor"):
        mt.dequantize_q4_1(np.zeros((1, 20), dtype=np.uint8))
