"""Chapter 16: GGUF's Q4_1 and Q8_0 blocks on tensors, the same functions as `mha.numpy.quantization`.

A block holds 32 weights. Q4_1 (20 bytes): a float16 scale d, a float16 minimum m, then 16 bytes
of 4-bit q (byte j: weight j in the low nibble, weight j + 16 in the high one); w = d * q + m.
Q8_0 (34 bytes): a float16 scale d, then 32 int8 q; w = d * q. The results are float32 on the
blocks' device, bit for bit those of `mha.numpy` and of the `gguf` package.
"""

import torch

BLOCK_SIZE = 32  # weights per block
Q4_1_BYTES = 20  # 2 (d) + 2 (m) + 16 (two 4-bit q per byte)
Q8_0_BYTES = 34  # 2 (d) + 32 (one int8 q per byte)


def check_blocks(blocks, n_bytes, kind):
    """A uint8 tensor whose last axis holds one block of `n_bytes` bytes, or a TypeError / ValueError."""
    if not isinstance(blocks, torch.Tensor):
        raise TypeError(f"{kind} blocks must be a torch.Tensor of dtype uint8, got {type(blocks).__name__}")
    if blocks.dtype != torch.uint8:
        raise TypeError(f"{kind} blocks must be raw bytes (dtype torch.uint8), got {blocks.dtype}")
    if blocks.ndim == 0 or blocks.shape[-1] != n_bytes:
        raise ValueError(f"{kind} blocks must have shape (..., {n_bytes}): {n_bytes} bytes per block of "
                         f"{BLOCK_SIZE} weights, got shape {tuple(blocks.shape)}")
    return blocks


def float16_at(blocks, start):
    """The little-endian float16 in bytes start, start + 1 of every block, as float32: (..., 1)."""
    pair = blocks[..., start:start + 2].contiguous()  # (..., 2)
    return pair.view(torch.float16).float()  # (..., 1): two bytes read as one float16 (little-endian, as the CPU)


def low_and_high_nibbles(packed):
    """(..., 16) bytes -> (..., 32) integers 0..15: the 16 low nibbles, then the 16 high ones."""
    low = packed & 0x0F  # (..., 16): weights 0..15
    high = packed >> 4  # (..., 16): weights 16..31
    return torch.cat([low, high], dim=-1)  # (..., 32)


def dequantize_q4_1(blocks):
    """Q4_1 blocks, uint8 (..., 20) -> their weights, float32 (..., 32): w = d * q + m."""
    blocks = check_blocks(blocks, Q4_1_BYTES, "Q4_1")
    d = float16_at(blocks, 0)  # (..., 1): the block's scale
    m = float16_at(blocks, 2)  # (..., 1): the block's minimum
    q = low_and_high_nibbles(blocks[..., 4:]).float()  # (..., 32)
    return d * q + m  # (..., 32): a product, then a sum, each rounded to float32


def dequantize_q8_0(blocks):
    """Q8_0 blocks, uint8 (..., 34) -> their weights, float32 (..., 32): w = d * q."""
    blocks = check_blocks(blocks, Q8_0_BYTES, "Q8_0")
    d = float16_at(blocks, 0)  # (..., 1): the block's scale
    q = blocks[..., 2:].contiguous().view(torch.int8).float()  # (..., 32): bytes read as signed
    return d * q  # (..., 32)


def check_weights(weights):
    """A float32 tensor (..., 32) of finite weights, or a TypeError / ValueError."""
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        got = weights.dtype if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise TypeError(f"weights must be a floating-point torch.Tensor, got {got}")
    if weights.ndim == 0 or weights.shape[-1] != BLOCK_SIZE:
        raise ValueError(f"weights must have shape (..., {BLOCK_SIZE}): one block of {BLOCK_SIZE} weights on "
                         f"the last axis, got shape {tuple(weights.shape)}")
    if not bool(torch.isfinite(weights).all()):
        raise ValueError("weights must be finite: a block with inf or NaN has no scale")
    return weights.float()


def quantize_q4_1(weights):
    """Blocks of 32 weights, float (..., 32) -> Q4_1 blocks, uint8 (..., 20), as `gguf` writes them.

    Per block: m = min(w), d = (max(w) - m) / 15, q = round((w - m) / d) (half up), clipped to 0..15;
    a block of equal weights has d = 0 and q = 0. d and m are then stored as float16."""
    w = check_weights(weights)
    low = w.amin(dim=-1, keepdim=True)  # (..., 1)
    high = w.amax(dim=-1, keepdim=True)  # (..., 1)
    d = (high - low) / 15  # (..., 1)
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)  # (..., 1)
    q = torch.trunc((w - low) * inverse + 0.5).to(torch.uint8).clamp(0, 15)  # (..., 32)
    packed = q[..., :16] | (q[..., 16:] << 4)  # (..., 16): weight j low, weight j + 16 high
    d_bytes = d.half().view(torch.uint8)  # (..., 2)
    m_bytes = low.half().view(torch.uint8)  # (..., 2)
    return torch.cat([d_bytes, m_bytes, packed], dim=-1)  # (..., 20)
