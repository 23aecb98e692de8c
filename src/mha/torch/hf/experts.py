"""transformers' mixture-of-experts blocks read into `mha.torch.MixtureOfExperts`, side by side.

Where each family keeps its parts (E experts, width f each, d = d_model):
- DeepseekV3MoE, DeepseekV32MoE: router gate.weight (E, d) and gate.e_score_correction_bias (a buffer,
  on the choice only); sigmoid scores, top_k within the topk_group best of n_group groups, normalised
  (norm_topk_prob), times routed_scaling_factor; experts.gate_up_proj (E, 2f, d) with gate above up,
  experts.down_proj (E, d, f); shared_experts: one gated MLP of width n_shared_experts * f.
- Qwen3MoeSparseMoeBlock: router gate.weight; softmax, top_k, normalised when norm_topk_prob;
  experts as DeepSeek's; no shared expert.
- Qwen3NextSparseMoeBlock: as Qwen3-MoE, plus shared_expert (a gated MLP) scaled by
  sigmoid(shared_expert_gate(x)).
- GptOssMLP: router.weight and router.bias; softmax of the top_k logits (the normalised softmax);
  experts.gate_up_proj (E, d, 2f) with gate and up interleaved (columns 0, 2, 4, ... and 1, 3, 5, ...),
  gate_up_proj_bias (E, 2f), down_proj (E, f, d), down_proj_bias (E, d); the clamped SwiGLU.

What nothing here computes is refused by name: another block, an activation other than SiLU.
transformers runs its experts through a `grouped_mm` implementation by default (config
`experts_implementation`); every implementation computes the same formula, which the copy computes.
"""

import torch

DEEPSEEK = ("DeepseekV3MoE", "DeepseekV32MoE")
QWEN = ("Qwen3MoeSparseMoeBlock", "Qwen3NextSparseMoeBlock")
GPT_OSS = ("GptOssMLP",)
KNOWN = DEEPSEEK + QWEN + GPT_OSS
SILU = ("silu", "swish")


def is_experts_block(mlp):
    """Whether `mlp` is one of the mixture-of-experts blocks read here (a decoder layer's dense MLP is not)."""
    return type(mlp).__name__ in KNOWN


def kind_of(mlp):
    """The block's class name, or a ValueError naming the blocks that are read."""
    kind = type(mlp).__name__
    if kind not in KNOWN:
        raise ValueError(f"cannot copy a mixture of experts from {kind}: the blocks read here are {list(KNOWN)}")
    return kind


def router_of(mlp):
    """The block's router: an object with weight (n_experts, d_model) (and gpt-oss's bias)."""
    return mlp.router if kind_of(mlp) in GPT_OSS else mlp.gate


def model_width(mlp):
    """d_model of the block: the router's input width."""
    return router_of(mlp).weight.shape[1]


def check_silu(mlp, config):
    act = getattr(config, "hidden_act", None)
    if act not in SILU:
        raise ValueError(f"cannot compute the activation {act!r} of {type(mlp).__name__}'s experts "
                         f"(model_type={getattr(config, 'model_type', None)!r}): only SiLU (SwiGLU) is computed here")


def deepseek_arguments(mlp):
    gate, config = mlp.gate, mlp.config
    check_silu(mlp, config)
    n_shared = int(config.n_shared_experts or 0)
    return dict(n_experts=gate.num_experts, top_k=gate.top_k, d_expert=mlp.experts.intermediate_dim,
                scoring="sigmoid", normalize=bool(gate.norm_topk_prob),
                routed_scale=float(gate.routed_scaling_factor), n_groups=gate.num_group, top_groups=gate.topk_group,
                correction_bias=True, router_bias=False, n_shared=n_shared,
                d_shared=mlp.shared_experts.intermediate_size if n_shared else None, shared_gate=False,
                expert="swiglu", expert_bias=False, swiglu_limit=None, swiglu_alpha=None)


