"""The check of chapter 16's exercise, dequantize_q4_1 (mha.checks.ch16): its reference gives the gguf package's own
dequantization bit for bit on every case it draws; the named traps are there, and the real blocks are the model
file's; every wrong solution that a learner writes fails on its named case, on every seed, with the hint that fits;
every catalogued mistake fails with its own hint; gguf and the library's routes are refused, in the notebook and in
the student edition; right solutions from scratch pass there; and the exercise's text agrees with the check."""

import re
from pathlib import Path

import numpy as np
import pytest

from learners import SEEDS, assert_trap_fails_on_its_case, exercise_texts, hint_of, student_edition
from solutions_ch16 import (FROM_SCRATCH, NAME, all_cases, by_gguf, dequantize_q4_1, failures_on_every_seed,
                            labelled, refuse, run)

import mha.numpy as mnp
from mha.checks import ch16
from mha.checks.registry import CHECKS, DTYPE_HINT, expected_answer

ROOT = Path(__file__).resolve().parents[1]


# The reference is gguf's own dequantization -----------------------------------------------------------------------


def test_the_reference_gives_gguf_s_dequantization_bit_for_bit_on_every_case():
    """The check's expectations are mha.numpy's answers: equal to gguf.quants.dequantize, to the bit (NaN and -0
    included), on the named and random cases of ten seeds."""
    for case in all_cases():
        if case.raises:
            continue
        (blocks,) = case.args
        expected, truth = expected_answer(NAME, case), by_gguf(blocks)
        assert expected.dtype == truth.dtype == np.float32 and expected.shape == truth.shape, case.label
        assert np.array_equal(expected.view(np.uint32), truth.view(np.uint32)), case.label


def test_the_reference_raises_where_the_cases_require_it_and_those_cases_come_last():
    cases = CHECKS[NAME].named_cases(0)
    assert [c.raises for c in cases[-2:]] == [TypeError, ValueError] and not any(c.raises for c in cases[:-2])
    with pytest.raises(TypeError, match="uint8"):
        cases[-2].call(mnp.dequantize_q4_1)
    with pytest.raises(ValueError, match=r"\(\.\.\., 20\)"):
        cases[-1].call(mnp.dequantize_q4_1)


# The traps are in the named cases --------------------------------------------------------------------------------


def parts(blocks):
    """(d, m, q) of blocks (..., 20): float16 numbers (..., ) and nibbles (..., 32), read here."""
    d = blocks[..., 0:2].copy().view("<f2")[..., 0]
    m = blocks[..., 2:4].copy().view("<f2")[..., 0]
    return d, m, np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_first_block_tells_every_layout_mistake_apart_on_every_seed(seed):
    (block,) = CHECKS[NAME].named_cases(seed)[0].args
    assert block.shape == (20,) and block.dtype == np.uint8
    d, m, q = parts(block)
    assert (q[0], q[16]) == (1, 14), "byte 0's nibbles differ, and one of them is 8 or more"
    assert 0 < d < 1 and m > 0
    assert block[0] != block[1] and block[2] != block[3], "a swapped byte order reads other numbers"


def test_the_other_named_cases_hold_their_traps():
    (batch,) = labelled("a batch of blocks").args
    assert batch.shape == (2, 3, 20) and len(set(parts(batch)[0].ravel().tolist())) == 6
    (zero,) = labelled("d = 0").args
    d, m, q = parts(zero)
    assert (d == 0).all() and np.signbit(d).any() and (m != 0).all() and (q > 0).any()
    (negative,) = labelled("a negative minimum").args
    assert negative.ndim == 3 and (parts(negative)[1] < 0).all()
    weights = expected_answer(NAME, labelled("a negative minimum"))
    assert (weights < 0).any() and (weights > 0).any()
    (large,) = labelled("large numbers").args
    assert (parts(large)[0] >= 256).all()
    assert (expected_answer(NAME, labelled("large numbers")) != by_gguf(large).astype(np.float16)).any(), \
        "float16 arithmetic loses digits there"


def test_the_real_blocks_are_the_model_file_s_and_change_with_the_seed():
    """The blocks of the third case are bytes of one row of a Q4_1 tensor of SmolLM2-135M-Instruct's file."""
    tensors = ch16.model_tensors()
    assert len(tensors) == 210, "the file holds 210 Q4_1 tensors"
    drawn = []
    for seed in SEEDS[:4]:
        (blocks,) = labelled("SmolLM2-135M-Instruct's file", seed).args
        assert blocks.shape == (6, 20) and blocks.dtype == np.uint8 and type(blocks) is np.ndarray
        flat = blocks.tobytes()
        assert any(flat in np.asarray(data).tobytes() for _, data in tensors), "bytes of the file's Q4_1 tensors"
        d, m, _ = parts(blocks)
        assert (d > 0).all() and (m < 0).all(), "a block of real weights: a positive step, a negative minimum"
        drawn.append(flat)
    assert len(set(drawn)) == len(drawn)


