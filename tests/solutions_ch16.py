"""Right solutions of chapter 16's exercise written from scratch, for the tests of its check (tests/test_checks_ch16.py,
and the gathering of right solutions in tests/learners.py), and what those tests share: running the check, its
failures on every seed, a named case by its words, the cases of several seeds, and gguf's own dequantization, the
truth the check's reference is held to."""

import io
from contextlib import redirect_stdout

import gguf
import numpy as np
import pytest

from learners import SEEDS

from mha.checks import ch16
from mha.checks.registry import CHECKS, CheckFailed

NAME = "dequantize_q4_1"


def run(fn, seed):
    """check_dequantize_q4_1 on fn with `seed`; the line it printed (its confirmation)."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        ch16.check_dequantize_q4_1(fn, seed=seed)
    return printed.getvalue().strip()


def failures_on_every_seed(fn, seeds=SEEDS):
    """The messages of check_dequantize_q4_1(fn) on `seeds`; fails the test if any seed lets fn pass."""
    messages = []
    for seed in seeds:
        with pytest.raises(CheckFailed) as info:
            run(fn, seed)
        messages.append(str(info.value))
    return messages


def labelled(words, seed=0):
    return next(case for case in CHECKS[NAME].named_cases(seed) if words in case.label)


def all_cases(seeds=SEEDS):
    """The named cases of every seed, then the random ones of every seed."""
    check = CHECKS[NAME]
    named = [case for seed in seeds for case in check.named_cases(seed)]
    return named + [case for seed in seeds for case in check.make_random_cases(np.random.default_rng(seed))]


def by_gguf(blocks):
    """The gguf package's own dequantization of Q4_1 blocks (..., 20) -> (..., 32): the truth."""
    return gguf.quants.dequantize(np.asarray(blocks), gguf.GGMLQuantizationType.Q4_1)


# Right solutions written from scratch: NumPy only ---------------------------------------------------------------


def refuse(blocks):
    """The errors the exercise asks for: TypeError for bytes of another dtype, ValueError for blocks not of 20."""
    if blocks.dtype != np.uint8:
        raise TypeError(f"expected uint8 bytes, got {blocks.dtype}")
    if blocks.ndim == 0 or blocks.shape[-1] != 20:
        raise ValueError(f"expected blocks of 20 bytes on the last axis, got shape {blocks.shape}")


def dequantize_q4_1(blocks):
    """float16 views of the two numbers, shifts and masks for the nibbles."""
    blocks = np.asarray(blocks)
    refuse(blocks)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # (..., 1)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)  # (..., 1)
    q = np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1)  # (..., 32): low nibbles, then high
    return d * q.astype(np.float32) + m


def float16_by_hand(low, high):
    """The float16 numbers whose little-endian bytes are `low`, `high` (uint8 arrays), decoded from the bits: a sign,
    5 bits of exponent (bias 15), 10 of fraction; exponent 0 is subnormal (no implicit 1), 31 is inf or NaN."""
    bits = low.astype(np.int64) + 256 * high.astype(np.int64)
    sign = np.where(bits >> 15, -1.0, 1.0)
    exponent, fraction = (bits >> 10) & 31, bits & 1023
    normal = (1 + fraction / 1024) * 2.0 ** (exponent - 15)
    subnormal = fraction / 1024 * 2.0 ** -14
    special = np.where(fraction == 0, np.inf, np.nan)
    return sign * np.where(exponent == 0, subnormal, np.where(exponent == 31, special, normal))


def dequantize_q4_1_from_the_bits(blocks):
    """Every block on its own, float16 decoded from its bits, each nibble taken with % and // (float64 numbers that are
    float16's, so the float32 product and sum are gguf's)."""
    blocks = np.asarray(blocks)
    refuse(blocks)
    rows = blocks.reshape(-1, 20)  # (n, 20)
    out = np.empty((len(rows), 32), dtype=np.float32)
    for i, row in enumerate(rows):
        d = np.float32(float16_by_hand(row[0], row[1]))
        m = np.float32(float16_by_hand(row[2], row[3]))
        for j, byte in enumerate(row[4:].tolist()):
            out[i, j] = d * np.float32(byte % 16) + m
            out[i, j + 16] = d * np.float32(byte // 16) + m
    return out.reshape(*blocks.shape[:-1], 32)  # (..., 32)


FROM_SCRATCH = [dequantize_q4_1, dequantize_q4_1_from_the_bits]
