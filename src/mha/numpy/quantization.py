"""Chapter 16: the weights of a GGUF file, read back as numbers (and written, for Q4_1).

A quantized tensor is cut into blocks of 32 weights along its last axis. Each block keeps
a few float16 numbers that hold for the whole block, then one small integer per weight:

    Q4_1 (20 bytes): a scale d (float16, bytes 0-1), a minimum m (float16, bytes 2-3), then
        16 bytes of 4-bit integers q in 0..15. Byte j holds weight j in its low nibble and
        weight j + 16 in its high nibble. The weight is w_i = d * q_i + m.
    Q8_0 (34 bytes): a scale d (float16, bytes 0-1), then 32 signed bytes q in -127..127.
        The weight is w_i = d * q_i.

Every float16 is little-endian, as GGUF stores it. The arithmetic is float32, in the order
written above (one product, then one sum), so the results equal the `gguf` package's bit for bit.
"""

import numpy as np

BLOCK_SIZE = 32  # weights per block
Q4_1_BYTES = 20  # 2 (d) + 2 (m) + 16 (two 4-bit q per byte)
Q8_0_BYTES = 34  # 2 (d) + 32 (one int8 q per byte)


def check_blocks(blocks, n_bytes, kind):
    """A uint8 array whose last axis holds one block of `n_bytes` bytes, or a TypeError / ValueError."""
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8:
        raise TypeError(f"{kind} blocks must be raw bytes (dtype uint8), got dtype {blocks.dtype}")
    if blocks.ndim == 0 or blocks.shape[-1] != n_bytes:
        raise ValueError(f"{kind} blocks must have shape (..., {n_bytes}): {n_bytes} bytes per block of "
                         f"{BLOCK_SIZE} weights, got shape {blocks.shape}")
    return blocks


def float16_at(blocks, start):
    """The little-endian float16 in bytes start, start + 1 of every block, as float32: (..., 1)."""
    pair = np.ascontiguousarray(blocks[..., start:start + 2])  # (..., 2)
    return pair.view("<f2").astype(np.float32)  # (..., 1): two bytes read as one float16


def low_and_high_nibbles(packed):
    """(..., 16) bytes -> (..., 32) integers 0..15: the 16 low nibbles, then the 16 high ones."""
    low = packed & np.uint8(0x0F)  # (..., 16): weights 0..15
    high = packed >> np.uint8(4)  # (..., 16): weights 16..31
    return np.concatenate([low, high], axis=-1)  # (..., 32)


def dequantize_q4_1(blocks):
    """Q4_1 blocks, uint8 (..., 20) -> their weights, float32 (..., 32): w = d * q + m."""
    blocks = check_blocks(blocks, Q4_1_BYTES, "Q4_1")
    d = float16_at(blocks, 0)  # (..., 1): the block's scale
    m = float16_at(blocks, 2)  # (..., 1): the block's minimum
    q = low_and_high_nibbles(blocks[..., 4:]).astype(np.float32)  # (..., 32)
    return d * q + m  # (..., 32)


def dequantize_q8_0(blocks):
    """Q8_0 blocks, uint8 (..., 34) -> their weights, float32 (..., 32): w = d * q."""
    blocks = check_blocks(blocks, Q8_0_BYTES, "Q8_0")
    d = float16_at(blocks, 0)  # (..., 1): the block's scale
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.float32)  # (..., 32): bytes read as signed
    return d * q  # (..., 32)


def check_weights(weights):
    """A float32 array (..., 32) of finite weights, or a TypeError / ValueError."""
    weights = np.asarray(weights)
    if not np.issubdtype(weights.dtype, np.floating):
        raise TypeError(f"weights must be floating point, got dtype {weights.dtype}")
    if weights.ndim == 0 or weights.shape[-1] != BLOCK_SIZE:
        raise ValueError(f"weights must have shape (..., {BLOCK_SIZE}): one block of {BLOCK_SIZE} weights on "
                         f"the last axis, got shape {weights.shape}")
    if not np.isfinite(weights).all():
        raise ValueError("weights must be finite: a block with inf or NaN has no scale")
    return weights.astype(np.float32)


def quantize_q4_1(weights):
    """Blocks of 32 weights, float (..., 32) -> Q4_1 blocks, uint8 (..., 20), as `gguf` writes them.

    Per block: m = min(w), d = (max(w) - m) / 15, q = round((w - m) / d) (half up), clipped to
    0..15. A block of equal weights has d = 0 and q = 0. The rounding uses the float32 m and
    1 / d; the block then stores d and m as float16.
    """
    w = check_weights(weights)
    low, high = w.min(axis=-1, keepdims=True), w.max(axis=-1, keepdims=True)  # (..., 1) each
    d = (high - low) / np.float32(15)  # (..., 1)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)  # (..., 1)
    q = np.trunc((w - low) * inverse + np.float32(0.5)).astype(np.uint8).clip(0, 15)  # (..., 32)
    packed = q[..., :16] | (q[..., 16:] << np.uint8(4))  # (..., 16): weight j low, weight j + 16 high
    d_bytes = d.astype("<f2").view(np.uint8)  # (..., 2)
    m_bytes = low.astype("<f2").view(np.uint8)  # (..., 2)
    return np.concatenate([d_bytes, m_bytes, packed], axis=-1)  # (..., 20)
