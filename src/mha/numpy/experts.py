"""A mixture of experts in NumPy: a router picks a few feed-forwards per token (chapter 17).

A token's router logits (one per expert) become scores, by a softmax (Shazeer et al., 2017;
Switch, Fedus et al., 2022; Qwen3-MoE; gpt-oss) or a sigmoid per expert (DeepSeek-V3, 2024).
The token goes to the top_k experts by score, and its output is the sum of their outputs, each
times its score (divided by the chosen scores' sum when normalised):

- `route_tokens`: the choice and the weights, with DeepSeek-V3's bias that moves the choice only;
- `group_limited_experts` and `route_tokens_in_groups`: DeepSeek's group-limited routing, where a
  token may choose only among the experts of its best few groups;
- `expert_feed_forward`: one expert, SwiGLU (silu(x W_gate) * (x W_up), then W_down) or gpt-oss's
  clamped form, with optional biases;
- `mixture_of_experts`: the whole layer, routed experts plus optional shared experts that every
  token passes through (DeepSeekMoE, Dai et al., 2024; Qwen3-Next gates its own);
- `expert_load` and `balance_correction_bias`: the tokens each expert received, and the update of
  the choice bias that balances the load without an auxiliary loss (Wang et al., 2024; DeepSeek-V3).

Row vectors as everywhere: expert e's matrices are W_gate[e], W_up[e] (d, d_expert) and W_down[e]
(d_expert, d). Import them from `mha.numpy`.
"""

import numpy as np

from mha import validate
from mha.numpy.attention import as_float_array, project, softmax
from mha.numpy.parts import gated_feed_forward, silu

SCORINGS = validate.EXPERT_SCORINGS
EXPERTS = ("swiglu", "clamped_swiglu")


def sigmoid(x):
    """1 / (1 + e^(-x)), without overflow warnings for very negative x."""
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def expert_scores(logits, scoring):
    """softmax over the experts, or a sigmoid for each: (..., n_experts) -> (..., n_experts)."""
    return softmax(logits, axis=-1) if scoring == "softmax" else sigmoid(logits)


def top_k_experts(choice, top_k):
    """The indices of the top_k largest choice scores, largest first; ties go to the lower index.

    choice: (..., n_experts) -> (..., top_k) int64. A stable sort of -choice keeps equal scores
    in index order.
    """
    return np.argsort(-choice, axis=-1, kind="stable")[..., :top_k].astype(np.int64)


