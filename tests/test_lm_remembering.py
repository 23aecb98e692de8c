"""`mha.torch.from_transformers` on the families of chapter 17 (attention that remembers less): OLMo 3 (sliding
layers), gpt-oss (attention sinks, alternating windows, clamped SwiGLU experts), Qwen3-MoE (experts, dense
mlp_only_layers), DeepSeek-V3 (multi-head latent attention, group-limited experts with the correction bias,
shared experts, dense first layers) and DeepSeek-V3.2 (the same with the lightning indexer's top-k keys),
each also through `mha.numpy.transformer_lm`; and what is refused, by name. (The sink softmax and Qwen3-Next's
output gate, layer by layer: tests/test_sinks_and_gates.py.)

Tiny random configurations, nothing downloaded, held out from development (other sizes and seeds than the
ones the code was written against); weights drawn from N(0, 0.3), DeepSeek's e_score_correction_bias given
values, gpt-oss's swiglu_limit lowered so that its clamp bites; windows smaller than the prompt, top-k below
its length, several experts active per token. Logits must equal transformers' (eager attention and experts) in
float32 to 1e-5 x the largest logit at every real token of a left-padded batch, and in float64 (unpadded:
transformers' float64 gives NaN at left padding) to 1e-6 (its RoPE tables are float32); greedy tokens must
equal generate()'s, with and without the cache; decoding with the cache must equal the whole sequence, and
the cache hold what the paper says (DeepSeek: the latents and the shared rotary keys; a window: window - 1
positions)."""

import numpy as np
import pytest
import torch
import transformers

from greedy import assert_greedy_matches_generate

import mha.numpy as mnp
import mha.torch as mt

V, T = 48, 13
COMMON = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0, experts_implementation="eager")
DEEPSEEK = dict(hidden_size=40, num_attention_heads=5, num_key_value_heads=5, intermediate_size=56,
                moe_intermediate_size=12, num_hidden_layers=3, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                v_head_dim=7, n_routed_experts=6, num_experts_per_tok=3, n_group=3, topk_group=2, n_shared_experts=1,
                first_k_dense_replace=1, routed_scaling_factor=1.7, **COMMON)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=4, beta_fast=32.0,
            beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
CONFIGS = {
    "olmo3, windows 3 and 5 < T": lambda: transformers.Olmo3Config(
        hidden_size=40, num_attention_heads=5, num_key_value_heads=5, intermediate_size=56, num_hidden_layers=3,
        sliding_window=3, layer_types=["sliding_attention", "sliding_attention", "full_attention"], **COMMON),
    "olmo3, grouped heads, window 5": lambda: transformers.Olmo3Config(
        hidden_size=48, num_attention_heads=6, num_key_value_heads=2, intermediate_size=40, num_hidden_layers=4,
        sliding_window=5, **COMMON),
    "gpt_oss, window 3, clamp 0.8": lambda: transformers.GptOssConfig(
        hidden_size=40, num_attention_heads=6, num_key_value_heads=2, head_dim=6, intermediate_size=10,
        num_hidden_layers=3, sliding_window=3, num_local_experts=5, num_experts_per_tok=2, swiglu_limit=0.8,
        **COMMON),
    "gpt_oss, default YaRN, window 5, 3 of 8 experts": lambda: transformers.GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=10, intermediate_size=12,
        num_hidden_layers=2, sliding_window=5, num_local_experts=8, num_experts_per_tok=3, swiglu_limit=1.5,
        **COMMON),
    "qwen3_moe, a dense layer, normalised top-k": lambda: transformers.Qwen3MoeConfig(
        hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=10, intermediate_size=36,
        moe_intermediate_size=14, num_hidden_layers=3, num_experts=7, num_experts_per_tok=3, mlp_only_layers=[0],
        norm_topk_prob=True, **COMMON),
    "qwen3_moe, window 4, top-k not normalised": lambda: transformers.Qwen3MoeConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8, intermediate_size=24,
        moe_intermediate_size=10, num_hidden_layers=2, num_experts=5, num_experts_per_tok=2, norm_topk_prob=False,
        use_sliding_window=True, sliding_window=4, **COMMON),
    "deepseek_v3, q_lora_rank, interleaved": lambda: transformers.DeepseekV3Config(q_lora_rank=14, **DEEPSEEK),
    "deepseek_v3, no q_lora_rank, halves, YaRN": lambda: transformers.DeepseekV3Config(
        q_lora_rank=None, rope_interleave=False, rope_parameters=YARN, max_position_embeddings=16, **DEEPSEEK),
    "deepseek_v32, top-k 5 < T": lambda: transformers.DeepseekV32Config(
        q_lora_rank=14, index_n_heads=8, index_head_dim=8, index_topk=5, **DEEPSEEK),
    "deepseek_v32, top-k 3, YaRN": lambda: transformers.DeepseekV32Config(
        q_lora_rank=12, index_n_heads=8, index_head_dim=12, index_topk=3, rope_parameters=YARN,
        max_position_embeddings=16, **{**DEEPSEEK, "num_hidden_layers": 2}),
}


