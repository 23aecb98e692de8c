"""Mixture of experts (chapter 17): routing by hand, the two faces equal, and each family's MoE block.

transformers' blocks are built from tiny configs with eager experts (`experts_implementation="eager"`;
the default grouped_mm computes the same within 2e-7), weights drawn at std 0.5 so that several
experts are active and every term matters, DeepSeek's e_score_correction_bias (a buffer) given values,
and gpt-oss's swiglu_limit lowered to 0.5 so that its clamp bites.
"""

import numpy as np
import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV32Config, GptOssConfig, LlamaConfig, Qwen3MoeConfig, Qwen3NextConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32MoE
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
from transformers.models.llama.modeling_llama import LlamaMLP
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

import mha.numpy as mnp
import mha.torch as mt
from mha.torch.hf import experts as hf_experts

D = 16
SIZES = dict(hidden_size=D, num_experts_per_tok=3, experts_implementation="eager")
DEEPSEEK = dict(moe_intermediate_size=8, n_routed_experts=8, n_group=4, topk_group=2, n_shared_experts=2,
                routed_scaling_factor=2.5, norm_topk_prob=True, **SIZES)
FAMILIES = {
    "deepseek_v3": (DeepseekV3MoE, DeepseekV3Config(**DEEPSEEK)),
    "deepseek_v32": (DeepseekV32MoE, DeepseekV32Config(**DEEPSEEK)),
    "qwen3_moe": (Qwen3MoeSparseMoeBlock, Qwen3MoeConfig(moe_intermediate_size=8, num_experts=8, norm_topk_prob=True,
                                                         **SIZES)),
    "qwen3_moe_unnormalised": (Qwen3MoeSparseMoeBlock, Qwen3MoeConfig(moe_intermediate_size=8, num_experts=8,
                                                                      norm_topk_prob=False, **SIZES)),
    "qwen3_next": (Qwen3NextSparseMoeBlock, Qwen3NextConfig(moe_intermediate_size=8, num_experts=8, norm_topk_prob=True,
                                                            shared_expert_intermediate_size=12, **SIZES)),
    "gpt_oss": (GptOssMLP, GptOssConfig(intermediate_size=8, num_local_experts=8, swiglu_limit=0.5, **SIZES)),
}


def block_of(family, seed=0):
    """transformers' MoE block of the family, its weights drawn at std 0.5 (DeepSeek's bias at 0.3)."""
    cls, config = FAMILIES[family]
    torch.manual_seed(seed)
    block = cls(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
        if family.startswith("deepseek"):
            block.gate.e_score_correction_bias.normal_(0, 0.3)
    return block.eval()


def their_output(block, x):
    out = block(x)
    return out[0] if isinstance(out, tuple) else out  # GptOssMLP returns (output, router scores)


def tokens(seed=1, shape=(2, 6), dtype=torch.float32):
    return torch.randn(*shape, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def choice_margins(ours, x):
    """The smallest gap, over tokens, between the last chosen and the first unchosen choice score
    (and, with groups, between the last chosen and the first unchosen group): choices clear of ties."""
    o = ours.options
    logits = ours.router(x).double()
    if o["expert"] == "clamped_swiglu":
        choice = logits
    else:
        choice = mt.experts.expert_scores(logits, o["scoring"])
    if ours.correction_bias is not None:
        choice = choice + ours.correction_bias.double()
    gaps = []
    if o["n_groups"] > 1:
        groups = choice.unflatten(-1, (o["n_groups"], -1)).topk(2, dim=-1).values.sum(-1)
        ranked = groups.sort(dim=-1, descending=True).values
        gaps.append(ranked[..., o["top_groups"] - 1] - ranked[..., o["top_groups"]])
        allowed = mt.group_limited_experts(choice, o["n_groups"], o["top_groups"])
        choice = choice.masked_fill(~allowed, -1e9)
    ranked = choice.sort(dim=-1, descending=True).values
    gaps.append(ranked[..., o["top_k"] - 1] - ranked[..., o["top_k"]])
    return min(g.min().item() for g in gaps)


# Routing by hand ---------------------------------------------------------------------------------------


def test_route_tokens_picks_the_top_scores_and_keeps_their_softmax_weights():
    logits = np.array([2.0, 0.5, 1.0, -1.0])
    probs = np.exp(logits) / np.exp(logits).sum()
    weights, experts = mnp.route_tokens(logits, 2)
    assert experts.tolist() == [0, 2] and experts.dtype == np.int64
    np.testing.assert_allclose(weights, probs[[0, 2]], rtol=1e-15)
    weights, _ = mnp.route_tokens(logits, 2, normalize=True)
    np.testing.assert_allclose(weights, probs[[0, 2]] / probs[[0, 2]].sum(), rtol=1e-15)


def test_ties_go_to_the_lower_index_and_the_order_is_the_choice():
    assert mnp.route_tokens([1.0, 3.0, 3.0, 0.0], 2)[1].tolist() == [1, 2]
    assert mnp.route_tokens([0.0, 0.0, 0.0, 0.0], 3)[1].tolist() == [0, 1, 2]
    assert mt.route_tokens(torch.zeros(4), 3)[1].tolist() == [0, 1, 2]
    assert mt.route_tokens(torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0]), 3)[1].tolist() == [1, 2, 4]
    assert mnp.route_tokens([1.0, 3.0, 3.0, 0.0, 3.0], 3)[1].tolist() == [1, 2, 4]
    assert mnp.route_tokens([0.0, 5.0, 1.0, 3.0], 3)[1].tolist() == [1, 3, 2]