def route_tokens(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    """Which top_k experts each token goes to, and with what weights.

    logits: (..., n_experts), the router's output for each token. scores = softmax(logits) or
    sigmoid(logits); the chosen experts are the top_k of scores + bias (bias: (n_experts,),
    DeepSeek-V3's correction that balances the load; it moves the choice, not the weights),
    largest first, ties to the lower index. weights = the chosen experts' scores, divided by
    their sum when `normalize`. Returns weights (..., top_k) and experts (..., top_k) int64.
    """
    logits = as_float_array("logits", logits)
    validate.check_ndim("logits", logits, 1)
    validate.check_routing(logits.shape[-1], top_k, scoring, normalize)
    scores = expert_scores(logits, scoring)  # (..., n_experts)
    choice = scores if bias is None else scores + correction(bias, logits)
    experts = top_k_experts(choice, top_k)  # (..., top_k)
    weights = np.take_along_axis(scores, experts, axis=-1)  # (..., top_k)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, experts


def correction(bias, logits):
    """The routing bias as an array of the logits' dtype, one value per expert."""
    bias = as_float_array("bias", bias)
    validate.check_vector("bias", bias, logits.shape[-1])
    return bias.astype(logits.dtype, copy=False)


def group_limited_experts(choice, n_groups, top_groups):
    """DeepSeek's group-limited routing: True for the experts a token may choose.

    choice: (..., n_experts) biased scores; the experts are n_groups consecutive groups of equal
    size (at least 2). A group's score is the sum of its two largest choice scores; the token may
    choose only among the experts of its top_groups best groups (ties to the lower group).
    Returns a boolean (..., n_experts).
    """
    choice = as_float_array("choice", choice)
    n_experts = choice.shape[-1]
    validate.check_groups(n_experts, n_groups, top_groups)
    grouped = choice.reshape(*choice.shape[:-1], n_groups, n_experts // n_groups)  # (..., groups, per group)
    best_two = -np.sort(-grouped, axis=-1)[..., :2]  # (..., groups, 2)
    chosen_groups = top_k_experts(best_two.sum(axis=-1), top_groups)  # (..., top_groups)
    allowed = np.zeros(choice.shape[:-1] + (n_groups,), dtype=bool)  # (..., groups)
    np.put_along_axis(allowed, chosen_groups, True, axis=-1)
    return np.repeat(allowed, n_experts // n_groups, axis=-1)  # (..., n_experts)


def route_tokens_in_groups(logits, top_k, *, n_groups, top_groups, scoring="sigmoid", normalize=True, bias=None):
    """`route_tokens` where each token chooses only among the experts of its top_groups best groups
    (`group_limited_experts` on the biased scores), as DeepSeek-V3 routes. Returns weights and experts."""
    logits = as_float_array("logits", logits)
    validate.check_ndim("logits", logits, 1)
    validate.check_routing(logits.shape[-1], top_k, scoring, normalize)
    scores = expert_scores(logits, scoring)  # (..., n_experts)
    choice = scores if bias is None else scores + correction(bias, logits)
    allowed = group_limited_experts(choice, n_groups, top_groups)  # (..., n_experts)
    if top_k > top_groups * (logits.shape[-1] // n_groups):
        raise ValueError(f"top_k={top_k} is more than the experts of top_groups={top_groups} groups")
    experts = top_k_experts(np.where(allowed, choice, -np.inf), top_k)  # (..., top_k)
    weights = np.take_along_axis(scores, experts, axis=-1)  # (..., top_k)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, experts


def clamped_swiglu(gate, up, limit, alpha):
    """gpt-oss's gate: gate clamped from above at limit, up into [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    return (up + 1) * gate * sigmoid(alpha * gate)


def check_expert(expert, swiglu_limit, swiglu_alpha):
    if expert not in EXPERTS:
        raise ValueError(f'expert must be "swiglu" or "clamped_swiglu" (gpt-oss), got {expert!r}')
    given = (swiglu_limit is not None, swiglu_alpha is not None)
    if expert == "swiglu" and any(given):
        raise ValueError('swiglu_limit and swiglu_alpha belong to expert="clamped_swiglu" (gpt-oss), not "swiglu"')
    if expert == "clamped_swiglu" and not all(given):
        raise ValueError(f'expert="clamped_swiglu" needs swiglu_limit and swiglu_alpha (gpt-oss: 7.0 and 1.702), '
                         f"got {swiglu_limit!r} and {swiglu_alpha!r}")


def expert_feed_forward(X, W_gate, W_up, W_down, b_gate=None, b_up=None, b_down=None, *,
                        expert="swiglu", swiglu_limit=None, swiglu_alpha=None):
    """One expert: (..., d) -> (..., d). W_gate, W_up: (d, d_expert), W_down: (d_expert, d), biases optional.

    "swiglu": silu(X W_gate + b_gate) * (X W_up + b_up), then W_down + b_down;
    "clamped_swiglu": gpt-oss's `clamped_swiglu` of the same two projections instead.
    """
    check_expert(expert, swiglu_limit, swiglu_alpha)
    X = as_float_array("X", X)
    gate = project("W_gate", X, W_gate, b_gate, "X")  # (..., d_expert)
    up = project("W_up", X, W_up, b_up, "X")  # (..., d_expert)
    if expert == "swiglu":
        hidden = silu(gate) * up
    else:
        hidden = clamped_swiglu(gate, up, X.dtype.type(swiglu_limit), X.dtype.type(swiglu_alpha))
    return project("W_down", hidden, W_down, b_down, "the hidden layer")  # (..., d)


def route(X, W_router, top_k, *, b_router=None, correction_bias=None, scoring="softmax", normalize=True,
          routed_scale=1.0, n_groups=1, top_groups=1):
    """The router of `mixture_of_experts`: weights (..., top_k), routed_scale included, and experts (..., top_k)."""
    logits = project("W_router", X, W_router, b_router, "X")  # (..., n_experts)
    options = dict(scoring=scoring, normalize=normalize, bias=correction_bias)
    if n_groups == 1 and top_groups == 1:
        weights, experts = route_tokens(logits, top_k, **options)
    else:
        weights, experts = route_tokens_in_groups(logits, top_k, n_groups=n_groups, top_groups=top_groups, **options)
    return weights * X.dtype.type(routed_scale), experts


def expert_weights(W_gate, W_up, W_down, n_experts):
    """The experts' stacked matrices as arrays: W_gate, W_up (n_experts, d, d_expert), W_down
    (n_experts, d_expert, d)."""
    stacks = [as_float_array(name, W) for name, W in (("W_gate", W_gate), ("W_up", W_up), ("W_down", W_down))]
    for name, W in zip(("W_gate", "W_up", "W_down"), stacks):
        if W.ndim != 3 or W.shape[0] != n_experts:
            raise ValueError(f"{name} must hold one matrix per expert, shape ({n_experts}, rows, cols), "
                             f"got shape {validate.shape_str(W.shape)}")
    return stacks


def mixture_of_experts(X, W_router, W_gate, W_up, W_down, *, top_k, b_router=None, correction_bias=None,
                       b_gate=None, b_up=None, b_down=None, scoring="softmax", normalize=True, routed_scale=1.0,
                       n_groups=1, top_groups=1, expert="swiglu", swiglu_limit=None, swiglu_alpha=None,
                       shared=None, W_shared_gate=None):
    """A mixture-of-experts feed-forward: (..., T, d) -> (..., T, d).

    W_router: (d, n_experts) (b_router: (n_experts,), gpt-oss); correction_bias: (n_experts,), DeepSeek's
    bias on the choice. W_gate, W_up: (n_experts, d, d_expert), W_down: (n_experts, d_expert, d), and
    b_gate, b_up (n_experts, d_expert), b_down (n_experts, d) or None. Each token goes to its top_k
    experts (`route`); its output is sum_i weight_i * expert_i(x). shared: the keyword arguments of
    `gated_feed_forward` for the shared expert(s) every token passes through (DeepSeek, Qwen3-Next), scaled
    by sigmoid(x W_shared_gate) when W_shared_gate (d, 1) is given (Qwen3-Next).
    """
    X = as_float_array("X", X)
    validate.check_ndim("X", X, 1)
    weights, experts = route(X, W_router, top_k, b_router=b_router, correction_bias=correction_bias,
                             scoring=scoring, normalize=normalize, routed_scale=routed_scale,
                             n_groups=n_groups, top_groups=top_groups)
    W_gate, W_up, W_down = expert_weights(W_gate, W_up, W_down, np.shape(W_router)[-1])
    tokens, weights, experts = X.reshape(-1, X.shape[-1]), weights.reshape(-1, top_k), experts.reshape(-1, top_k)
    out = np.zeros_like(tokens)  # (N, d)
    for e in np.unique(experts):
        rows, slots = np.nonzero(experts == e)  # the tokens sent to expert e, and where it sits in their top_k
        biases = [None if b is None else b[e] for b in (b_gate, b_up, b_down)]
        y = expert_feed_forward(tokens[rows], W_gate[e], W_up[e], W_down[e], *biases, expert=expert,
                                swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha)  # (n_e, d)
        np.add.at(out, rows, weights[rows, slots, None] * y)
    out = out.reshape(X.shape)  # (..., T, d)
    if shared is not None:
        common = gated_feed_forward(X, **shared)  # (..., T, d)
        if W_shared_gate is not None:
            common = sigmoid(project("W_shared_gate", X, W_shared_gate, None, "X")) * common
        out = out + common
    return out


def expert_load(experts, n_experts):
    """How many tokens chose each expert: experts (..., top_k) int -> (n_experts,) int64 counts."""
    experts = np.asarray(experts)
    if not np.issubdtype(experts.dtype, np.integer):
        raise TypeError(f"experts must hold integer expert indices, got dtype {experts.dtype}")
    validate.check_int("n_experts", n_experts)
    if experts.size and not 0 <= experts.min() <= experts.max() < n_experts:
        raise ValueError(f"experts must lie in [0, {n_experts}), got {experts.min()} to {experts.max()}")
    return np.bincount(experts.ravel(), minlength=n_experts).astype(np.int64)


def balance_correction_bias(bias, experts, rate):
    """DeepSeek-V3's balancing without an auxiliary loss: after a step, the bias of each expert that
    received more than the mean load goes down by `rate`, of each that received less goes up.

    bias: (n_experts,), experts: (..., top_k) the step's choices. Returns bias + rate * sign(mean - load).
    """
    bias = as_float_array("bias", bias)
    validate.check_ndim("bias", bias, 1, 1)
    load = expert_load(experts, bias.shape[0])  # (n_experts,)
    return bias + bias.dtype.type(rate) * np.sign(load.mean() - load).astype(bias.dtype)