def hf_model(name, seed=1, dtype=torch.float32):
    config = CONFIGS[name]()
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):  # a buffer: zero unless given values
                buffer.normal_(0.0, 0.5)
    return model.to(dtype).eval()


def padded_batch(seed=0, B=2, pads=4):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, V, (B, T), generator=generator)
    mask = torch.ones_like(tokens)
    mask[0, :pads] = 0
    tokens[0, :pads] = 0  # the pad token
    return tokens, mask


def relative_gap(got, expected, where):
    return ((got - expected)[where].abs().max() / expected[where].abs().max()).item()


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers_at_every_real_token_of_a_padded_batch(name):
    model = hf_model(name)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch()
    with torch.no_grad():
        expected, got = model(tokens, attention_mask=mask).logits, ours(tokens, mask)
    real = mask.bool()
    assert expected[real].abs().max() > 1.0
    assert relative_gap(got, expected, real) <= 1e-5


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers_in_float64(name):
    """1e-7 apart, not 1e-15: transformers computes RoPE's cos and sin in float32 even for a float64 model (its
    rotary embedding casts the frequencies and positions to float32, then the tables to the model's dtype)."""
    model = hf_model(name, dtype=torch.float64)
    ours = mt.from_transformers(model)
    tokens, _ = padded_batch(seed=4, pads=0)  # seed 3 ties two keys at 0 (ReLU's) in V3.2's 5th indexer place
    with torch.no_grad():
        expected, got = model(tokens).logits, ours(tokens)
    assert got.dtype == torch.float64
    assert relative_gap(got, expected, torch.ones_like(tokens, dtype=torch.bool)) <= 1e-6