def test_the_random_cases_hold_a_4_d_batch_and_one_block():
    for seed in range(5):
        cases = CHECKS[NAME].make_random_cases(np.random.default_rng(seed))
        assert cases[0].args[0].ndim == 4 and cases[1].args[0].shape == (20,)
        assert all(c.args[0].dtype == np.uint8 for c in cases)


# Wrong solutions a learner writes: their named case, their hint -------------------------------------------------------


def nibbles_in_pairs(blocks):
    """Unpacks each byte into its two weights side by side, as one reads a byte."""
    out = []
    for block in np.asarray(blocks).reshape(-1, 20):
        d, m = (np.frombuffer(block[i:i + 2].tobytes(), dtype=np.float16)[0].astype(np.float32) for i in (0, 2))
        out.append([d * np.float32(q) + m for byte in block[4:] for q in (byte & 15, byte >> 4)])
    return np.array(out, dtype=np.float32).reshape(*np.shape(blocks)[:-1], 32)


def high_nibble_as_weight_j(blocks):
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([blocks[..., 4:] >> 4, blocks[..., 4:] & 15], axis=-1).astype(np.float32)
    return d * q + m


def written(formula):
    """A solution that reads d, m and q rightly and combines them by `formula(d, m, q)`."""
    def solution(blocks):
        d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
        m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
        q = np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1).astype(np.float32)
        return formula(d, m, q)
    return solution


def d_and_m_with_struct(blocks):
    """One block at a time, d and m unpacked with struct's big-endian '>e' (the network order)."""
    import struct
    flat = np.asarray(blocks).reshape(-1, 20)
    d = np.array([struct.unpack(">e", bytes(b[0:2]))[0] for b in flat], dtype=np.float32)[:, None]
    m = np.array([struct.unpack(">e", bytes(b[2:4]))[0] for b in flat], dtype=np.float32)[:, None]
    q = np.concatenate([flat[:, 4:] & 15, flat[:, 4:] >> 4], axis=-1).astype(np.float32)
    return (d * q + m).reshape(*blocks.shape[:-1], 32)


def d_and_m_as_uint16(blocks):
    d = blocks[..., 0].astype(np.float32) + 256 * blocks[..., 1].astype(np.float32)
    m = blocks[..., 2].astype(np.float32) + 256 * blocks[..., 3].astype(np.float32)
    q = np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1).astype(np.float32)
    return d[..., None] * q + m[..., None]


def one_block(blocks):
    """Written for the (20,) of the text's example: blocks[:2] is the first two rows of a batch."""
    d = np.frombuffer(blocks[:2].tobytes()[:2], dtype=np.float16).astype(np.float32)
    m = np.frombuffer(blocks.tobytes()[2:4], dtype=np.float16).astype(np.float32)
    packed = np.frombuffer(blocks.tobytes()[4:20], dtype=np.uint8)
    return d * np.concatenate([packed & 15, packed >> 4]).astype(np.float32) + m


def in_float16(blocks):
    d = blocks[..., 0:2].copy().view(np.float16)
    m = blocks[..., 2:4].copy().view(np.float16)
    q = np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1)
    return d * q + m  # float16 times uint8: float16


def with_python_floats(blocks):
    d = blocks[..., 0:2].copy().view(np.float16).astype(float)
    m = blocks[..., 2:4].copy().view(np.float16).astype(float)
    q = np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1)
    return d * q + m


# (wrong solution, words of the hint it must get, the fixed named case it fails on)
FIRST = "one block (20,)"
TRAPPED = [
    (nibbles_in_pairs, "not low, high, low, high", FIRST),
    (high_nibble_as_weight_j, "not the other way round", FIRST),
    (written(lambda d, m, q: d * q - m), "do not subtract it", FIRST),
    (written(lambda d, m, q: d * (q - 8)), "Q4_0's formula", FIRST),
    (written(lambda d, m, q: q + m), "not q + m", FIRST),
    (written(lambda d, m, q: (d / 15) * q + m), "without dividing d by 15", FIRST),
    (written(lambda d, m, q: d * np.where(q > 7, q - 16, q) + m), "do not read 8 .. 15 as -8 .. -1", FIRST),
    (written(lambda d, m, q: m * q + d), "the scale d comes first", FIRST),
    (d_and_m_with_struct, "not big-endian", FIRST),
    (d_and_m_as_uint16, "not as a 16-bit integer", FIRST),
    (one_block, "not only the first", "a batch of blocks"),
    (in_float16, "compute in float32", FIRST),
    (with_python_floats, "not float64", FIRST),
]


@pytest.mark.parametrize("fn,hint,case", TRAPPED, ids=[f"{i}-{fn.__name__}" for i, (fn, _, _) in enumerate(TRAPPED)])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(fn, hint, case):
    assert_trap_fails_on_its_case(NAME, fn, hint, case, lambda name, fn: failures_on_every_seed(fn))


