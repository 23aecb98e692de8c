"""A mixture of experts in PyTorch: the same functions as `mha.numpy.experts`, and the layer (chapter 17).

- `route_tokens`, `group_limited_experts`, `route_tokens_in_groups`, `clamped_swiglu`, `expert_load`,
  `balance_correction_bias`: as in NumPy.
- `MixtureOfExperts`: a router (nn.Linear to one logit per expert) sends each token to top_k of
  n_experts gated feed-forwards; shared experts, if any, see every token. One module computes the
  families' layers by its arguments (`mha.torch.hf.experts.experts_arguments` reads them):
  DeepSeek-V3 and V3.2 (sigmoid scores, a bias on the choice, group-limited routing, normalised
  weights times routed_scale, shared experts), Qwen3-MoE (softmax, norm_topk_prob), Qwen3-Next
  (plus a shared expert behind a sigmoid gate) and gpt-oss (a router with a bias, softmax over the
  chosen logits, which is the normalised softmax, and clamped SwiGLU experts with biases).

The experts' matrices are stacked in nn.Linear's layout: W_gate[e], W_up[e] (d_expert, d_model),
W_down[e] (d_model, d_expert). Each expert computes only the tokens routed to it.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.attention import linear_bias, linear_weight
from mha.torch.hf import experts as hf_experts
from mha.torch.parts import GatedFeedForward
from mha.torch.tensors import check_input, check_is_tensor

SCORINGS = validate.EXPERT_SCORINGS
EXPERTS = ("swiglu", "clamped_swiglu")
HALF = (torch.float16, torch.bfloat16)


def check_logits(logits):
    check_is_tensor("logits", logits)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    validate.check_ndim("logits", logits, 1)


def expert_scores(logits, scoring):
    """softmax over the experts, or a sigmoid for each: (..., n_experts) -> (..., n_experts)."""
    return torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)


def top_k_experts(choice, top_k):
    """The indices of the top_k largest choice scores, largest first; ties go to the lower index
    (a stable sort keeps equal scores in index order). (..., n_experts) -> (..., top_k) int64."""
    return torch.sort(choice, dim=-1, descending=True, stable=True).indices[..., :top_k]


def correction(bias, logits):
    check_is_tensor("bias", bias)
    validate.check_vector("bias", bias, logits.shape[-1])
    return bias.to(logits.dtype)


def route_tokens(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    """Which top_k experts each token goes to, and with what weights (as `mha.numpy.route_tokens`).

    logits: (..., n_experts). scores = softmax or sigmoid of them; the chosen experts are the
    top_k of scores + bias (bias (n_experts,) moves the choice, not the weights), largest first,
    ties to the lower index; weights = their scores, divided by their sum when `normalize`.
    Returns weights (..., top_k) and experts (..., top_k) int64.
    """
    check_logits(logits)
    validate.check_routing(logits.shape[-1], top_k, scoring, normalize)
    scores = expert_scores(logits, scoring)  # (..., n_experts)
    choice = scores if bias is None else scores + correction(bias, logits)
    experts = top_k_experts(choice, top_k)  # (..., top_k)
    weights = scores.gather(-1, experts)  # (..., top_k)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def group_limited_experts(choice, n_groups, top_groups):
    """DeepSeek's group-limited routing: True for the experts a token may choose (as in NumPy).

    choice: (..., n_experts) biased scores, in n_groups consecutive groups; a group's score is the
    sum of its two largest; the token may choose among the experts of its top_groups best groups.
    Returns a boolean (..., n_experts).
    """
    n_experts = choice.shape[-1]
    validate.check_groups(n_experts, n_groups, top_groups)
    grouped = choice.unflatten(-1, (n_groups, n_experts // n_groups))  # (..., groups, per group)
    best_two = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values  # (..., groups, 2)
    chosen_groups = top_k_experts(best_two.sum(dim=-1), top_groups)  # (..., top_groups)
    allowed = torch.zeros(choice.shape[:-1] + (n_groups,), dtype=torch.bool, device=choice.device)
    allowed.scatter_(-1, chosen_groups, True)  # (..., groups)
    return allowed.repeat_interleave(n_experts // n_groups, dim=-1)  # (..., n_experts)


def route_tokens_in_groups(logits, top_k, *, n_groups, top_groups, scoring="sigmoid", normalize=True, bias=None):
    """`route_tokens` among the experts of each token's top_groups best groups (DeepSeek-V3)."""
    check_logits(logits)
    validate.check_routing(logits.shape[-1], top_k, scoring, normalize)
    scores = expert_scores(logits, scoring)  # (..., n_experts)
    choice = scores if bias is None else scores + correction(bias, logits)
    allowed = group_limited_experts(choice, n_groups, top_groups)  # (..., n_experts)
    if top_k > top_groups * (logits.shape[-1] // n_groups):
        raise ValueError(f"top_k={top_k} is more than the experts of top_groups={top_groups} groups")
    experts = top_k_experts(choice.masked_fill(~allowed, -math.inf), top_k)  # (..., top_k)
    weights = scores.gather(-1, experts)  # (..., top_k)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def clamped_swiglu(gate, up, limit, alpha):
    """gpt-oss's gate: gate clamped from above at limit, up into [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


def check_expert(expert, swiglu_limit, swiglu_alpha):
    if expert not in EXPERTS:
        raise ValueError(f'expert must be "swiglu" or "clamped_swiglu" (gpt-oss), got {expert!r}')
    given = (swiglu_limit is not None, swiglu_alpha is not None)
    if expert == "swiglu" and any(given):
        raise ValueError('swiglu_limit and swiglu_alpha belong to expert="clamped_swiglu" (gpt-oss), not "swiglu"')
    if expert == "clamped_swiglu" and not all(given):
        raise ValueError(f'expert="clamped_swiglu" needs swiglu_limit and swiglu_alpha (gpt-oss: 7.0 and 1.702), '
                         f"got {swiglu_limit!r} and {swiglu_alpha!r}")


def stacked(n_experts, rows, cols, options):
    """n_experts matrices (rows, cols) of nn.Linear(cols, rows)'s layout, drawn as nn.Linear draws its weight."""
    bound = 1 / math.sqrt(cols)
    return nn.Parameter(torch.empty(n_experts, rows, cols, **options).uniform_(-bound, bound))


def stacked_bias(n_experts, width, fan_in, options):
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(n_experts, width, **options).uniform_(-bound, bound))


