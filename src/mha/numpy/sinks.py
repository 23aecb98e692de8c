"""Attention sinks: a learned logit per head in the softmax's denominator (gpt-oss, 2025; the idea of a
place for attention to go that is no token, after Xiao et al., 2023, "Efficient Streaming Language Models
with Attention Sinks", who kept the first tokens for it).

Head i's weights over the keys k of a query row are

    w_k = exp(s_k - m) / (exp(sink_i - m) + sum_j exp(s_j - m)),    m = max(sink_i, max_j s_j),

the softmax of the row with one more entry, the sink, whose weight is then dropped: the row sums to
1 - (the sink's share), less than 1, so a head may attend to little or nothing. Subtracting m changes
no weight (it cancels) but keeps every exponential at most 1. A masked key has the score -inf and the
weight 0; a row with every key masked gives all zeros (only the sink is left, and it is dropped).
"""

import numpy as np

from mha.numpy.attention import as_float_array


def sink_softmax(scores, sinks):
    """Weights (..., h, T_q, T_k) from scores (..., h, T_q, T_k) (-inf where masked) and one sink
    logit per head, sinks (h,): each row's softmax with the sink as an extra entry, the sink's
    own weight left out. Rows sum to less than 1; a fully masked row gives zeros."""
    scores = as_float_array("scores", scores)
    sinks = as_float_array("sinks", sinks)
    if scores.ndim < 3:
        raise ValueError(f"scores must have shape (..., h, T_q, T_k), got shape {scores.shape}")
    if sinks.shape != (scores.shape[-3],):
        raise ValueError(f"sinks must have shape (h,) = ({scores.shape[-3]},), one logit per head, "
                         f"got shape {sinks.shape}")
    if not np.all(np.isfinite(sinks)):
        raise ValueError("sinks must be finite numbers")
    sink = sinks.astype(scores.dtype)[:, None, None]  # (h, 1, 1): the same sink for every row of head i
    m = np.maximum(scores.max(axis=-1, keepdims=True), sink)  # (..., h, T_q, 1), the row's max with the sink
    e = np.exp(scores - m)  # (..., h, T_q, T_k), 0 where masked (-inf)
    return e / (np.exp(sink - m) + e.sum(axis=-1, keepdims=True))  # (..., h, T_q, T_k)
