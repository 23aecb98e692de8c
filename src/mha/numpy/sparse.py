"""DeepSeek Sparse Attention (DeepSeek-V3.2, 2025): the lightning indexer's scores, and each query's
choice of its top-k keys, over which it then attends.

The indexer has a few small heads j, one key k_s per token shared by them, and a weight w_tj per
query and head. Query t's score for key s is I_ts = sum_j w_tj ReLU(scale * q_tj . k_s): cheap
(few heads, narrow, and in DeepSeek's kernels 8-bit), and used only to choose keys, never as weights.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array, as_mask, split_heads, transpose
from mha.numpy.blocks import layer_norm
from mha.numpy.rotary import apply_rotary


def select_top_k_keys(scores, k, mask=None):
    """Booleans of scores' shape (..., T_q, T_k): True at the k highest scores among the allowed keys
    of each query row (every allowed key when fewer than k are allowed); ties go to the earlier key.
    mask: booleans broadcasting to scores, True = allowed. Allowed scores must be finite."""
    scores = as_float_array("scores", scores)
    validate.check_ndim("scores", scores, 1)
    k = validate.check_int("k", k)
    mask = as_mask(mask, scores.shape)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)  # (..., T_q, T_k): refused keys sort last
    order = np.argsort(-scores, axis=-1, kind="stable")  # best first; a stable sort keeps tied keys in order
    chosen = order[..., :k]  # (..., T_q, min(k, T_k)): each row's k best key indices
    selected = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(selected, chosen, True, axis=-1)
    return selected if mask is None else selected & mask  # fewer than k allowed: only those


def lightning_indexer_scores(q, keys, head_weights, scale):
    """I_ts = sum_j w_tj ReLU(scale * q_tj . k_s).

    q (..., n, T, d_index): the indexer's queries (rotated), n heads; keys (..., T_k, d_index): one key
    per token (rotated); head_weights (..., T, n): w_tj; scale: a float (transformers: d_index ** -0.5).
    Returns the scores (..., T, T_k)."""
    q, keys, head_weights = (as_float_array(name, a) for name, a in
                             (("q", q), ("keys", keys), ("head_weights", head_weights)))
    per_head = np.maximum(float(scale) * (q @ transpose(keys)[..., None, :, :]), 0)  # (..., n, T, T_k)
    return np.einsum("...tn,...nts->...ts", head_weights, per_head)  # (..., T, T_k)


def rotate_first(x, cos, sin):
    """x (..., T, d) with its first d_rope features (the tables' width) turned by RoPE, rotate-half style."""
    d_rope = cos.shape[-1]
    return np.concatenate([apply_rotary(x[..., :d_rope], cos, sin), x[..., d_rope:]], axis=-1)  # (..., T, d)


def lightning_indexer(X, q_low, params, cos, sin, *, n_heads, head_dim, norm_eps=1e-6):
    """DeepSeek-V3.2's indexer scores (..., T, T) over a prompt X (..., T, d_model).

    q_low (..., T, q_lora_rank): the latent attention's compressed query (after its norm); params:
    W_iq (q_lora_rank, n_heads * head_dim), W_ik (d_model, head_dim), k_norm_weight and k_norm_bias
    (head_dim,) (a LayerNorm), W_iw (d_model, n_heads); cos, sin (T, d_rope): RoPE on the first d_rope
    features of the indexer's queries and keys (halves, not interleaved pairs)."""
    q = split_heads(q_low @ params["W_iq"], n_heads)  # (..., n, T, head_dim)
    keys = layer_norm(X @ params["W_ik"], params["k_norm_weight"], params["k_norm_bias"], eps=norm_eps)  # (..., T, d)
    head_weights = (X @ params["W_iw"]) * n_heads ** -0.5  # (..., T, n)
    return lightning_indexer_scores(rotate_first(q, cos, sin), rotate_first(keys, cos, sin), head_weights,
                                    head_dim ** -0.5)