def of_expert(bias, e):
    """Expert e's bias, or None when the experts have none."""
    return None if bias is None else bias[e]


def expert_load(experts, n_experts):
    """How many tokens chose each expert: experts (..., top_k) int -> (n_experts,) int64 counts."""
    check_is_tensor("experts", experts)
    if experts.is_floating_point() or experts.dtype == torch.bool:
        raise TypeError(f"experts must hold integer expert indices, got dtype {experts.dtype}")
    validate.check_int("n_experts", n_experts)
    if experts.numel() and not 0 <= experts.min().item() <= experts.max().item() < n_experts:
        raise ValueError(f"experts must lie in [0, {n_experts}), got {experts.min().item()} to {experts.max().item()}")
    return torch.bincount(experts.flatten(), minlength=n_experts)


def balance_correction_bias(bias, experts, rate):
    """DeepSeek-V3's balancing without an auxiliary loss (as in NumPy): bias + rate * sign(mean load - load)."""
    check_is_tensor("bias", bias)
    validate.check_ndim("bias", bias, 1, 1)
    load = expert_load(experts, bias.shape[0]).to(bias.dtype)  # (n_experts,)
    return bias + rate * torch.sign(load.mean() - load)


class MixtureOfExperts(nn.Module):
    """A mixture-of-experts feed-forward: (..., T, d_model) -> (..., T, d_model).

    Each token's router logits x W_router (+ b_router when router_bias) are scored ("softmax" or
    "sigmoid"); the token goes to the top_k experts of scores + correction_bias (a buffer, DeepSeek's
    load-balancing bias, when correction_bias=True), chosen within its top_groups best of n_groups
    groups (DeepSeek); its weights are the chosen scores, normalised to sum to 1 when `normalize`,
    times routed_scale. Its output is sum_i weight_i * expert_i(x), where an expert is SwiGLU
    ("swiglu") or gpt-oss's "clamped_swiglu" (with swiglu_limit and swiglu_alpha), with biases when
    expert_bias. n_shared > 0 adds one gated feed-forward of width d_shared (default n_shared * d_expert)
    that every token passes through, behind sigmoid(x W_shared_gate) when shared_gate (Qwen3-Next).
    `route(x)` gives the choices (`scores(x)`, every expert's score); the last forward's choices are
    kept in `last_routing`.
    """

    def __init__(self, d_model, *, n_experts, top_k, d_expert, scoring="softmax", normalize=True, routed_scale=1.0,
                 n_groups=1, top_groups=1, correction_bias=False, router_bias=False, n_shared=0, d_shared=None,
                 shared_gate=False, expert="swiglu", expert_bias=False, swiglu_limit=None, swiglu_alpha=None,
                 device=None, dtype=None):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_experts", n_experts), ("d_expert", d_expert)):
            validate.check_int(name, value)
        validate.check_int("n_shared", n_shared, minimum=0)
        validate.check_routing(n_experts, top_k, scoring, normalize)
        validate.check_groups(n_experts, n_groups, top_groups)
        check_expert(expert, swiglu_limit, swiglu_alpha)
        for name, value in (("correction_bias", correction_bias), ("router_bias", router_bias),
                            ("shared_gate", shared_gate), ("expert_bias", expert_bias)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        if shared_gate and not n_shared:
            raise ValueError("shared_gate=True gates the shared expert, but n_shared=0 makes none")
        if n_shared:
            d_shared = n_shared * d_expert if d_shared is None else validate.check_int("d_shared", d_shared)
        else:
            d_shared = None
        self.options = dict(n_experts=n_experts, top_k=top_k, d_expert=d_expert, scoring=scoring, normalize=normalize,
                            routed_scale=float(routed_scale), n_groups=n_groups, top_groups=top_groups,
                            correction_bias=correction_bias, router_bias=router_bias, n_shared=n_shared,
                            d_shared=d_shared, shared_gate=shared_gate, expert=expert, expert_bias=expert_bias,
                            swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha)
        options = dict(device=device, dtype=dtype)
        self.router = nn.Linear(d_model, n_experts, bias=router_bias, **options)
        self.register_buffer("correction_bias", torch.zeros(n_experts, **options) if correction_bias else None)
        self.W_gate = stacked(n_experts, d_expert, d_model, options)
        self.W_up = stacked(n_experts, d_expert, d_model, options)
        self.W_down = stacked(n_experts, d_model, d_expert, options)
        self.b_gate = stacked_bias(n_experts, d_expert, d_model, options) if expert_bias else None
        self.b_up = stacked_bias(n_experts, d_expert, d_model, options) if expert_bias else None
        self.b_down = stacked_bias(n_experts, d_model, d_expert, options) if expert_bias else None
        self.shared = GatedFeedForward(d_model, d_shared, **options) if n_shared else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False, **options) if shared_gate else None
        self.last_routing = None

    def scores(self, x):
        """Every expert's score for each token, before the choice: softmax or sigmoid of the router's
        logits (without the correction bias), (..., T, d_model) -> (..., T, n_experts), in float32 for
        half-precision inputs. For a picture of what the router sees."""
        check_input(self, "x", x, self.router.in_features, weight=self.router.weight)
        logits = self.router(x)  # (..., T, n_experts)
        return expert_scores(logits.float() if logits.dtype in HALF else logits, self.options["scoring"])

    def route(self, x):
        """weights (..., T, top_k), as the experts' outputs are multiplied (routed_scale included), and
        experts (..., T, top_k) int64, largest choice first, for x (..., T, d_model)."""
        check_input(self, "x", x, self.router.in_features, weight=self.router.weight)
        o = self.options
        logits = self.router(x)  # (..., T, n_experts)
        work = logits.float() if logits.dtype in HALF else logits
        bias = self.correction_bias
        if o["n_groups"] == 1 and o["top_groups"] == 1:
            weights, experts = route_tokens(work, o["top_k"], scoring=o["scoring"], normalize=o["normalize"], bias=bias)
        else:
            weights, experts = route_tokens_in_groups(work, o["top_k"], n_groups=o["n_groups"], bias=bias,
                                                      top_groups=o["top_groups"], scoring=o["scoring"],
                                                      normalize=o["normalize"])
        return (weights * o["routed_scale"]).to(x.dtype), experts

    def expert(self, e, x):
        """Expert e on its tokens: (n, d_model) -> (n, d_model)."""
        gate = F.linear(x, self.W_gate[e], of_expert(self.b_gate, e))  # (n, d_expert)
        up = F.linear(x, self.W_up[e], of_expert(self.b_up, e))  # (n, d_expert)
        if self.options["expert"] == "swiglu":
            hidden = F.silu(gate) * up
        else:
            hidden = clamped_swiglu(gate, up, self.options["swiglu_limit"], self.options["swiglu_alpha"])
        return F.linear(hidden, self.W_down[e], of_expert(self.b_down, e))  # (n, d_model)

    def forward(self, x):
        weights, experts = self.route(x)  # (..., T, top_k) each
        self.last_routing = (weights.detach(), experts)
        top_k = experts.shape[-1]
        tokens = x.reshape(-1, x.shape[-1])  # (N, d_model)
        weights, experts = weights.reshape(-1, top_k), experts.reshape(-1, top_k)  # (N, top_k)
        if x.device.type == "meta":  # no values to route by: every expert sees every token, for the shapes
            out = sum(self.expert(e, tokens) * weights[:, :1] for e in range(self.options["n_experts"]))
        elif tokens.shape[0] == 1:  # one token (a decoding step): its top_k experts, one after the other
            out = sum(weights[:, i, None] * self.expert(e, tokens) for i, e in enumerate(experts[0].tolist()))
        else:
            out = torch.zeros_like(tokens)  # (N, d_model)
            for e in experts.unique().tolist():
                rows, slots = torch.nonzero(experts == e, as_tuple=True)  # its tokens, and its place in their top_k
                out.index_add_(0, rows, weights[rows, slots, None] * self.expert(e, tokens[rows]))
        out = out.reshape(x.shape)  # (..., T, d_model)
        if self.shared is not None:
            common = self.shared(x)  # (..., T, d_model)
            if self.shared_gate is not None:
                common = torch.sigmoid(self.shared_gate(x)) * common
            out = out + common
        return out

    def numpy_params(self):
        """The arguments of `mha.numpy.mixture_of_experts` (row-vector convention) but X."""
        o, numpy = self.options, (lambda t: None if t is None else t.detach().cpu().numpy())
        params = dict(W_router=linear_weight(self.router), b_router=linear_bias(self.router),
                      correction_bias=numpy(self.correction_bias), W_gate=numpy(self.W_gate.transpose(1, 2)),
                      W_up=numpy(self.W_up.transpose(1, 2)), W_down=numpy(self.W_down.transpose(1, 2)),
                      b_gate=numpy(self.b_gate), b_up=numpy(self.b_up), b_down=numpy(self.b_down),
                      shared=None if self.shared is None else self.shared.numpy_params(),
                      W_shared_gate=None if self.shared_gate is None else linear_weight(self.shared_gate))
        routing = ("top_k", "scoring", "normalize", "routed_scale", "n_groups", "top_groups", "expert",
                   "swiglu_limit", "swiglu_alpha")
        return {**params, **{name: o[name] for name in routing}}

    @classmethod
    def from_hf(cls, mlp):
        """A copy of a transformers MoE block (DeepseekV3MoE, DeepseekV32MoE, Qwen3MoeSparseMoeBlock,
        Qwen3NextSparseMoeBlock, GptOssMLP): its arguments read and its tensors copied in `mha.torch.hf.experts`."""
        weight = hf_experts.router_of(mlp).weight
        ours = cls(hf_experts.model_width(mlp), **hf_experts.experts_arguments(mlp), device=weight.device,
                   dtype=weight.dtype)
        hf_experts.copy_experts(ours, mlp)
        return ours.train(mlp.training)

    def extra_repr(self):
        o = self.options
        return (f"{self.router.in_features}, n_experts={o['n_experts']}, top_k={o['top_k']}, "
                f"d_expert={o['d_expert']}, scoring={o['scoring']!r}, expert={o['expert']!r}")