def test_the_bias_moves_the_choice_and_not_the_weights():
    logits = np.array([1.0, 0.0, 0.5, -0.5])
    bias = np.array([0.0, 0.0, 0.0, 0.9])  # sigmoid(-0.5) + 0.9 = 1.28 > sigmoid(1) = 0.73
    weights, experts = mnp.route_tokens(logits, 2, scoring="sigmoid", bias=bias)
    assert experts.tolist() == [3, 0]
    np.testing.assert_allclose(weights, 1 / (1 + np.exp(-logits[[3, 0]])), rtol=1e-15)


def test_group_limited_routing_by_hand():
    # 3 groups of 2; group scores (sum of both): 1.1, 1.0, 0.3 -> the best 2 groups hold experts 0-3
    choice = np.array([0.9, 0.2, 0.5, 0.5, 0.3, 0.0])
    assert mnp.group_limited_experts(choice, 3, 2).tolist() == [True, True, True, True, False, False]
    assert mt.group_limited_experts(torch.tensor(choice), 3, 2).tolist() == [True, True, True, True, False, False]
    # alone, expert 4 (0.3) beats expert 1 (0.2); within the groups, it is out
    logits = np.log(choice[:5] / (1 - choice[:5])).tolist() + [-50.0]  # sigmoid(logits) = choice (0 for the last)
    _, experts = mnp.route_tokens_in_groups(logits, 4, n_groups=3, top_groups=2)
    assert experts.tolist() == [0, 2, 3, 1]


def test_load_and_the_balancing_bias_by_hand():
    experts = np.array([[0, 1], [0, 2], [0, 1]])  # loads 3, 2, 1, 0: mean 1.5
    assert mnp.expert_load(experts, 4).tolist() == [3, 2, 1, 0]
    assert mt.expert_load(torch.tensor(experts), 4).tolist() == [3, 2, 1, 0]
    bias = np.array([0.1, 0.0, 0.0, -0.1])
    np.testing.assert_allclose(mnp.balance_correction_bias(bias, experts, 0.01), [0.09, -0.01, 0.01, -0.09])
    np.testing.assert_allclose(mt.balance_correction_bias(torch.tensor(bias), torch.tensor(experts), 0.01).numpy(),
                               [0.09, -0.01, 0.01, -0.09])
    with pytest.raises(ValueError, match=r"experts must lie in \[0, 2\)"):
        mnp.expert_load(experts, 2)
    with pytest.raises(TypeError, match="integer expert indices"):
        mt.expert_load(torch.zeros(3), 2)

