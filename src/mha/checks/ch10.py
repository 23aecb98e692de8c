"""Chapter 10, positions: the checks of `sinusoidal_positions` and `alibi_bias`, their cases
and their catalogued mistakes."""

import numpy as np

from mha.checks.inputs import sizes
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import SINUSOIDAL_RULES, ALIBI_BIAS_RULES
from mha.checks.routes import ALIBI_BIAS_FORBIDS, SINUSOID_ROUTES
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for

# sinusoidal_positions: Vaswani et al.'s table of sines and cosines ----------------------



@cases_for("sinusoidal_positions", may_use="NumPy (np.sin, np.cos, np.arange)", forbids=SINUSOID_ROUTES,
           rules=SINUSOIDAL_RULES,
           float32_promised=True)  # "return the table as `dtype`"
def sinusoidal_positions_cases(r):
    """A small table, positions after an offset, another base, one pair (d_model = 2), and float32 at positions
    above 10^5 (where angles computed in float32 are off by 10^-3 and more)."""
    return [
        Case("T = 4 positions, d_model = 6", (4, 6)),
        Case("positions 5 to 7 (offset=5), d_model = 4", (3, 4), {"offset": 5}),
        Case("base 100, d_model = 8", (6, 8), {"base": 100.0}),
        Case("d_model = 2: one (sin, cos) pair", (5, 2)),
        Case("float32, positions 100000 to 100009, d_model = 16", (10, 16), {"offset": 100_000, "dtype": np.float32}),
    ]


@random_cases_for("sinusoidal_positions")
def sinusoidal_positions_random_cases(r):
    """Widths and lengths of any size, late positions, and bases from 10 to 10^6."""
    T, half = sizes(r, 2, 1, 9)
    base = float(r.choice([10.0, 100.0, 10000.0, 1e6]))
    return [
        Case("random: a table", (T, 2 * half), {"base": base}),
        Case("random: late positions", (T, 2 * half), {"offset": int(r.integers(1, 500)), "base": base}),
        Case("random: one position", (1, 2 * half + 2), {"offset": int(r.integers(0, 50))}),
    ]


def _angles(T, d_model, base, offset):
    """(T, d_model / 2): position t times theta_i = base^(-2i / d_model)."""
    theta = base ** (-np.arange(0, d_model, 2) / d_model)  # (d_model / 2,)
    return np.arange(offset, offset + T)[:, None] * theta


def _interleave(first, second):
    """(T, d/2) and (T, d/2) -> (T, d) with columns first_0, second_0, first_1, second_1, ..."""
    return np.stack([first, second], axis=-1).reshape(first.shape[0], -1)


@mistake("sinusoidal_positions", "even features hold the sine and odd features the cosine: "
         "PE[t, 2i] = sin(t theta_i), PE[t, 2i + 1] = cos(t theta_i), not the other way round")
