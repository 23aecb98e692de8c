"""Chapter 13's sentences about random draws, asserted beyond the draw shown (CONTRIBUTING.md, "Claims hold
beyond the case tried").

The chapter draws random inputs and weights to prove each part equal to PyTorch's or Hugging Face's, and to
show what a part keeps or changes. Every assert of the chapter, and every sentence it states about such a
draw, is checked here on 20 draws:

- RMSNorm ignores a scaling of its input and not a shift; ours equals torch.nn.RMSNorm, LlamaRMSNorm and
  Gemma2RMSNorm; with silent sublayers a pre-norm block is the identity and a post-norm block is not;
- SwiGLU and GeGLU equal Llama's and Gemma's MLPs; soft-capped attention equals Gemma 2's;
- QK-norm: growing W_Q and W_K makes plain attention one-hot, changes little under a cap of 50 while most
  scores are below it, spreads the weight again once most are beyond it, and changes nothing with QK-norm;
- the Experiment on growing scores (ex-ch13-growing-scores): its asserts and sentences on every draw;
- whole models: a GPT-2 and a Llama copied with from_transformers give our logits and greedy tokens, the NumPy
  face agrees in float64, and every family of the table gives our logits, on 5 draws each.
"""

import types

import numpy as np
import pytest
import torch
import transformers
from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP, Gemma2RMSNorm, eager_attention_forward
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

import mha.numpy as mnp
import mha.torch as mt

DRAWS = range(20)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gap(a, b):
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


# RMSNorm and where the norms sit --------------------------------------------------------------------------


def test_rms_norm_ignores_a_scaling_and_not_a_shift_and_layer_norm_ignores_both_on_every_draw():
    for seed in DRAWS:
        rng = np.random.default_rng(seed)
        x, gamma = rng.normal(size=(3, 8)) + 2.0, 1 + 0.2 * rng.normal(size=8)
        rms, layer = (lambda v: mnp.rms_norm(v, gamma)), (lambda v: mnp.layer_norm(v, gamma, None, eps=1e-6))
        assert gap(rms(10 * x), rms(x)) < 1e-5 and gap(layer(10 * x), layer(x)) < 1e-5, seed
        assert gap(rms(x + 5), rms(x)) > 0.1 and gap(layer(x + 5), layer(x)) < 1e-5, seed


def test_our_rms_norms_equal_pytorchs_llamas_and_gemmas_on_every_draw():
    for seed in DRAWS:
        torch.manual_seed(seed)
        x = 3 * torch.randn(2, 5, 16) + 1
        weight = 1 + 0.3 * torch.randn(16)
        ours, reference, llama = mt.RMSNorm(16, eps=1e-6), torch.nn.RMSNorm(16, eps=1e-6), LlamaRMSNorm(16, eps=1e-6)
        gemma_ours, gemma = mt.RMSNorm(16, eps=1e-6, unit_offset=True), Gemma2RMSNorm(16, eps=1e-6)
        wide = mt.RMSNorm(16, eps=1e-6, dtype=torch.float64)
        with torch.no_grad():
            for module in (ours, reference, llama, wide):
                module.weight.copy_(weight)
            for module in (gemma_ours, gemma):
                module.weight.copy_(weight - 1)
            expected = ours(x)
            assert max(gap(expected, reference(x)), gap(expected, llama(x)), gap(gemma_ours(x), gemma(x)),
                       gap(gemma(x), expected)) < 1e-6, seed
            assert gap(mnp.rms_norm(x.double().numpy(), **wide.numpy_params()), wide(x.double())) < 1e-12, seed


def test_a_pre_norm_block_with_silent_sublayers_is_the_identity_and_a_post_norm_block_is_not():
    for seed in DRAWS:
        torch.manual_seed(seed)
        block = mt.EncoderBlock(16, 4, 32, dtype=torch.float64).numpy_params()
        silent = dict(block, W_o=np.zeros_like(block["W_o"]), b_o=np.zeros(16), W_2=np.zeros_like(block["W_2"]),
                      b_2=np.zeros(16))
        X = 2 + 3 * np.random.default_rng(seed).normal(size=(5, 16))
        pre, _ = mnp.encoder_block(X, 4, norm_first=True, **silent)
        post, _ = mnp.encoder_block(X, 4, norm_first=False, **silent)
        assert np.array_equal(pre, X) and gap(post, X) > 1, seed