def test_the_bias_updates_balance_a_lopsided_router():
    """DeepSeek-V3's claim, on a router that favours the later experts: 50 steps of the sign rule bring the
    busiest expert from 2.4 times the mean load to within 10% of it (measured: 2.40 -> 1.07)."""
    logits = np.random.default_rng(0).normal(size=(512, 8)) + np.linspace(-1, 1, 8)
    bias, loads = np.zeros(8), []
    for _ in range(50):
        _, experts = mnp.route_tokens(logits, 2, scoring="sigmoid", normalize=True, bias=bias)
        loads.append(mnp.expert_load(experts, 8))
        bias = mnp.balance_correction_bias(bias, experts, 0.01)
    imbalance = [load.max() / load.mean() for load in loads]
    assert imbalance[0] > 2.3 and imbalance[-1] < 1.1

@pytest.mark.parametrize("options", [
    dict(), dict(normalize=True), dict(scoring="sigmoid"), dict(scoring="sigmoid", normalize=True, bias="bias"),
    dict(n_groups=4, top_groups=2, bias="bias"), dict(n_groups=2, top_groups=1, scoring="softmax", normalize=False),
])
def test_the_torch_face_routes_as_the_numpy_face(options):
    logits = np.random.default_rng(3).normal(size=(2, 5, 8))
    if options.get("bias") == "bias":
        options = {**options, "bias": np.random.default_rng(4).normal(scale=0.3, size=8)}
    grouped = "n_groups" in options
    route_np = mnp.route_tokens_in_groups if grouped else mnp.route_tokens
    route_pt = mt.route_tokens_in_groups if grouped else mt.route_tokens
    torch_options = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in options.items()}
    weights, experts = route_np(logits, 3, **options)
    weights_pt, experts_pt = route_pt(torch.tensor(logits), 3, **torch_options)
    assert np.array_equal(experts, experts_pt.numpy())
    np.testing.assert_allclose(weights, weights_pt.numpy(), rtol=1e-14)


def test_float32_stays_float32():
    logits = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    assert mnp.route_tokens(logits, 2, scoring="sigmoid", bias=np.zeros(8))[0].dtype == np.float32
    assert mt.route_tokens(torch.tensor(logits), 2, bias=torch.zeros(8))[0].dtype == torch.float32
    ours = mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8, n_shared=1, shared_gate=True)
    out = mnp.mixture_of_experts(tokens().numpy(), **ours.numpy_params())
    assert out.dtype == np.float32 and ours(tokens()).dtype == torch.float32


@pytest.mark.parametrize("call,error,words", [
    (lambda: mnp.route_tokens(np.zeros(4), 5), ValueError, "top_k=5 is more than the 4 experts"),
    (lambda: mnp.route_tokens(np.zeros(4), 2, scoring="relu"), ValueError, "scoring must be"),
    (lambda: mnp.route_tokens(np.zeros(4), 2, normalize=1), TypeError, "normalize must be True or False"),
    (lambda: mnp.route_tokens(np.zeros(4), 2, bias=np.zeros(3)), ValueError, r"bias must have shape \(4,\)"),
    (lambda: mt.route_tokens(torch.zeros(4), 2, bias=torch.zeros(5)), ValueError, r"bias must have shape \(4,\)"),
    (lambda: mt.route_tokens(torch.zeros(4, dtype=torch.long), 2), TypeError, "floating-point"),
    (lambda: mnp.group_limited_experts(np.zeros(6), 4, 2), ValueError, "do not split into n_groups=4"),
    (lambda: mnp.group_limited_experts(np.zeros(4), 4, 2), ValueError, "two best experts"),
    (lambda: mt.group_limited_experts(torch.zeros(8), 4, 5), ValueError, "top_groups=5 is more than n_groups=4"),
    (lambda: mnp.route_tokens_in_groups(np.zeros(8), 5, n_groups=4, top_groups=2), ValueError, "top_k=5"),
    (lambda: mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8, shared_gate=True), ValueError, "n_shared=0"),
    (lambda: mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8, expert="clamped_swiglu"), ValueError,
     "needs swiglu_limit and swiglu_alpha"),
    (lambda: mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8, swiglu_limit=7.0), ValueError,
     'belong to expert="clamped_swiglu"'),
    (lambda: mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8)(torch.zeros(3, D + 1)), ValueError, "width"),
    (lambda: mnp.mixture_of_experts(np.zeros((3, D)), np.zeros((D, 4)), np.zeros((4, D, 8)), np.zeros((3, D, 8)),
                                    np.zeros((4, 8, D)), top_k=2), ValueError, r"W_up must hold one matrix per expert"),
])
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