def sinusoidal_cos_first(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    a = _angles(T, d_model, base, offset)
    return _interleave(np.cos(a), np.sin(a)).astype(dtype)


@mistake("sinusoidal_positions", "the sine and cosine of one frequency sit side by side (features 2i and "
         "2i + 1), not all sines in the first half and all cosines in the second (tensor2tensor's layout)")
def sinusoidal_halves(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    a = _angles(T, d_model, base, offset)
    return np.concatenate([np.sin(a), np.cos(a)], axis=-1).astype(dtype)


@mistake("sinusoidal_positions", "pair i has the frequency base^(-2i / d_model): the exponent counts the "
         "pairs in steps of 2 (2i = 0, 2, 4, ...), not 0, 1, 2, ...")
def sinusoidal_exponent_per_pair(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    theta = base ** (-np.arange(d_model // 2) / d_model)  # (d_model / 2,), too slow a fall
    a = np.arange(offset, offset + T)[:, None] * theta
    return _interleave(np.sin(a), np.cos(a)).astype(dtype)


@mistake("sinusoidal_positions", "divide the position by base^(2i / d_model) (multiply by theta_i, which is "
         "at most 1); multiplying by base^(2i / d_model) makes the high features turn ever faster")
def sinusoidal_times_base(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    a = np.arange(offset, offset + T)[:, None] * base ** (np.arange(0, d_model, 2) / d_model)
    return _interleave(np.sin(a), np.cos(a)).astype(dtype)


@mistake("sinusoidal_positions", "the table covers positions offset, offset + 1, ..., offset + T - 1: "
         "start counting at `offset`, not at 0")
def sinusoidal_without_offset(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    a = _angles(T, d_model, base, 0)
    return _interleave(np.sin(a), np.cos(a)).astype(dtype)


@mistake("sinusoidal_positions", "compute the angles in float64 and convert the finished table to `dtype`: in "
         "float32, position x frequency loses its digits beyond position 10^4 (an error of 10^-3 at 10^5)")
def sinusoidal_angles_in_float32(T, d_model, *, base=10000.0, offset=0, dtype=np.float64):
    theta = (base ** (-np.arange(0, d_model, 2) / d_model)).astype(dtype)  # (d_model / 2,)
    a = np.arange(offset, offset + T, dtype=dtype)[:, None] * theta  # (T, d_model / 2), in `dtype`
    return _interleave(np.sin(a), np.cos(a))


check_sinusoidal_positions = make_check("sinusoidal_positions")

# alibi_bias: ALiBi's penalty on the scores ------------------------------------------------


@cases_for("alibi_bias", may_use="NumPy (np.arange, np.abs, broadcasting)",
           forbids=ALIBI_BIAS_FORBIDS, rules=ALIBI_BIAS_RULES)
def alibi_bias_cases(r):
    """Square scores with 2 heads, one new query after 4 positions (a cache step), 3 queries after 3
    positions, one head whose slope is a Python list (as the chapter writes it), and 8 heads with Press et
    al.'s slopes."""
    return [
        Case("T_q = T_k = 4, slopes (1/2, 1/4)", (4, 4, np.array([0.5, 0.25]))),
        Case("one query, the last of T_k = 5 positions", (1, 5, np.array([0.5, 0.25]))),
        Case("3 queries, the last of T_k = 6 positions", (3, 6, np.array([1.0, 0.5, 0.125]))),
        Case("one head, T_q = T_k = 3, the slopes as a Python list [0.5]", (3, 3, [0.5])),
        Case("8 heads with Press et al.'s slopes, T = 5", (5, 5, mn.alibi_slopes(8))),
    ]


@random_cases_for("alibi_bias")
def alibi_bias_random_cases(r):
    """Square and rectangular scores with random slopes (float32 too), and a single position."""
    T_q, extra, h = sizes(r, 3, 1, 5)
    slopes = r.uniform(0.01, 1.0, size=h)
    return [
        Case("random: square", (T_q, T_q, slopes)),
        Case("random: the last queries of a longer sequence, float32 slopes",
             (T_q, T_q + extra, slopes.astype(np.float32))),
        Case("random: one position", (1, 1, slopes)),
    ]


def _distance(T_q, T_k, offset):
    """(T_q, T_k): query i at position offset + i, key j at position j; their signed difference."""
    return (offset + np.arange(T_q))[:, None] - np.arange(T_k)


@mistake("alibi_bias", "ALiBi is a penalty: the bias is -m |i - j|, so that distant keys lose score; "
         "+m |i - j| rewards them")
def alibi_positive(T_q, T_k, slopes):
    return np.asarray(slopes)[:, None, None] * np.abs(_distance(T_q, T_k, T_k - T_q))


@mistake("alibi_bias", "the T_q queries are the LAST T_q of the T_k positions: query i sits at position "
         "T_k - T_q + i (after the cached keys), not at position i")
def alibi_queries_from_0(T_q, T_k, slopes):
    return -np.asarray(slopes)[:, None, None] * np.abs(_distance(T_q, T_k, 0))


@mistake("alibi_bias", "use the absolute distance |i - j|: without it, keys after the query (j > i) "
         "get a positive bias, a reward, instead of a penalty")
def alibi_signed(T_q, T_k, slopes):
    return -np.asarray(slopes)[:, None, None] * _distance(T_q, T_k, T_k - T_q)


@mistake("alibi_bias", "each head h has its own slope m_h: the result is (h, T_q, T_k), the slopes "
         "along the first axis, slopes[:, None, None]")
def alibi_one_slope(T_q, T_k, slopes):
    slopes = np.asarray(slopes)
    return -slopes[0] * np.abs(_distance(T_q, T_k, T_k - T_q))[None].repeat(len(slopes), axis=0)


check_alibi_bias = make_check("alibi_bias")