# Gated feed-forward networks and soft-capped attention ------------------------------------------------------


def test_swiglu_and_geglu_equal_llamas_and_gemmas_mlps_on_every_draw():
    for seed in DRAWS:
        torch.manual_seed(seed)
        x = 3 * torch.randn(2, 5, 16) + 1
        llama = LlamaMLP(transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=2))
        gemma = Gemma2MLP(transformers.Gemma2Config(hidden_size=16, intermediate_size=40, num_attention_heads=2,
                                                    num_key_value_heads=1, head_dim=8))
        with torch.no_grad():
            for p in (*llama.parameters(), *gemma.parameters()):
                p.normal_(0.0, 0.5)
            for theirs, ours in ((llama, mt.SwiGLU.from_hf(llama)), (gemma, mt.GeGLU.from_hf(gemma))):
                expected = theirs(x)
                assert gap(ours(x), expected) / expected.abs().max().item() < 1e-6, seed
                ours = ours.double()
                assert gap(mnp.gated_feed_forward(x.double().numpy(), **ours.numpy_params()), ours(x.double())) < 1e-12


def test_attention_with_soft_capped_scores_equals_gemma_2s_on_every_draw():
    B, h, T, d_head, scale, cap = 2, 4, 6, 8, 256 ** -0.5, 50.0
    causal = mnp.causal_mask(T)
    additive = torch.zeros(T, T, dtype=torch.float64).masked_fill(~torch.from_numpy(causal), float("-inf"))
    layer = types.SimpleNamespace(num_key_value_groups=1, training=False)
    for seed in DRAWS:
        gen = torch.Generator().manual_seed(seed)
        q, k = (20 * torch.randn(B, h, T, d_head, generator=gen, dtype=torch.float64) for _ in range(2))
        v = torch.randn(B, h, T, d_head, generator=gen, dtype=torch.float64)
        out, weights = mnp.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), causal, scale=scale,
                                                        logit_cap=cap)
        _, uncapped = mnp.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), causal, scale=scale)
        their_out, their_weights = eager_attention_forward(layer, q, k, v, additive[None, None], scaling=scale,
                                                           softcap=cap)
        assert gap(weights, their_weights) < 1e-6 and gap(out, their_out.transpose(1, 2)) < 1e-5, seed
        assert gap(uncapped, their_weights) > 0.1, seed


# QK-norm, and the Experiment on growing scores -----------------------------------------------------------


GROWTHS = np.arange(1, 33)


def growing_layer(seed, T=16, d=32, h=4, d_head=8):
    """scores(growth, qk_norm) -> (h, T, T) of the chapter's layer drawn from `seed`, and the bound of QK-norm."""
    draw = np.random.default_rng(seed)
    X = draw.normal(size=(T, d))
    W_q, W_k = draw.normal(size=(2, d, h * d_head)) / np.sqrt(d)
    gamma_q, gamma_k = 1 + 0.1 * draw.normal(size=(2, d_head))

    def scores(growth, qk_norm):
        q, k = mnp.split_heads(X @ (growth * W_q), h), mnp.split_heads(X @ (growth * W_k), h)
        if qk_norm:
            q, k = mnp.rms_norm(q, gamma_q), mnp.rms_norm(k, gamma_k)
        return q @ np.swapaxes(k, -1, -2) / d_head ** 0.5
    return scores, d_head ** 0.5 * np.abs(gamma_q).max() * np.abs(gamma_k).max()


def largest_weight(scores):
    T = scores.shape[-1]
    return mnp.masked_softmax(scores, mnp.causal_mask(T)).max(axis=-1)[:, 1:].mean()


def test_growing_weights_make_plain_attention_one_hot_and_change_nothing_with_qk_norm_on_every_draw():
    """The QK-norm section's table and asserts, and its sentences on the cap, on every draw."""
    causal = mnp.causal_mask(16)
    for seed in DRAWS:
        scores, bound = growing_layer(seed)
        normed = scores(16, True)
        assert np.abs(normed).max() <= bound and gap(normed, scores(1, True)) < 1e-4, seed
        assert largest_weight(scores(16, False)) > 0.95, seed
        at_4, at_16 = scores(4, False), scores(16, False)
        assert largest_weight(at_4) > 0.85, seed  # "already nearly one-hot"
        assert (np.abs(at_4) > 50)[:, causal].mean() < 0.5 < (np.abs(at_16) > 50)[:, causal].mean(), seed
        assert abs(largest_weight(mnp.soft_cap(at_4, 50.0)) - largest_weight(at_4)) < 0.05, seed  # "changes little"
        assert largest_weight(mnp.soft_cap(at_16, 50.0)) < largest_weight(at_16) - 0.2, seed  # "spreads again"


