"""Chapter 13, today's models, what they do to queries and keys: the checks of `rms_norm_per_head` (QK-norm, as
Qwen3 and Gemma 3 apply it) and `ntk_frequencies` (dynamic NTK-aware RoPE scaling), their cases and their
catalogued mistakes. (The chapter's other checks are in `mha.checks.ch13`.)"""

import numpy as np

from mha.checks.inputs import batch, normal, sizes
from mha.checks.routes import NTK_FORBIDS, QK_NORM_FORBIDS
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.syntax import Rule

# rms_norm_per_head: QK-norm, each head's query normalised on its own ---------------------------------------


def projected(r, lead, h, d_head, dtype=np.float64):
    """Queries as a projection gives them, (*lead, T, h * d_head), off mean 0, head i in columns
    i * d_head .. (i + 1) * d_head - 1 ((*lead) ends with T)."""
    return (1 + normal(r, (*lead, h * d_head), dtype, 2)).astype(dtype)


@cases_for("rms_norm_per_head", may_use="NumPy and mnp.split_heads (not mnp.rms_norm: write the norm yourself)",
           forbids=QK_NORM_FORBIDS)
def rms_norm_per_head_cases(r):
    """Heads of very different sizes (per head against over all heads), a batch of 3 heads, one head, a head's
    query of zeros, a large eps, Gemma 3's unit offset, and float32 queries whose mean square is about eps."""
    loud_and_quiet = projected(r, (4,), 2, 3)  # (T, h * d_head)
    loud_and_quiet[:, :3] *= 100  # head 0 is 100 times head 1
    with_zeros = projected(r, (3,), 3, 4)
    with_zeros[1, 4:8] = 0.0  # head 1's query at position 1
    return [
        Case("2 heads, head 0's features 100 times head 1's", (loud_and_quiet, 1 + 0.3 * r.standard_normal(3), 2)),
        Case("a batch of 2, T = 5, 3 heads of width 4", (projected(r, (2, 5), 3, 4), 1 + 0.3 * r.standard_normal(4), 3)),
        Case("one head (h = 1), T = 3, d_head = 6", (projected(r, (3,), 1, 6), 1 + 0.3 * r.standard_normal(6), 1)),
        Case("head 1's query at position 1 is all zeros", (with_zeros, 1 + 0.3 * r.standard_normal(4), 3)),
        Case("a large eps (0.5)", (projected(r, (4,), 2, 4), 1 + 0.3 * r.standard_normal(4), 2), {"eps": 0.5}),
        Case("unit_offset=True (Gemma 3's scale 1 + weight), weight near 0",
             (projected(r, (3,), 2, 4), 0.1 * r.standard_normal(4), 2), {"unit_offset": True}),
        Case("float32 queries of size 1e-3: the mean square is about eps",
             ((1e-3 * r.standard_normal((2, 3, 8))).astype(np.float32), (1 + r.standard_normal(4)).astype(np.float32),
              2)),
    ]


@random_cases_for("rms_norm_per_head")
def rms_norm_per_head_random_cases(r):
    """A 4-D batch with its own eps, float32 with Gemma 3's offset, and heads of width 1."""
    (T, d_head), h = sizes(r, 2, 1, 6), int(r.integers(2, 5))
    return [
        Case("random: a 4-D batch", (projected(r, batch(r, 2) + (T,), h, d_head), 1 + normal(r, d_head), h),
             {"eps": float(r.choice([1e-6, 1e-5, 0.1]))}),
        Case("random: float32, unit_offset=True", (projected(r, (T,), h, d_head, np.float32),
                                                   normal(r, d_head, np.float32, 0.2), h), {"unit_offset": True}),
        Case("random: heads of width 1", (projected(r, (T,), h, 1), 1 + normal(r, 1), h)),
    ]


