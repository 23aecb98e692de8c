"""Chapter 4, several heads: the check of `multihead_attention_loop`, its cases and
its catalogued mistakes."""

import numpy as np

from mha.checks.common import head_with_own_softmax
from mha.checks.inputs import causal, different_sizes, far_apart, normal, sizes, weights, with_an_empty_row
from mha.checks.reference import NUMPY as mn
from mha.checks.rules import LOOP_RULES
from mha.checks.routes import LOOP_ROUTES
from mha.checks.registry import OUT_AND_WEIGHTS, Case, cases_for, make_check, mistake, random_cases_for


@cases_for("multihead_attention_loop", returns=OUT_AND_WEIGHTS, may_use="NumPy and mnp.head_attention",
           forbids=LOOP_ROUTES, rules=LOOP_RULES)
def loop_cases(r):
    """Narrow heads, wide heads on a batch with a causal mask, one head, a padding mask with a batch axis
    (B, 1, 1, T_k) for 3 sequences and 2 heads, and scores above 1000 in one query's row and near 0 in the
    others' (W_q = W_k = I)."""
    narrow = [(weights(r, 6, 3), weights(r, 6, 3), weights(r, 6, 3)) for _ in range(2)]
    wide = [(weights(r, 4, 4), weights(r, 4, 4), weights(r, 4, 4)) for _ in range(3)]
    X_far, context_far = far_apart(r, (2,), 3, 4, 3)
    identity = [(np.eye(3), np.eye(3), weights(r, 3, 2)) for _ in range(2)]
    return [
        Case("2 narrow heads", (r.standard_normal((5, 6)), narrow, weights(r, 6, 6))),
        Case("3 wide heads, a batch, causal", (r.standard_normal((2, 4, 4)), wide, weights(r, 12, 4)),
             {"mask": causal(4)}),
        Case("1 head", (r.standard_normal((3, 6)), narrow[:1], weights(r, 3, 6))),
        Case("a padding mask with a batch axis (B, 1, 1, T_k), B = 3 sequences, 2 heads",
             (r.standard_normal((3, 4, 6)), narrow, weights(r, 6, 5)),
             {"mask": np.arange(4) < np.array([4, 2, 1])[:, None, None, None]}),
        Case("scores above 709 in one row, near 0 in the others", (X_far, identity, weights(r, 4, 3)),
             {"context": context_far}),
    ]


def heads_of_different_widths(r, n_heads, d, d_c, dtype=np.float64):
    """n_heads (W_q, W_k, W_v) triples, each head with its own d_head and a d_v of its own, and their total d_v."""
    heads = []
    for d_head, d_v in zip(sizes(r, n_heads, 1, 4), different_sizes(r, n_heads, 1, 4)):
        heads.append((weights(r, d, d_head, dtype), weights(r, d_c, d_head, dtype), weights(r, d_c, d_v, dtype)))
    return heads, sum(W_v.shape[1] for _, _, W_v in heads)


@random_cases_for("multihead_attention_loop")
def loop_random_cases(r):
    """Heads of different widths: cross-attention with a mask per head, a 4-D batch in float32 with one
    mask for every head, and T = 1 with one head."""
    d, d_c, d_out = different_sizes(r, 3, 1, 6)
    (h, b), (T_q, T_k) = sizes(r, 2, 2, 3), sizes(r, 2, 2, 5)
    cross, cross_v = heads_of_different_widths(r, h, d, d_c)
    heads, total_v = heads_of_different_widths(r, h, d, d, np.float32)
    one, one_v = heads_of_different_widths(r, 1, d, d)
    return [
        Case("random: cross-attention, a mask per head with a query that may attend to nothing",
             (normal(r, (b, T_q, d)), cross, weights(r, cross_v, d_out)),
             {"context": normal(r, (b, T_k, d_c)), "mask": with_an_empty_row(r, (h, T_q, T_k))}),
        Case("random: a 4-D batch, float32, one mask for every head",
             (normal(r, (b, 2, T_q, d), np.float32), heads, weights(r, total_v, d_out, np.float32)),
             {"mask": with_an_empty_row(r, (T_q, T_q))}),
        Case("random: T = 1, one head", (normal(r, (1, d)), one, weights(r, one_v, d_out))),
    ]


def _loop(X, heads, W_o, *, context=None, mask=None, project=True, mask_per_head=True, shift="row"):
    """The loop over heads with one step changed, as the flags say (shift: see mha.checks.common.naive_softmax)."""
    source = X if context is None else context
    shape = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
    full = None if mask is None else np.broadcast_to(mask, shape)
    outputs, maps = [], []
    for i, (W_q, W_k, W_v) in enumerate(heads):
        own = None if mask is None else (full[..., i, :, :] if mask_per_head else np.asarray(mask)[i])
        if shift == "row":
            out, w = mn.head_attention(X, W_q, W_k, W_v, context=context, mask=own)
        else:
            out, w = head_with_own_softmax(X, W_q, W_k, W_v, context, own, shift)
        outputs.append(out)
        maps.append(w)
    concat = np.concatenate(outputs, axis=-1)
    return (concat @ W_o if project else concat[..., : W_o.shape[1]]), np.stack(maps, axis=-3)


@mistake("multihead_attention_loop", "the concatenated heads must go through W_o")
def loop_without_W_o(X, heads, W_o, *, context=None, mask=None):
    return _loop(X, heads, W_o, context=context, mask=mask, project=False)


@mistake("multihead_attention_loop", "head i uses mask[..., i, :, :] once the mask is broadcast to "
         "(..., h, T_q, T_k): a (T_q, T_k) mask applies to every head (mask[i] would be its row i), and so does "
         "a (B, 1, 1, T_k) mask (mask[i] would be sequence i's)")
def loop_mask_indexed_before_broadcasting(X, heads, W_o, *, context=None, mask=None):
    return _loop(X, heads, W_o, context=context, mask=mask, mask_per_head=False)


@mistake("multihead_attention_loop", "exp overflows on scores above 709: subtract each row's maximum before "
         "exponentiating (mnp.head_attention does)")
def loop_softmax_without_max(X, heads, W_o, *, context=None, mask=None):
    return _loop(X, heads, W_o, context=context, mask=mask, shift=None)


@mistake("multihead_attention_loop", "subtract each row's own maximum, not the maximum of all the scores: a row "
         "far below it underflows to 0 / 0")
def loop_softmax_global_max(X, heads, W_o, *, context=None, mask=None):
    return _loop(X, heads, W_o, context=context, mask=mask, shift="global")


check_multihead_attention_loop = make_check("multihead_attention_loop")