def qwen_arguments(mlp):
    gate, config = mlp.gate, mlp.experts.config
    check_silu(mlp, config)
    shared = getattr(mlp, "shared_expert", None)
    return dict(n_experts=gate.num_experts, top_k=gate.top_k, d_expert=mlp.experts.intermediate_dim,
                scoring="softmax", normalize=bool(gate.norm_topk_prob), routed_scale=1.0, n_groups=1, top_groups=1,
                correction_bias=False, router_bias=False, n_shared=0 if shared is None else 1,
                d_shared=None if shared is None else shared.intermediate_size, shared_gate=shared is not None,
                expert="swiglu", expert_bias=False, swiglu_limit=None, swiglu_alpha=None)


def gpt_oss_arguments(mlp):
    router, experts = mlp.router, mlp.experts
    return dict(n_experts=router.num_experts, top_k=router.top_k, d_expert=experts.intermediate_size,
                scoring="softmax", normalize=True, routed_scale=1.0, n_groups=1, top_groups=1,
                correction_bias=False, router_bias=True, n_shared=0, d_shared=None, shared_gate=False,
                expert="clamped_swiglu", expert_bias=True, swiglu_limit=float(experts.limit),
                swiglu_alpha=float(experts.alpha))


def experts_arguments(mlp):
    """The keyword arguments of `MixtureOfExperts` but d_model (`model_width`), read from a transformers
    MoE block: DeepseekV3MoE, DeepseekV32MoE, Qwen3MoeSparseMoeBlock, Qwen3NextSparseMoeBlock or GptOssMLP."""
    kind = kind_of(mlp)
    if kind in DEEPSEEK:
        return deepseek_arguments(mlp)
    return qwen_arguments(mlp) if kind in QWEN else gpt_oss_arguments(mlp)


def check_fits(ours, mlp):
    """ours must have been built with the block's arguments: a ValueError naming each that differs."""
    theirs = experts_arguments(mlp)
    differ = [f"{name}={ours.options.get(name)!r} (theirs {value!r})"
              for name, value in theirs.items() if ours.options.get(name) != value]
    if ours.router.in_features != model_width(mlp):
        differ.append(f"d_model={ours.router.in_features} (theirs {model_width(mlp)})")
    if differ:
        raise ValueError(f"this MixtureOfExperts does not fit {type(mlp).__name__}: {', '.join(differ)}; "
                         f"build it with experts_arguments(mlp)")


@torch.no_grad()
def copy_experts(ours, mlp):
    """A transformers MoE block's tensors into a MixtureOfExperts built with `experts_arguments(mlp)`."""
    check_fits(ours, mlp)
    kind, experts = kind_of(mlp), mlp.experts
    ours.router.weight.copy_(router_of(mlp).weight)
    if kind in GPT_OSS:
        ours.router.bias.copy_(mlp.router.bias)
        ours.W_gate.copy_(experts.gate_up_proj[..., 0::2].transpose(1, 2))  # (E, d, 2f) interleaved -> (E, f, d)
        ours.W_up.copy_(experts.gate_up_proj[..., 1::2].transpose(1, 2))
        ours.b_gate.copy_(experts.gate_up_proj_bias[..., 0::2])
        ours.b_up.copy_(experts.gate_up_proj_bias[..., 1::2])
        ours.W_down.copy_(experts.down_proj.transpose(1, 2))  # (E, f, d) -> (E, d, f)
        ours.b_down.copy_(experts.down_proj_bias)
        return ours
    gate, up = experts.gate_up_proj.chunk(2, dim=1)  # (E, 2f, d) -> two (E, f, d)
    ours.W_gate.copy_(gate)
    ours.W_up.copy_(up)
    ours.W_down.copy_(experts.down_proj)  # (E, d, f)
    if kind in DEEPSEEK:
        ours.correction_bias.copy_(mlp.gate.e_score_correction_bias)
        shared = mlp.shared_experts if ours.shared is not None else None
    else:
        shared = getattr(mlp, "shared_expert", None)
        if shared is not None:
            ours.shared_gate.weight.copy_(mlp.shared_expert_gate.weight)
    if shared is not None:
        for mine, theirs in ((ours.shared.W_gate, shared.gate_proj), (ours.shared.W_up, shared.up_proj),
                             (ours.shared.W_down, shared.down_proj)):
            mine.weight.copy_(theirs.weight)
    return ours
