"""Half precision at long T: the running sums of attention and softmax are kept in float32.

float16 holds 11 bits: a sum of ones stalls at 2048 (2048 + 1 rounds to 2048) and
overflows past 65,504, so a float16 running sum over 70,000 keys is inf and the
output NaN. bfloat16 holds 8 bits: each of the T / chunk additions loses up to 2^-9.
Summed in float32 and rounded once at the end, the library must come within 2x the
error of PyTorch's fused kernel, F.scaled_dot_product_attention, both measured
against float64 on the same (already rounded) inputs. A result must keep its input's dtype.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha.numpy as mn
import mha.torch as mt

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small products: one thread, the same sums every run

T_LONG = 20_000
T_OVERFLOW = 70_000  # more keys than float16 can count: its largest number is 65,504
HALF = [pytest.param("numpy", np.float16, id="numpy-float16"),
        pytest.param("torch", torch.float16, id="torch-float16"),
        pytest.param("torch", torch.bfloat16, id="torch-bfloat16")]


def inputs(rng, T, d=16, T_q=4, q_scale=1.0):
    """Q (1, T_q, d), K (1, T, d), V (1, T, d) in float64; a larger q_scale, peakier weights."""
    return (q_scale * rng.standard_normal((1, T_q, d)), rng.standard_normal((1, T, d)),
            rng.standard_normal((1, T, d)))


def rounded(face, dtype, arrays):
    """The float64 arrays rounded to `dtype`: NumPy arrays for the NumPy face, tensors for torch."""
    return [a.astype(dtype) if face == "numpy" else torch.from_numpy(a).to(dtype) for a in arrays]


def float64(x):
    return x.double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def reference(Q, K, V):
    """softmax(Q K^T / sqrt(d)) V in float64, written out here: no library code."""
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])  # (1, T_q, T)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e @ V) / e.sum(axis=-1, keepdims=True)


def max_errors(face, dtype, arrays, attention):
    """Max-abs error against float64 of `attention(Q, K, V)` (the face's) and of F.sdpa, same inputs."""
    Q, K, V = rounded(face, dtype, arrays)
    exact = reference(*(float64(x) for x in (Q, K, V)))
    fused = F.scaled_dot_product_attention(*(torch.as_tensor(x) for x in (Q, K, V)))
    out = attention(Q, K, V)
    assert out.dtype == dtype, f"{face} returned {out.dtype} for {dtype} inputs"
    return np.abs(float64(out) - exact).max(), np.abs(float64(fused) - exact).max()


def chunked(face):
    return (mn if face == "numpy" else mt).chunked_attention


@pytest.mark.parametrize("face, dtype", HALF)
@pytest.mark.parametrize("q_scale", [1.0, 3.0])
def test_chunked_attention_is_as_accurate_as_pytorch_at_20000_keys(rng, face, dtype, q_scale):
    ours, fused = max_errors(face, dtype, inputs(rng, T_LONG, q_scale=q_scale), chunked(face))
    assert ours <= 2 * fused, f"chunked_attention is {ours:.2e} from float64, F.sdpa {fused:.2e}"


@pytest.mark.parametrize("face, dtype", HALF)
def test_chunked_attention_over_70000_random_keys_has_no_nan(rng, face, dtype):
    ours, fused = max_errors(face, dtype, inputs(rng, T_OVERFLOW), chunked(face))
    assert np.isfinite(ours) and ours <= 2 * fused, f"{ours:.2e} from float64, F.sdpa {fused:.2e}"


@pytest.mark.parametrize("face, dtype", HALF)
def test_70000_equal_scores_average_the_values_exactly(face, dtype):
    """Q = 0 and K = 0: every weight is 1/70,000, and the average of 70,000 ones is 1, not NaN."""
    Q, K, V = rounded(face, dtype, (np.zeros((1, 4)), np.zeros((T_OVERFLOW, 4)), np.ones((T_OVERFLOW, 1))))
    out = chunked(face)(Q, K, V)
    assert out.dtype == dtype and float64(out).tolist() == [[1.0]]


@pytest.mark.parametrize("face, dtype", HALF)
def test_scaled_dot_product_attention_is_as_accurate_as_pytorch_at_20000_keys(rng, face, dtype):
    sdpa = (mn if face == "numpy" else mt).scaled_dot_product_attention
    ours, fused = max_errors(face, dtype, inputs(rng, T_LONG, q_scale=3.0), lambda *qkv: sdpa(*qkv)[0])
    assert ours <= 2 * fused, f"scaled_dot_product_attention is {ours:.2e} from float64, F.sdpa {fused:.2e}"


def test_softmax_of_70000_float16_zeros_sums_to_one():
    weights = mn.softmax(np.zeros(T_OVERFLOW, np.float16))
    assert weights.dtype == np.float16
    assert (weights == np.float16(1 / T_OVERFLOW)).all()  # 1/70,000, rounded once
    # 1/70,000 is subnormal in float16 (spacing 2^-24): each entry is off by at most 2^-25
    assert abs(weights.sum(dtype=np.float64) - 1) <= T_OVERFLOW * 2**-25


SOFTMAXES = {
    "softmax": lambda scores, mask: mn.softmax(scores),
    "masked_softmax": mn.masked_softmax,
    "masked_softmax_": lambda scores, mask: mn.masked_softmax_(scores.copy(), mask),
}


@pytest.mark.parametrize("name", SOFTMAXES)
def test_float16_softmaxes_round_the_float64_one_once(rng, name):
    scores = (4 * rng.standard_normal((3, T_OVERFLOW))).astype(np.float16)
    mask = None if name == "softmax" else rng.random((3, T_OVERFLOW)) < 0.5
    if mask is not None:
        mask[2] = False  # a row with nothing to attend to: zero weights
    kept = np.where(True if mask is None else mask, scores.astype(np.float64), -np.inf)
    kept[2] = kept[2] if mask is None else 0.0  # the empty row: any finite scores, zeroed below
    exact = np.exp(kept - kept.max(axis=-1, keepdims=True))
    exact = exact / exact.sum(axis=-1, keepdims=True) * (True if mask is None else mask.any(axis=-1, keepdims=True))
    weights = SOFTMAXES[name](scores, mask)
    assert weights.dtype == np.float16
    # one rounding to float16 (after float32's): a unit in the 11th bit, or a subnormal step (2^-24)
    np.testing.assert_allclose(weights.astype(np.float64), exact, rtol=2**-10, atol=2**-24)


def test_masked_softmax_in_place_keeps_the_float16_array():
    scores = np.array([[0.0, 1.0, 2.0]], np.float16)
    weights = mn.masked_softmax_(scores, np.array([True, False, True]))
    assert weights is scores and weights.dtype == np.float16
    np.testing.assert_allclose(weights, [[1 / (1 + math.e**2), 0, math.e**2 / (1 + math.e**2)]], rtol=2**-11)


BAD = {
    "softmax of []": (lambda: mn.softmax([]), ValueError, r"x has shape \(0,\): no entry along axis=-1"),
    "softmax of a 0-d x": (lambda: mn.softmax(np.float64(2.0)), ValueError,
                           r"x must have at least 1 dimensions, got 0 \(shape \(\)\)"),
    "softmax over an empty axis": (lambda: mn.softmax(np.zeros((3, 0))), ValueError,
                                   r"x has shape \(3, 0\): no entry along axis=-1"),
    "softmax of an empty array": (lambda: mn.softmax(np.zeros((0, 3)), axis=None), ValueError,
                                  r"x has shape \(0, 3\): no entry along axis=None"),
    "masked_softmax of no keys": (lambda: mn.masked_softmax(np.zeros((2, 0)), np.ones((2, 0), bool)), ValueError,
                                  r"scores has shape \(2, 0\): no entry"),
    "masked_softmax, mask too short": (lambda: mn.masked_softmax(np.zeros((2, 4)), np.ones(3, bool)), ValueError,
                                       r"mask has shape \(3,\) but scores have shape \(2, 4\)"),
    "masked_softmax, mask too big": (lambda: mn.masked_softmax(np.zeros((2, 4)), np.ones((3, 2, 4), bool)),
                                     ValueError, r"mask has shape \(3, 2, 4\) but scores have shape \(2, 4\)"),
    "masked_softmax, float mask": (lambda: mn.masked_softmax(np.zeros((2, 4)), np.ones((2, 4))), TypeError,
                                   "mask must be boolean .*, got dtype float64"),
    "masked_softmax_, mask too short": (lambda: mn.masked_softmax_(np.zeros((2, 4)), np.ones(3, bool)), ValueError,
                                        r"mask has shape \(3,\) but scores have shape \(2, 4\)"),
}


@pytest.mark.parametrize("call, error, pattern", BAD.values(), ids=BAD.keys())
def test_bad_softmax_input_is_rejected_with_a_clear_message(call, error, pattern):
    with pytest.raises(error, match=pattern) as info:  # match: re.search in the message
        call()
    assert type(info.value) is error, f"expected exactly {error.__name__}, got {type(info.value).__name__}"


def test_a_batch_of_no_rows_is_not_an_error():
    """Shape (0, 3): no softmax to take, so an empty answer, as NumPy gives for any reduction."""
    assert mn.softmax(np.zeros((0, 3))).shape == (0, 3)
    assert mn.masked_softmax(np.zeros((0, 3)), np.ones(3, bool)).shape == (0, 3)