def test_the_catalogue_is_large_and_every_mistake_fails_with_its_own_hint_on_every_seed():
    mistakes = CHECKS[NAME].mistakes
    assert len(mistakes) >= 12
    hints = [m.hint for m in mistakes]
    assert all(len(h.split()) >= 5 for h in hints) and len(set(hints)) == len(hints)
    for m in mistakes:
        for message in failures_on_every_seed(m.fn, seeds=SEEDS[:3]):
            assert hint_of(message) == m.hint, (m.fn.__name__, message)
    assert [m.fn.__name__ for m in mistakes if m.dtype] == ["q4_1_in_float16", "q4_1_in_float64"]


def test_a_wrong_dtype_without_a_mistake_of_its_own_gets_the_general_hint():
    """The hints of the dtype mistakes answer only their own dtypes (float16, float64): a dtype the catalogue has no
    mistake for gets the general hint."""
    message = failures_on_every_seed(lambda blocks: dequantize_q4_1(blocks).astype(np.complex64), seeds=SEEDS[:1])[0]
    assert "expected dtype float32, got complex64" in message and hint_of(message) == DTYPE_HINT


# Routes: gguf, and the library's own function ---------------------------------------------------------------------


def through_gguf(blocks):
    import gguf
    refuse(blocks)
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)


def through_the_q4_1_class(blocks):
    from gguf.quants import Q4_1
    refuse(blocks)
    return Q4_1.dequantize_blocks(blocks.reshape(-1, 20)).reshape(*blocks.shape[:-1], 32)


def through_the_library(blocks):
    return mnp.dequantize_q4_1(blocks)


def through_the_loader(blocks):
    """mha.experiments.smollm2's dequantize of a tensor made of the blocks: it calls mnp.dequantize_q4_1 inside."""
    from mha.experiments import smollm2
    rows = blocks.reshape(-1, 20)
    tensor = smollm2.GGUFTensor("blocks", "Q4_1", (len(rows), 32), rows)
    return smollm2.dequantize(tensor).reshape(*blocks.shape[:-1], 32)


@pytest.mark.parametrize("route", [through_gguf, through_the_q4_1_class])
def test_gguf_gives_the_answer_and_the_rule_of_the_text_refuses_it(route):
    for case in CHECKS[NAME].named_cases(0)[:-2]:
        assert np.array_equal(case.call(route), expected_answer(NAME, case)), case.label
    for message in failures_on_every_seed(route, seeds=SEEDS[:2]):
        assert message.startswith("dequantize_q4_1 does not follow the route the exercise asks for: read the bytes "
                                  "yourself, with NumPy: not with the gguf package"), message


def test_the_library_s_function_and_the_loader_that_calls_it_are_refused_and_switched_off(monkeypatch):
    for route in (through_the_library, through_the_loader):
        for message in failures_on_every_seed(route, seeds=SEEDS[:2]):
            assert "calls mha's own dequantize_q4_1, the function this exercise asks you to write" in message, message
    with student_edition(NAME, monkeypatch):
        for message in failures_on_every_seed(through_the_library, seeds=SEEDS[:2]):
            assert "this is the exercise" in message, message


def test_the_torch_twin_is_refused():
    def with_torch(blocks):
        import torch

        import mha.torch as mt
        return mt.dequantize_q4_1(torch.from_numpy(np.asarray(blocks))).numpy()
    for message in failures_on_every_seed(with_torch, seeds=SEEDS[:1]):
        assert "calls mha's own dequantize_q4_1" in message, message


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_solution_from_scratch_passes_on_every_seed_and_in_the_student_edition(fn, monkeypatch):
    for seed in SEEDS[:3]:
        assert run(fn, seed) == "check_dequantize_q4_1: all 8 cases passed."
    with student_edition(NAME, monkeypatch):
        for seed in SEEDS[3:5]:
            assert run(fn, seed).startswith("check_dequantize_q4_1: all "), seed


def test_the_check_s_settings():
    check = CHECKS[NAME]
    assert check.float32_promised and check.packages == () and not check.fresh and check.returns is None
    assert check.absent() == (NAME,) and "not gguf or mnp.dequantize_q4_1" in check.may_use


# The exercise's text, once chapter 16 is written -------------------------------------------------------------------


CHAPTER = next(iter(sorted((ROOT / "book").glob("16_*.ipynb"))), None)


@pytest.mark.skipif(CHAPTER is None, reason="chapter 16 is not written yet: its exercise's text cannot be read")
def test_the_exercise_s_text_agrees_with_the_check():
    """The exercise states the layout, the formula, float32, the errors of its last two cases and its rule."""
    text = " ".join(exercise_texts(16)[NAME].split())
    for words in ("low nibble", "high nibble", "float16", "float32", "little-endian", "uint8", "TypeError",
                  "ValueError", "`gguf`", "with NumPy"):
        assert words in text, words
    for pattern in (r"j ?\+ ?16", r"\((\.\.\.|\\ldots), 20\)", r"\((\.\.\.|\\ldots), 32\)",
                    r"d (\*|\\cdot) q_i \+ m"):
        assert re.search(pattern, text), pattern