# Each family's MoE block ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_block_is_computed_in_float32(family):
    block = block_of(family)
    ours = mt.MixtureOfExperts.from_hf(block)
    x = tokens()
    assert choice_margins(ours, x) > 1e-4, "the routing must be clear of ties (float32 rounds at 1e-7)"
    with torch.no_grad():
        theirs, mine = their_output(block, x), ours(x)
    assert mine.dtype == torch.float32
    assert (mine - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    with torch.no_grad():  # one token at a time, as in decoding (its own path)
        one = torch.stack([torch.cat([ours(x[b:b + 1, t:t + 1]) for t in range(x.shape[1])], dim=1)[0]
                           for b in range(x.shape[0])])
    assert (one - theirs).abs().max() <= 1e-5 * theirs.abs().max()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_router_chooses_as_transformers_does(family):
    block = block_of(family)
    ours = mt.MixtureOfExperts.from_hf(block)
    x = tokens()
    router = hf_experts.router_of(block)
    with torch.no_grad():
        _, their_weights, their_experts = router(x.reshape(-1, D))
        weights, experts = ours.route(x)
        ours(x)
    order, their_order = experts.reshape(-1, 3).argsort(-1), their_experts.argsort(-1)
    mine = experts.reshape(-1, 3).gather(-1, order)
    assert torch.equal(mine, their_experts.gather(-1, their_order))
    torch.testing.assert_close(weights.reshape(-1, 3).gather(-1, order), their_weights.gather(-1, their_order),
                               rtol=1e-6, atol=1e-7)
    assert torch.equal(ours.last_routing[1], experts) and len(set(experts.flatten().tolist())) >= 5
    assert hf_experts.is_experts_block(block)
    with torch.no_grad():
        scores = ours.scores(x)  # every expert's score: the chosen ones carry the weights (before normalising)
    if ours.options["scoring"] == "sigmoid":
        chosen = scores.gather(-1, experts)
        torch.testing.assert_close(weights, 2.5 * chosen / chosen.sum(-1, keepdim=True))


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_next", "gpt_oss"])
def test_the_torch_face_is_the_numpy_face(family):
    ours = mt.MixtureOfExperts.from_hf(block_of(family)).double()
    x = tokens(shape=(2, 3, 5), dtype=torch.float64)  # two leading batch axes
    with torch.no_grad():
        mine = ours(x)
    expected = mnp.mixture_of_experts(x.numpy(), **ours.numpy_params())
    np.testing.assert_allclose(mine.numpy(), expected, rtol=0, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe", "gpt_oss"])
def test_float64_follows_transformers_within_its_float32_router(family):
    """DeepSeek's router computes in float32 and Qwen's softmax too, whatever the input: in float64 the
    outputs agree to float32's rounding of the routing weights; gpt-oss computes all in float64."""
    block = block_of(family).double()
    ours = mt.MixtureOfExperts.from_hf(block)
    x = tokens(dtype=torch.float64)
    with torch.no_grad():
        theirs, mine = their_output(block, x), ours(x)
    assert mine.dtype == torch.float64
    tolerance = 1e-13 if family == "gpt_oss" else 1e-6
    assert (mine - theirs).abs().max() <= tolerance * theirs.abs().max()


def test_deepseek_bias_and_groups_change_the_choice():
    """The test inputs exercise both: without the bias, or without the groups, some token chooses otherwise."""
    ours = mt.MixtureOfExperts.from_hf(block_of("deepseek_v3"))
    x = tokens()
    with torch.no_grad():
        logits = ours.router(x)
        _, experts = ours.route(x)
        _, unbiased = mt.route_tokens_in_groups(logits, 3, n_groups=4, top_groups=2)
        _, ungrouped = mt.route_tokens(logits, 3, scoring="sigmoid", bias=ours.correction_bias)
    same = (lambda a, b: torch.equal(a.sort(-1).values, b.sort(-1).values))
    assert not same(experts, unbiased) and not same(experts, ungrouped)


def test_gpt_oss_clamp_bites():
    """With swiglu_limit 0.5, some gates and ups of the routed tokens pass the limit, and the same
    weights with no effective limit give another output."""
    block = block_of("gpt_oss")
    ours = mt.MixtureOfExperts.from_hf(block)
    x = tokens()
    with torch.no_grad():
        _, experts = ours.route(x)
        e = experts[0, 0, 0].item()
        gate = torch.nn.functional.linear(x[0, 0], ours.W_gate[e], ours.b_gate[e])
        up = torch.nn.functional.linear(x[0, 0], ours.W_up[e], ours.b_up[e])
        assert (gate > 0.5).any() and (up.abs() > 0.5).any()
        ours.options["swiglu_limit"] = 1e9
        unclamped = ours(x)
    assert (unclamped - their_output(block, x)).abs().max() > 1e-2


def test_the_gradient_is_the_derivative():
    ours = mt.MixtureOfExperts(4, n_experts=4, top_k=2, d_expert=3, scoring="sigmoid", n_groups=2, top_groups=1,
                               correction_bias=True, n_shared=1, routed_scale=1.5, dtype=torch.float64)
    x = torch.randn(1, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    assert choice_margins(ours, x.detach()) > 1e-4
    assert torch.autograd.gradcheck(ours, (x,))


def test_refusals_name_the_block_and_the_feature():
    dense = LlamaMLP(LlamaConfig(hidden_size=D, intermediate_size=8, num_attention_heads=2))
    assert not hf_experts.is_experts_block(dense)
    with pytest.raises(ValueError, match="cannot copy a mixture of experts from LlamaMLP"):
        hf_experts.experts_arguments(dense)
    gelu = DeepseekV3MoE(DeepseekV3Config(**{**DEEPSEEK, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="activation 'gelu' of DeepseekV3MoE"):
        hf_experts.experts_arguments(gelu)
    block = block_of("qwen3_moe")
    wrong = mt.MixtureOfExperts(D, **{**hf_experts.experts_arguments(block), "top_k": 2})
    with pytest.raises(ValueError, match=r"top_k=2 \(theirs 3\)"):
        hf_experts.copy_experts(wrong, block)


@pytest.mark.parametrize("options", [
    dict(), dict(scoring="sigmoid", n_groups=2, top_groups=1, correction_bias=True, n_shared=1, shared_gate=True),
    dict(expert="clamped_swiglu", swiglu_limit=7.0, swiglu_alpha=1.702, expert_bias=True, router_bias=True),
])
def test_meta_tensors_and_bfloat16(options):
    """On the meta device (shapes only) it makes nothing elsewhere; in bfloat16 it routes in float32 and
    stays within bfloat16's rounding of the float32 layer."""
    ours = mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8, device="meta", **options)
    assert ours(torch.empty(2, 5, D, device="meta")).device.type == "meta"
    torch.manual_seed(0)
    ours = mt.MixtureOfExperts(D, n_experts=4, top_k=2, d_expert=8, **options)
    x = tokens(shape=(2, 5))
    half = ours.to(torch.bfloat16)(x.to(torch.bfloat16))
    full = ours.float()(x.to(torch.bfloat16).float())
    assert half.dtype == torch.bfloat16 and (half.float() - full).abs().max() <= 2e-2 * full.abs().max()
