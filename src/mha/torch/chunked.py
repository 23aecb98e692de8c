"""Attention in bounded memory, in PyTorch: the twin of `mha.numpy.chunked`.

Keys and values in blocks, with an online softmax; see `mha.numpy.chunked` for
the three running quantities and why they are rescaled. Half-precision inputs
(float16, bfloat16) are computed in float32, as there, and the output is rounded
back to the input's dtype once, at the end.
"""

import math

import torch

from mha import validate
from mha.torch.tensors import check_mask_tensor, check_qkv_tensors


def chunked_attention(Q, K, V, mask=None, chunk=256):
    """Twin of `mha.numpy.chunked_attention`: keys in blocks, online softmax, returns out only.

    Never forms the (..., T_q, T_k) scores in the forward pass (autograd keeps each
    block for the backward pass; FlashAttention recomputes them instead).
    """
    batch = check_qkv_tensors(Q, K, V)
    validate.check_int("chunk", chunk)
    shape = (*batch, Q.shape[-2], K.shape[-2])  # (..., T_q, T_k): never allocated
    if mask is not None:
        check_mask_tensor(mask, shape, like=Q)
        mask = mask.expand(shape)  # a view
    dtype = Q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype  # half: sums in float32
    Q = Q.to(work) / math.sqrt(Q.shape[-1])  # .to is a no-op for float32 and float64
    row_max = Q.new_full((*shape[:-1], 1), float("-inf"))  # (..., T_q, 1)
    row_sum = Q.new_zeros((*shape[:-1], 1))  # (..., T_q, 1)
    acc = Q.new_zeros((*shape[:-1], V.shape[-1]))  # (..., T_q, d_v)
    for start in range(0, shape[-1], chunk):
        K_block, V_block = (X[..., start:start + chunk, :].to(work) for X in (K, V))  # (..., c, d): one block
        scores = Q @ K_block.transpose(-2, -1)  # (..., T_q, c)
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start:start + chunk], float("-inf"))
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        safe_max = torch.where(new_max.isfinite(), new_max, 0.0)  # no key allowed yet: avoid -inf - (-inf)
        rescale = torch.exp(row_max - safe_max)  # (..., T_q, 1)
        p = torch.exp(scores - safe_max)  # (..., T_q, c); 0 where masked
        row_sum = row_sum * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + p @ V_block
        row_max = new_max
    return (acc / torch.where(row_sum > 0, row_sum, 1.0)).to(dtype)  # an empty row has acc = 0: stays 0
