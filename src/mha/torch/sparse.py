"""DeepSeek Sparse Attention (DeepSeek-V3.2, 2025): a lightning indexer scores every key for every
query cheaply, and each query attends only to its top_k keys. The PyTorch face of `mha.numpy.sparse`.

The indexer has a few small heads of its own. Query t's score for key s is
    I_ts = sum_j w_tj ReLU(scale * q_tj . k_s),
with one key k_s per token shared by the indexer's heads (a LayerNorm of x W_k), the queries q_tj
projected from the attention's compressed query, and a weight w_tj per head and query projected
from x. The first qk_rope_head_dim features of q and k turn by RoPE, in halves (the main latent
attention of V3.2 turns interleaved pairs instead); scale = head_dim ** -0.5, and the head weights
are divided by sqrt(n_heads), as transformers' deepseek_v32 computes them.
"""

import torch
from torch import nn

from mha import validate
from mha.torch.attention import split_heads
from mha.torch.rotary import rotated
from mha.torch.tensors import check_is_tensor, check_mask_tensor

INDEXER_KEYS = ("n_heads", "head_dim", "top_k")  # the keys of MultiHeadLatentAttention's `indexer` dict


def select_top_k_keys(scores, k, mask=None):
    """Booleans of scores' shape (..., T_q, T_k): True at the k highest scores among the allowed keys
    of each query row (every allowed key when fewer than k are allowed). Ties go to the earlier key.
    mask: booleans broadcasting to scores, True = allowed. Allowed scores must be finite."""
    check_is_tensor("scores", scores)
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor, got dtype {scores.dtype}")
    validate.check_ndim("scores", scores, 1)
    k = validate.check_int("k", k)
    if mask is not None:
        check_mask_tensor(mask, scores.shape, like=scores)
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., T_q, T_k): refused keys sort last
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # stable: ties keep key order
    chosen = order[..., :k]  # (..., T_q, min(k, T_k)): the k best key indices of each row
    selected = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter(-1, chosen, True)
    return selected if mask is None else selected & mask  # fewer than k allowed: only those


def lightning_indexer_scores(q, keys, head_weights, scale):
    """I_ts = sum_j w_tj ReLU(scale * q_tj . k_s): q (..., n, T, d_index) (rotated), keys (..., T_k, d_index)
    (rotated), head_weights (..., T, n). Returns the scores (..., T, T_k)."""
    per_head = torch.relu(q @ keys.transpose(-2, -1).unsqueeze(-3) * scale)  # (..., n, T, T_k)
    return torch.einsum("...tn,...nts->...ts", head_weights, per_head)  # (..., T, T_k)


def rotate_first(x, d_rope, tables):
    """x (..., T, d) with its first d_rope features turned by RoPE (rotate-half) with tables (cos, sin)."""
    cos, sin = tables
    x_rope, x_pass = x.split([d_rope, x.shape[-1] - d_rope], dim=-1)  # (..., T, d_rope), (..., T, d - d_rope)
    return torch.cat([rotated(x_rope, cos.to(x.dtype), sin.to(x.dtype)), x_pass], dim=-1)  # (..., T, d)


class LightningIndexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer: scores (..., T, T_k) of every key for every query, and the
    top_k choice of keys. It reads x (..., T, d_model) and the latent attention's compressed query
    (..., T, q_lora_rank); it shares that attention's RoPE tables (`mha.torch.RotaryTables`)."""

    def __init__(self, d_model, q_lora_rank, *, n_heads, head_dim, top_k, rope_head_dim, norm_eps=1e-6,
                 device=None, dtype=None):
        super().__init__()
        self.n_heads, self.head_dim = validate.check_int("n_heads", n_heads), validate.check_int("head_dim", head_dim)
        self.top_k, self.rope_head_dim = validate.check_int("top_k", top_k), validate.check_int("rope_head_dim",
                                                                                                rope_head_dim)
        if rope_head_dim > head_dim:
            raise ValueError(f"the indexer's head_dim={head_dim} must hold its rotary part, "
                             f"qk_rope_head_dim={rope_head_dim}")
        options = dict(bias=False, device=device, dtype=dtype)
        self.W_q = nn.Linear(q_lora_rank, n_heads * head_dim, **options)
        self.W_k = nn.Linear(d_model, head_dim, **options)
        self.k_norm = nn.LayerNorm(head_dim, eps=norm_eps, device=device, dtype=dtype)
        self.W_w = nn.Linear(d_model, n_heads, **options)  # one weight per head and query
        self.scale = head_dim ** -0.5

    def keys(self, x, rotary, start=0, positions=None):
        """The new tokens' indexer keys (..., T, head_dim), normed and rotated: what the cache keeps."""
        k = self.k_norm(self.W_k(x)).unsqueeze(-3)  # (..., 1, T, head_dim)
        tables = rotary(k.shape[-2], start, positions, k.dtype, k.device)  # (T, d_rope) or (..., 1, T, d_rope)
        return rotate_first(k, self.rope_head_dim, tables).squeeze(-3)  # (..., T, head_dim)

    def forward(self, x, q_low, keys, rotary, start=0, positions=None):
        """x (..., T, d_model); q_low (..., T, q_lora_rank); keys (..., T_k, head_dim) from `keys` (all held).
        Returns the scores (..., T, T_k)."""
        q = split_heads(self.W_q(q_low), self.n_heads)  # (..., n, T, head_dim)
        tables = rotary(q.shape[-2], start, positions, q.dtype, q.device)
        q = rotate_first(q, self.rope_head_dim, tables)  # (..., n, T, head_dim)
        head_weights = self.W_w(x) * self.n_heads ** -0.5  # (..., T, n)
        return lightning_indexer_scores(q, keys, head_weights, self.scale)

    def select(self, scores, allowed=None):
        """`select_top_k_keys(scores, top_k, allowed)`: (..., T, T_k) booleans."""
        return select_top_k_keys(scores, self.top_k, allowed)
