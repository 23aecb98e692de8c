"""Right solutions of chapter 17's exercises written from scratch, for the tests of their checks
(tests/test_checks_ch17.py, and the gathering of right solutions in tests/learners.py), and what those tests share:
running a check, its failures on every seed, a named case by its words, the cases of several seeds."""

import numpy as np

from learners import SEEDS, all_cases, failures_on_every_seed, labelled, run  # noqa: F401 (the tests import them here)

CHAPTER_17 = ["absorbed_latent_decode", "sink_softmax", "select_top_k_keys", "route_tokens"]


# absorbed_latent_decode: NumPy only ---------------------------------------------------------------------------


def absorbed_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    """With einsum: the query into the latent space, scores against the latents, their weighted sum, W_uv."""
    q_latent = np.einsum("hrn,...hn->...hr", W_uk, q_nope)  # (..., h, r)
    scores = np.einsum("...hr,...tr->...ht", q_latent, latents) + np.einsum("...hd,...td->...ht", q_rope, rotary_keys)
    scores = scores * scale  # (..., h, T); a Python float: float32 stays float32
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)  # (..., h, T)
    mixed = np.einsum("...ht,...tr->...hr", weights, latents)  # (..., h, r)
    return np.einsum("...hr,hrv->...hv", mixed, W_uv), weights  # (..., h, d_v)


def absorbed_latent_decode_head_by_head(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale):
    """A loop over the heads with @: head i's query W_uk[i] @ q_nope_i, its scores and its output."""
    outs, all_weights = [], []
    for i in range(W_uk.shape[0]):
        q_latent = q_nope[..., i, None, :] @ np.swapaxes(W_uk[i], -1, -2)  # (..., 1, r)
        scores = (q_latent @ np.swapaxes(latents, -1, -2) + q_rope[..., i, None, :] @ np.swapaxes(rotary_keys, -1, -2))
        scores = scores[..., 0, :] * scale  # (..., T)
        w = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
        w = w / np.sum(w, axis=-1, keepdims=True)
        outs.append((w[..., None, :] @ latents)[..., 0, :] @ W_uv[i])  # (..., d_v)
        all_weights.append(w)
    return np.stack(outs, axis=-2), np.stack(all_weights, axis=-2)


# sink_softmax: NumPy only ---------------------------------------------------------------------------------------


def sink_softmax(scores, sinks):
    """The sink as the row's extra entry in the maximum and the denominator."""
    sink = sinks[:, None, None]  # (h, 1, 1)
    m = np.maximum(scores.max(axis=-1, keepdims=True), sink)  # (..., h, T_q, 1): finite, the sink is
    e = np.exp(scores - m)
    return e / (np.exp(sink - m) + e.sum(axis=-1, keepdims=True))


def sink_softmax_by_concatenation(scores, sinks):
    """gpt-oss's way: the sink as one more column, a softmax written by hand over it, the column dropped."""
    column = np.broadcast_to(sinks.reshape(-1, 1, 1), scores.shape[:-1] + (1,))  # (..., h, T_q, 1)
    both = np.concatenate([scores, column], axis=-1)  # (..., h, T_q, T_k + 1)
    e = np.exp(both - both.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True))[..., :-1]


# select_top_k_keys: NumPy only ----------------------------------------------------------------------------------


def select_top_k_keys(scores, k, mask=None):
    """A stable sort of -scores (masked keys last), the first k, then the mask again."""
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    order = np.argsort(-np.where(allowed, scores, -np.inf), axis=-1, kind="stable")[..., :k]
    selected = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(selected, order, True, axis=-1)
    return selected & allowed


def select_top_k_keys_by_rank(scores, k, mask=None):
    """Key j's rank: how many allowed keys beat it (a higher score, or the same and earlier); selected when < k."""
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    s_j, s_i = scores[..., :, None], scores[..., None, :]  # key j against every key i: (..., T_q, T_k, T_k)
    earlier = np.arange(scores.shape[-1])[None, :] < np.arange(scores.shape[-1])[:, None]  # i before j
    beats = allowed[..., None, :] & ((s_i > s_j) | ((s_i == s_j) & earlier))
    return allowed & (beats.sum(axis=-1) < k)


# route_tokens: NumPy only ---------------------------------------------------------------------------------------


def route_tokens(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    """Scores, choice, a stable sort of -choice, the scores at the chosen experts."""
    if scoring == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = e / e.sum(axis=-1, keepdims=True)
    elif scoring == "sigmoid":
        scores = 1 / (1 + np.exp(-logits))
    else:
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    choice = scores if bias is None else scores + bias
    experts = np.argsort(-choice, axis=-1, kind="stable")[..., :top_k]  # (..., top_k), best first
    weights = np.take_along_axis(scores, experts, axis=-1)
    return (weights / weights.sum(axis=-1, keepdims=True) if normalize else weights), experts


def route_tokens_token_by_token(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    """One token at a time, the experts picked one after another (the best left; the lower index on a tie)."""
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"unknown scoring {scoring!r}")
    rows = logits.reshape(-1, logits.shape[-1])
    weights = np.zeros((len(rows), top_k), dtype=logits.dtype)
    experts = np.zeros((len(rows), top_k), dtype=np.int64)
    for t, row in enumerate(rows):
        if scoring == "softmax":
            scores = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        else:
            scores = 1 / (1 + np.exp(-row))
        choice = list(scores if bias is None else scores + bias)
        for j in range(top_k):
            best = max(range(len(choice)), key=lambda e: (choice[e], -e))
            experts[t, j], weights[t, j], choice[best] = best, scores[best], -np.inf
        if normalize:
            weights[t] = weights[t] / weights[t].sum()
    return weights.reshape(*logits.shape[:-1], top_k), experts.reshape(*logits.shape[:-1], top_k)


FROM_SCRATCH = [absorbed_latent_decode, absorbed_latent_decode_head_by_head, sink_softmax,
                sink_softmax_by_concatenation, select_top_k_keys, select_top_k_keys_by_rank, route_tokens,
                route_tokens_token_by_token]