def test_the_experiment_on_growing_scores_holds_on_every_draw():
    """ex-ch13-growing-scores: one-hot within a few-fold growth, the capped curve as sharp as the plain one at
    first, then falling back, and QK-norm's curve flat; on 20 draws, not only the 5 of the solution."""
    for seed in DRAWS:
        scores, _ = growing_layer(seed)
        plain = np.array([largest_weight(scores(g, False)) for g in GROWTHS])
        capped = np.array([largest_weight(mnp.soft_cap(scores(g, False), 50.0)) for g in GROWTHS])
        normed = np.array([largest_weight(scores(g, True)) for g in GROWTHS])
        assert GROWTHS[np.argmax(plain > 0.9)] <= 6 and plain[-1] > 0.98, seed
        assert np.abs(capped[:3] - plain[:3]).max() < 0.01 and capped[-1] < capped.max() - 0.3, seed
        assert np.abs(normed - normed[0]).max() < 1e-4, seed


# Whole models: GPT-2, Llama and the other families, copied with from_transformers ---------------------------


NO_SPECIAL_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, vocab_size=64, **NO_SPECIAL_TOKENS)
FAMILIES = {
    "GPT-2": (transformers.GPT2LMHeadModel, transformers.GPT2Config,
              dict(n_embd=32, n_layer=6, n_head=4, vocab_size=64, **NO_SPECIAL_TOKENS)),
    "Llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, SMALL),
    "Mistral": (transformers.MistralForCausalLM, transformers.MistralConfig, dict(SMALL, sliding_window=4)),
    "Qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, SMALL),
    "Qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, SMALL),
    "Gemma 2": (transformers.Gemma2ForCausalLM, transformers.Gemma2Config, dict(SMALL, sliding_window=4)),
    "Gemma 3": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig, dict(SMALL, sliding_window=4)),
    "OLMo 2": (transformers.Olmo2ForCausalLM, transformers.Olmo2Config, SMALL),
}


def randomize(model, seed, std=0.3):
    """The chapter's: weights drawn larger than the initialisation, norms near their start."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model.eval()


def relative_logit_gap(theirs, ours, tokens):
    with torch.no_grad():
        their_logits, our_logits = theirs(tokens).logits, ours(tokens)
    return gap(our_logits, their_logits) / their_logits.abs().max().item()


@pytest.mark.parametrize("family", ["GPT-2", "Llama"])
def test_gpt2_and_llama_give_our_logits_and_our_greedy_tokens_on_every_draw(family):
    """The chapter's two proofs (GPT-2 and Llama of width 64, 2 blocks), on 5 draws of the weights and tokens."""
    model_class, config_class, _ = FAMILIES[family]
    options = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64) if family == "GPT-2" else \
        dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=100)
    for seed in range(5):
        theirs = randomize(model_class(config_class(**options, **NO_SPECIAL_TOKENS)), seed)
        ours = mt.from_transformers(theirs).eval()
        tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(seed))
        assert relative_logit_gap(theirs, ours, tokens) < 1e-5, seed
        prompt = tokens[:, :4]
        with torch.no_grad():
            expected = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                       max_new_tokens=12)
            assert torch.equal(ours.generate(prompt, 12), expected), seed
            assert torch.equal(mt.generate_greedy(ours, prompt, 12), expected), seed
        wide = ours.double()
        with torch.no_grad():
            assert gap(mnp.transformer_lm(tokens.numpy(), **wide.numpy_params()), wide(tokens)) < 1e-10, seed


def test_every_family_of_the_table_gives_our_logits_on_every_draw():
    for name, (model_class, config_class, options) in FAMILIES.items():
        for seed in range(5):
            theirs = randomize(model_class(config_class(**options)), seed)
            tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))
            assert relative_logit_gap(theirs, mt.from_transformers(theirs).eval(), tokens) < 1e-5, (name, seed)