def heads_of(x, n_heads):
    """(..., T, h * d_head) -> (..., h, T, d_head), head i in columns i * d_head .. (i + 1) * d_head - 1."""
    *lead, T, width = x.shape
    return np.swapaxes(x.reshape(*lead, T, n_heads, width // n_heads), -2, -3)  # (..., h, T, d_head)


def scaled(normed, weight, unit_offset):
    return normed * (1 + weight if unit_offset else weight)


@mistake("rms_norm_per_head", "normalise each head on its own: split the heads first, then divide each head's "
         "d_head features by their root mean square. Normalising all h * d_head features at once is OLMo 2's "
         "QK-norm, not Qwen3's or Gemma 3's")
def per_head_over_all_heads(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., T, h * d_head)
    return scaled(heads_of(normed, n_heads), weight, unit_offset)


@mistake("rms_norm_per_head", "normalise each vector over its d_head features (the last axis after the split), "
         "not over the positions of a head")
def per_head_over_positions(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads = heads_of(x, n_heads)
    return scaled(heads / np.sqrt(np.mean(heads * heads, axis=-2, keepdims=True) + eps), weight, unit_offset)


@mistake("rms_norm_per_head", "head i is the block of columns i * d_head .. (i + 1) * d_head - 1, as "
         "split_heads cuts it: reshape to (..., T, h, d_head), not (..., T, d_head, h)")
def per_head_interleaved(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    *lead, T, width = x.shape
    heads = np.moveaxis(x.reshape(*lead, T, width // n_heads, n_heads), -1, -3)  # (..., h, T, d_head), interleaved
    return scaled(heads / np.sqrt(np.mean(heads * heads, axis=-1, keepdims=True) + eps), weight, unit_offset)


@mistake("rms_norm_per_head", "return the heads before the positions, (..., h, T, d_head), as split_heads does: "
         "(..., T, h, d_head) needs its two axes swapped")
def per_head_not_transposed(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    *lead, T, width = x.shape
    heads = x.reshape(*lead, T, n_heads, width // n_heads)  # (..., T, h, d_head)
    return scaled(heads / np.sqrt(np.mean(heads * heads, axis=-1, keepdims=True) + eps), weight, unit_offset)


def per_head_rms(x, n_heads, eps):
    """x split into heads, and each head's root mean square with eps inside: (..., h, T, d_head), (..., h, T, 1)."""
    heads = heads_of(x, n_heads)
    return heads, np.sqrt(np.mean(heads * heads, axis=-1, keepdims=True) + eps)


@mistake("rms_norm_per_head", "eps goes inside the square root: sqrt(mean(q^2) + eps), not sqrt(mean(q^2)) + eps")
def per_head_eps_outside(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads = heads_of(x, n_heads)
    return scaled(heads / (np.sqrt(np.mean(heads * heads, axis=-1, keepdims=True)) + eps), weight, unit_offset)


@mistake("rms_norm_per_head", "add eps inside the square root: without it a head's query of zeros gives 0 / 0")
def per_head_without_eps(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads, _ = per_head_rms(x, n_heads, eps)
    return scaled(heads / np.sqrt(np.mean(heads * heads, axis=-1, keepdims=True)), weight, unit_offset)


@mistake("rms_norm_per_head", "multiply by the weight after normalising: QK-norm has a learned scale, one number "
         "per feature of a head")
def per_head_without_weight(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads, rms = per_head_rms(x, n_heads, eps)
    return heads / rms


@mistake("rms_norm_per_head", "with unit_offset=True the scale is 1 + weight (Gemma 3 stores the weight around 0)")
def per_head_ignores_unit_offset(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads, rms = per_head_rms(x, n_heads, eps)
    return heads / rms * weight


@mistake("rms_norm_per_head", "RMSNorm does not subtract the mean: divide by the root mean square of the head's "
         "features, not by their standard deviation")
def per_head_subtracts_mean(x, weight, n_heads, eps=1e-6, *, unit_offset=False):
    heads = heads_of(x, n_heads)
    centred = heads - heads.mean(-1, keepdims=True)
    return scaled(centred / np.sqrt(np.mean(centred ** 2, axis=-1, keepdims=True) + eps), weight, unit_offset)


check_rms_norm_per_head = make_check("rms_norm_per_head")

# ntk_frequencies: dynamic NTK-aware RoPE scaling ------------------------------------------------------------


# mha.rope_scaling is no face of mha, so `forbids` cannot refuse it; its dynamic_ntk_base is the exercise's core.
NTK_RULES = (Rule("compute the new base yourself, with NumPy: not with mha.rope_scaling (the library's RoPE scaling)",
                  forbids=("rope_scaling", "dynamic_ntk_base")),)


@cases_for("ntk_frequencies", may_use="NumPy (not mnp.rotary_frequencies)", forbids=NTK_FORBIDS, rules=NTK_RULES)
def ntk_frequencies_cases(r):
    """A sequence shorter than the trained one and one as long (RoPE's own frequencies), r = 4 with factor 1,
    factor 2 (r = 5), d_head = 4 (the exponent is 2), and Llama 3's head at 8 times its length."""
    return [
        Case("seq_len 1000, shorter than original_max 4096: RoPE's own frequencies", (64, 10000.0, 1.0, 1000, 4096)),
        Case("seq_len = original_max = 2048, factor 2: still RoPE's own", (64, 10000.0, 2.0, 2048, 2048)),
        Case("seq_len 4 times original_max, factor 1: r = 4", (64, 10000.0, 1.0, 16384, 4096)),
        Case("factor 2, seq_len 3 times original_max: r = 2 * 3 - 1 = 5", (32, 10000.0, 2.0, 3072, 1024)),
        Case("d_head = 4: the exponent d_head / (d_head - 2) is 2", (4, 10000.0, 1.0, 800, 100)),
        Case("d_head = 128, Llama 3's base 500000, 8 times its 8192 positions", (128, 500000.0, 1.0, 65536, 8192)),
    ]


@random_cases_for("ntk_frequencies")
def ntk_frequencies_random_cases(r):
    """Three draws of width, base, factor and lengths: one sequence shorter than original_max, two longer."""
    def draw(longer):
        d_head, original = 2 * int(r.integers(2, 65)), int(r.integers(16, 8193))
        seq_len = int(original * (r.uniform(1, 16) if longer else r.uniform(0.05, 1)))
        return (d_head, float(r.choice([10000.0, 500000.0, 1e6])), float(r.choice([0.5, 1.0, 2.0, 4.0])), seq_len,
                original)
    return [Case("random: shorter than original_max", draw(False)), Case("random: longer", draw(True)),
            Case("random: longer again", draw(True))]


def ntk_ratio(factor, seq_len, original_max):
    return factor * max(seq_len, original_max) / original_max - (factor - 1)


def frequencies(d_head, base):
    """RoPE's frequencies for `base`: base^(-2i / d_head), i = 0 .. d_head / 2 - 1, (d_head / 2,)."""
    return base ** (-np.arange(0, d_head, 2) / d_head)


@mistake("ntk_frequencies", "up to original_max positions the frequencies are RoPE's own: dynamic NTK scales only "
         "beyond the trained length (take r from max(seq_len, original_max))")
def ntk_scales_short_sequences(d_head, base, factor, seq_len, original_max):
    r = factor * seq_len / original_max - (factor - 1)
    return frequencies(d_head, base * abs(r) ** (d_head / (d_head - 2)))


@mistake("ntk_frequencies", "raise r to the power d_head / (d_head - 2) before multiplying the base: with base * r "
         "the slowest pair is slowed by less than r")
def ntk_without_exponent(d_head, base, factor, seq_len, original_max):
    return frequencies(d_head, base * ntk_ratio(factor, seq_len, original_max))


@mistake("ntk_frequencies", "the exponent is d_head / (d_head - 2), a little above 1, not (d_head - 2) / d_head")
def ntk_exponent_inverted(d_head, base, factor, seq_len, original_max):
    return frequencies(d_head, base * ntk_ratio(factor, seq_len, original_max) ** ((d_head - 2) / d_head))


@mistake("ntk_frequencies", "NTK-aware scaling changes the base, which spares the fast pairs: dividing every "
         "frequency by r is linear position interpolation")
def ntk_linear(d_head, base, factor, seq_len, original_max):
    return frequencies(d_head, base) / ntk_ratio(factor, seq_len, original_max)


@mistake("ntk_frequencies", "r = factor * seq_len / original_max - (factor - 1): it is 1 at seq_len = original_max "
         "and grows by `factor` for every original_max positions more; seq_len / original_max leaves factor out")
def ntk_ratio_without_factor(d_head, base, factor, seq_len, original_max):
    return frequencies(d_head, base * ntk_ratio(1.0, seq_len, original_max) ** (d_head / (d_head - 2)))


@mistake("ntk_frequencies", "subtract factor - 1: r = factor * seq_len / original_max - (factor - 1), so that r is "
         "1 at seq_len = original_max and the frequencies do not jump there")
def ntk_ratio_without_shift(d_head, base, factor, seq_len, original_max):
    r = factor * max(seq_len, original_max) / original_max
    return frequencies(d_head, base * r ** (d_head / (d_head - 2)))


@mistake("ntk_frequencies", "pair i's frequency is base^(-2i / d_head), i = 0 .. d_head / 2 - 1: the exponents "
         "are 0, 2 / d_head, 4 / d_head, ..., not 0, 1 / d_head, 2 / d_head, ...")
def ntk_exponents_per_pair(d_head, base, factor, seq_len, original_max):
    new_base = base * ntk_ratio(factor, seq_len, original_max) ** (d_head / (d_head - 2))
    return new_base ** (-np.arange(d_head // 2) / d_head)


@mistake("ntk_frequencies", "RoPE's frequencies are the inverse powers, base^(-2i / d_head): the first is 1 and "
         "the others smaller")
def ntk_powers_not_inverted(d_head, base, factor, seq_len, original_max):
    return 1 / frequencies(d_head, base * ntk_ratio(factor, seq_len, original_max) ** (d_head / (d_head - 2)))


check_ntk_frequencies = make_check("ntk_frequencies")
