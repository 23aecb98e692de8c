"""Attention sinks, the PyTorch face of `mha.numpy.sinks`: a learned logit per head in the softmax's
denominator (gpt-oss, 2025; after Xiao et al., 2023, "Efficient Streaming Language Models with Attention
Sinks"). `GroupedQueryAttention(sinks=True)` attends with `attention_with_sinks`.
"""

import torch

from mha import validate
from mha.torch.attention import soft_cap
from mha.torch.tensors import check_is_tensor, check_tensor


def sink_softmax(scores, sinks):
    """Weights (..., h, T_q, T_k) from scores (..., h, T_q, T_k) (-inf where masked) and one learned
    logit per head, sinks (h,), as gpt-oss computes them: w_k = exp(s_k - m) / (exp(sink - m) +
    sum_j exp(s_j - m)), m the row's max over its scores and the sink. The twin of
    `mha.numpy.sink_softmax`: rows sum to less than 1, a fully masked row gives zeros."""
    check_tensor("scores", scores)
    check_is_tensor("sinks", sinks)
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be a floating-point tensor, got dtype {sinks.dtype}")
    if scores.dim() < 3:
        raise ValueError(f"scores must have shape (..., h, T_q, T_k), got {validate.shape_str(scores.shape)}")
    if tuple(sinks.shape) != (scores.shape[-3],):
        raise ValueError(f"sinks must have shape (h,) = ({scores.shape[-3]},), one logit per head, "
                         f"got {validate.shape_str(sinks.shape)}")
    sink = sinks.to(scores.dtype)[:, None, None]  # (h, 1, 1): the same sink for every row of head i
    m = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)  # (..., h, T_q, 1)
    e = (scores - m).exp()  # (..., h, T_q, T_k), 0 where masked (-inf)
    return e / ((sink - m).exp() + e.sum(dim=-1, keepdim=True))  # (..., h, T_q, T_k)


def attention_with_sinks(q, keys, values, mask, sinks, *, scale=None, logit_cap=None):
    """The explicit attention of `grouped_attention` with gpt-oss's sinks: q (..., h, T_new, d_head), keys
    and values (..., h, T_k, d_head) (already repeated per query head), mask broadcasting to
    (..., h, T_new, T_k) or None, sinks (h,). Returns out (..., h, T_new, d_head), weights."""
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype  # half: computed in float32
    q, keys, values = q.to(work), keys.to(work), values.to(work)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ keys.transpose(-2, -1)) * scale  # (..., h, T_new, T_k)
    if logit_cap is not None:
        scores = soft_cap(scores, logit_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = sink_softmax(scores, sinks)  # (..., h, T_new, T_k), rows summing to less than 1
    return (weights @ values).to(dtype), weights.to(dtype)