@pytest.mark.parametrize("name", CONFIGS)
def test_the_numpy_twin_computes_the_same_logits(name):
    """mnp.transformer_lm from numpy_params(): sinks, the latent attention (and its indexer), the experts."""
    ours = mt.from_transformers(hf_model(name, dtype=torch.float64))
    tokens, mask = padded_batch()
    with torch.no_grad():
        expected = ours(tokens, mask)
    got = mnp.transformer_lm(tokens.numpy(), **ours.numpy_params(), attention_mask=mask.numpy())
    real = mask.bool().numpy()
    np.testing.assert_allclose(got[real], expected.numpy()[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_equal_generates_with_and_without_the_cache(name):
    """8 new tokens past every window, left padding, on prompts whose top-1 margins exceed 1e-3."""
    model = hf_model(name)
    ours = mt.from_transformers(model)
    assert_greedy_matches_generate(model, ours, (padded_batch(seed) for seed in range(8)))


@pytest.mark.parametrize("name", [n for n in CONFIGS if not n.startswith("qwen3_moe, a")])
def test_decoding_with_the_cache_equals_the_whole_sequence_and_holds_what_it_should(name):
    """Prefill 5 tokens, then one at a time (DeepSeek: the absorbed step): every step's logits equal the whole
    sequence's. DeepSeek's cache holds the latents and shared rotary keys, its bytes the formula; a window's
    holds window - 1 positions."""
    model = hf_model(name)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch()
    cache = ours.new_cache()
    with torch.no_grad():
        steps = [ours(tokens[:, :5], mask[:, :5], cache=cache)]
        steps += [ours(tokens[:, t:t + 1], mask[:, :t + 1], cache=cache) for t in range(5, T)]
        whole = ours(tokens, mask)
    real = mask.bool()
    assert relative_gap(torch.cat(steps, dim=1), whole, real) <= 1e-5
    config = model.config
    if config.model_type.startswith("deepseek"):
        assert all(isinstance(c, mt.LatentCache) for c in cache)
        expected = mt.latent_cache_bytes(config.num_hidden_layers, config.kv_lora_rank, config.qk_rope_head_dim, T,
                                         batch=2, bytes_per_value=4)
        if config.model_type == "deepseek_v32":  # and the indexer's keys, one per position of width index_head_dim
            expected += config.num_hidden_layers * 2 * T * config.index_head_dim * 4
        assert mt.cache_bytes(cache) == expected
        return
    held = [len(c) for c in cache]
    windows = [block.attention.sliding_window for block in ours.blocks]
    assert held == [T if w is None else w - 1 for w in windows] and any(w is not None for w in windows)
    h_kv, d = ours.blocks[0].attention.n_kv_heads, ours.blocks[0].attention.d_head
    assert mt.cache_bytes(cache) == sum(2 * 2 * h_kv * n * d * 4 for n in held)


def test_the_copies_have_the_features_that_make_them_differ():
    """Each feature the copies compute is there (so that equality above tests it): sinks in gpt-oss, windows in
    OLMo 3, experts where transformers has them, dense layers where it has those, the latent attention and the
    indexer in DeepSeek."""
    gpt_oss = mt.from_transformers(hf_model("gpt_oss, window 3, clamp 0.8"))
    assert [b.attention.sliding_window for b in gpt_oss.blocks] == [3, None, 3]
    assert all(b.attention.sinks is not None and b.attention.sinks.abs().max() > 0 for b in gpt_oss.blocks)
    assert all(isinstance(b.feed_forward, mt.MixtureOfExperts) for b in gpt_oss.blocks)
    qwen = mt.from_transformers(hf_model("qwen3_moe, a dense layer, normalised top-k"))
    assert [type(b.feed_forward).__name__ for b in qwen.blocks] == ["GatedFeedForward"] + ["MixtureOfExperts"] * 2
    assert qwen.config.expert_layers == (1, 2)
    v32 = mt.from_transformers(hf_model("deepseek_v32, top-k 5 < T"))
    assert all(isinstance(b.attention, mt.MultiHeadLatentAttention) and b.attention.indexer is not None
               for b in v32.blocks)
    assert type(v32.blocks[0].feed_forward).__name__ == "GatedFeedForward"


@pytest.mark.parametrize("name,feature", [
    ("gpt_oss, window 3, clamp 0.8", "sinks"), ("olmo3, windows 3 and 5 < T", "sliding_window"),
    ("gpt_oss, window 3, clamp 0.8", "sliding_window")])
def test_each_attention_feature_matters_at_this_scale(name, feature):
    """Switch sinks or windows off in the copy: the logits move far more than the tolerance."""
    model = hf_model(name)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch()
    with torch.no_grad():
        before = ours(tokens, mask)
        for block in ours.blocks:
            setattr(block.attention, feature, None)
        after = ours(tokens, mask)
    assert relative_gap(after, before, mask.bool()) > 1e-3


# What is refused, by name ---------------------------------------------------------------------------------


def test_gemma3n_is_refused_by_model_type():
    """Gemma 3n's text model is not computed here: from_transformers names the type. (Qwen3-Next, once refused
    here, is copied since chapter 18: tests/test_lm_hybrid.py.)"""
    config = transformers.Gemma3nTextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                            intermediate_size=16, num_hidden_layers=4, vocab_size=V,
                                            num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                                            vocab_size_per_layer_input=V, laurel_rank=4)
    with pytest.raises(ValueError, match="model_type='gemma3n_text'"):  # its KV sharing, but also AltUp, LAuReL ...
        mt.from_transformers(transformers.AutoModelForCausalLM.from_config(config))


def test_mixtures_that_differ_from_layer_to_layer_are_refused_by_name():
    model = hf_model("qwen3_moe, window 4, top-k not normalised")
    model.model.layers[1].mlp.gate.top_k = 3  # one layer routes each token to 3 experts, the other to 2
    with pytest.raises(ValueError, match="mixtures of experts that differ from layer to layer"):
        mt.from_transformers(model)


def test_deepseek_with_fewer_key_value_heads_is_refused_by_name():
    config = CONFIGS["deepseek_v3, q_lora_rank, interleaved"]()
    config.num_key_value_heads = 1
    with pytest.raises(ValueError, match="num_key_value_heads=1"):
        mt.from_transformers(transformers.AutoModelForCausalLM.from_config(config))


def test_the_numpy_face_refuses_shared_keys_by_name():
    with pytest.raises(ValueError, match=r"does not compute own_kv=False \(shared keys\)"):
        mt.GroupedQueryAttention(16, 2, 1, own_kv=False).numpy_params()
