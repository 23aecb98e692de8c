"""Chapter 7, why heads differ: the check of `attention_at_offset`, its cases and
its catalogued mistakes."""

import numpy as np

from mha.checks.inputs import batch, normal, sizes
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import ATTENTION_AT_OFFSET_RULES
from mha.checks.routes import ATTENTION_AT_OFFSET_FORBIDS
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for


def attention_rows(r, shape, dtype=np.float64):
    """Attention weights of the given shape: each row sums to 1."""
    return mn.softmax(normal(r, shape, dtype, 2))


@cases_for("attention_at_offset", may_use="NumPy and a loop over the queries (not np.diagonal)",
           forbids=ATTENTION_AT_OFFSET_FORBIDS, rules=ATTENTION_AT_OFFSET_RULES)
def attention_at_offset_cases(r):
    """Offsets back, forward and 0, on one head, heads and a batch of heads, and T_k > T_q."""

    def rows(*shape):
        return attention_rows(r, shape)

    return [
        Case("one head, the previous token", (rows(5, 5), -1)),
        Case("heads, the next token", (rows(3, 6, 6), 1)),
        Case("a batch of heads, the token itself", (rows(2, 3, 4, 4), 0)),
        Case("two tokens back", (rows(2, 6, 6), -2)),
        Case("more keys than queries", (rows(3, 6), 2)),
    ]


@random_cases_for("attention_at_offset")
def attention_at_offset_random_cases(r):
    """T_q != T_k both ways with offsets that leave out different numbers of queries, a 4-D stack in
    float32, and a single query."""
    T_q, T_k = sorted(sizes(r, 2, 2, 7))
    T_k += 1  # more keys than queries
    return [
        Case("random: more keys than queries, a key before", (attention_rows(r, batch(r, 1) + (T_q, T_k)),
                                                               -int(r.integers(1, T_q)))),
        Case("random: more queries than keys, a key after", (attention_rows(r, (T_k + 1, T_k)),
                                                              int(r.integers(0, T_k)))),
        Case("random: a 4-D stack, float32", (attention_rows(r, batch(r, 2) + (T_q, T_k), np.float32),
                                              int(r.integers(1 - T_q, T_k)))),
        Case("random: one query", (attention_rows(r, (1, T_k)), int(r.integers(0, T_k)))),
    ]


@mistake("attention_at_offset", "offset -1 is the key just BEFORE the query: read weights[..., i, i + offset], "
         "not weights[..., i, i - offset]")
def offset_sign_flipped(weights, offset):
    return np.diagonal(np.asarray(weights, dtype=float), -offset, axis1=-2, axis2=-1).mean(axis=-1)


@mistake("attention_at_offset", "average over the queries that have a key at that offset "
         "(T - |offset| of them), not over all T_q queries")
def offset_divided_by_all_queries(weights, offset):
    weights = np.asarray(weights, dtype=float)
    return np.diagonal(weights, offset, axis1=-2, axis2=-1).sum(axis=-1) / weights.shape[-2]


@mistake("attention_at_offset", "the first token has no previous token: do not wrap around to the "
         "last key (skip the queries whose key i + offset does not exist)")
def offset_wraps_around(weights, offset):
    weights = np.asarray(weights, dtype=float)
    T_q, T_k = weights.shape[-2:]
    keys = (np.arange(T_q) + offset) % T_k
    return weights[..., np.arange(T_q), keys].mean(axis=-1)


@mistake("attention_at_offset", "average over the queries i whose key i + offset exists, and count them: "
         "with T_q != T_k there are not T_k - |offset| of them (nor T_q - |offset|)")
def offset_divided_by_keys(weights, offset):
    weights = np.asarray(weights, dtype=float)
    return np.diagonal(weights, offset, axis1=-2, axis2=-1).sum(axis=-1) / (weights.shape[-1] - abs(offset))


check_attention_at_offset = make_check("attention_at_offset")
