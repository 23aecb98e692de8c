"""`mha.torch.from_transformers` and `TransformerLM` against Hugging Face's causal LMs: GPT-2, Llama
(with each RoPE scaling), Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 and OLMo 2.

Tiny random configs, nothing downloaded. Weights are drawn from N(0, 0.3), larger than the default
init, so that a missing feature moves the logits far more than rounding; T = 11 is longer than
every window (4); the first sequence is left-padded. Logits must equal the reference's in float32
to 1e-5 x max |logit| at every real token, greedy generation must give generate()'s tokens, and
`mha.numpy.transformer_lm` must give the same logits in float64."""

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from greedy import margins

import mha.numpy as mnp
import mha.torch as mt

V, T, WINDOW = 64, 11, 4
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
             num_hidden_layers=2, vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=4)
FAMILIES = {
    "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=V, n_positions=32,
                                            bos_token_id=1, eos_token_id=2),
    "llama": lambda: transformers.LlamaConfig(**SIZES),
    "llama, linear RoPE": lambda: transformers.LlamaConfig(**SIZES, rope_parameters=dict(
        rope_type="linear", rope_theta=10000.0, factor=4.0)),
    "llama, dynamic NTK RoPE": lambda: transformers.LlamaConfig(**SIZES, max_position_embeddings=6, rope_parameters=dict(
        rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
    "llama, YaRN RoPE": lambda: transformers.LlamaConfig(**SIZES, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=4)),
    "llama, Llama 3 RoPE": lambda: transformers.LlamaConfig(**SIZES, rope_parameters=LLAMA3),
    "mistral": lambda: transformers.MistralConfig(**SIZES, head_dim=8, sliding_window=WINDOW),
    "qwen2": lambda: transformers.Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=WINDOW,
                                              max_window_layers=1),
    "qwen3": lambda: transformers.Qwen3Config(**SIZES, head_dim=8),
    "gemma": lambda: transformers.GemmaConfig(**SIZES, head_dim=8),
    "gemma2": lambda: transformers.Gemma2Config(**SIZES, head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                                attn_logit_softcapping=20.0, final_logit_softcapping=30.0),
    "gemma3": lambda: transformers.Gemma3TextConfig(**SIZES, head_dim=8, sliding_window=WINDOW,
                                                    query_pre_attn_scalar=16,
                                                    layer_types=["sliding_attention", "full_attention"]),
    "olmo2": lambda: transformers.Olmo2Config(**SIZES),
}
SDPA_REFUSES = {"gemma2"}  # Hugging Face's sdpa does not soft-cap


def hf_model(family, seed=0, implementation="eager"):
    config = FAMILIES[family]()
    config._attn_implementation = implementation
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def padded_batch(seed=0, B=2, pads=3):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, V, (B, T), generator=generator)
    mask = torch.ones_like(tokens)
    mask[0, :pads] = 0
    tokens[0, :pads] = 0  # the pad token
    return tokens, mask


CASES = [(family, implementation) for family in FAMILIES for implementation in ("eager", "sdpa")
         if not (implementation == "sdpa" and family.split(",")[0] in SDPA_REFUSES)]


@pytest.mark.parametrize("family,implementation", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_logits_equal_hugging_face_with_padding_past_every_window(family, implementation):
    model = hf_model(family, implementation=implementation)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch()
    with torch.no_grad():
        expected = model(tokens, attention_mask=mask).logits
        got = ours(tokens, mask)
    real = mask.bool()
    scale = expected[real].abs().max()
    assert scale > 1.0
    assert (got - expected)[real].abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_gives_generates_tokens(family):
    """With the cache, left padding, positions from the mask, 8 new tokens (past every window) and
    the end-of-sequence token 2 (a finished sequence continues with padding), on prompts whose top-1
    margins all exceed 1e-3 (so that rounding cannot pick another token)."""
    model = hf_model(family)
    ours = mt.from_transformers(model)
    compared = 0
    for seed in range(8):
        if compared == 3:
            break
        tokens, mask = padded_batch(seed)
        with torch.no_grad():
            theirs = model.generate(tokens, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                                    output_scores=True, return_dict_in_generate=True)
        if margins(theirs.scores).min() <= 1e-3:
            continue
        got = ours.generate(tokens, 8, attention_mask=mask, eos_token_id=2, pad_token_id=0)
        assert torch.equal(got, theirs.sequences)
        compared += 1
    assert compared >= 3


@pytest.mark.parametrize("family", FAMILIES)
def test_numpy_twin_computes_the_same_logits(family):
    ours = mt.from_transformers(hf_model(family).double())
    tokens, mask = padded_batch()
    with torch.no_grad():
        expected = ours(tokens, mask)
    got = mnp.transformer_lm(tokens.numpy(), **ours.numpy_params(), attention_mask=mask.numpy())
    real = mask.bool().numpy()
    np.testing.assert_allclose(got[real], expected.numpy()[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3", "llama, dynamic NTK RoPE", "gpt2"])
def test_decoding_with_the_cache_equals_the_whole_sequence(family):
    """Prefill 5 tokens, then one at a time: the logits of every step equal the whole sequence's,
    and a window's cache holds window - 1 positions. (Dynamic NTK: its frequencies change with the
    length, so cached keys keep older angles, as in transformers; compared with Hugging Face instead.)"""
    model = hf_model(family)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch()
    cache = []  # an empty list: the first forward fills it with one KVCache per layer
    with torch.no_grad():
        steps = [ours(tokens[:, :5], mask[:, :5], cache=cache)]
        steps += [ours(tokens[:, t:t + 1], mask[:, :t + 1], cache=cache) for t in range(5, T)]
        whole = ours(tokens, mask)
        reference = transformers.DynamicCache(config=model.config)
        hf_steps = [model(tokens[:, :5], attention_mask=mask[:, :5], past_key_values=reference).logits]
        hf_steps += [model(tokens[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=reference).logits
                     for t in range(5, T)]
    real = mask.bool()
    stepped = torch.cat(steps, dim=1)
    expected = torch.cat(hf_steps, dim=1) if "dynamic" in family else whole
    assert (stepped - expected)[real].abs().max() <= 1e-5 * expected[real].abs().max()
    for block, layer_cache in zip(ours.blocks, cache):
        window = block.attention.sliding_window
        assert layer_cache.position == T and len(layer_cache) == (T if window is None else window - 1)


@pytest.mark.parametrize("change", [
    dict(embedding_scale=None), dict(final_logit_cap=None), dict(norm_unit_offset=False),
    dict(norm_placement="pre"), dict(tie_embeddings=False)], ids=lambda c: next(iter(c)))
def test_each_model_feature_matters_at_this_scale(change):
    """Rebuild Gemma 2 without one of its features (same weights where they exist): the logits move
    by far more than the 1e-5 tolerance, so the equality tests would catch a loader that dropped it."""
    model = hf_model("gemma2")
    ours = mt.from_transformers(model)
    changed = mt.TransformerLM(dataclasses.replace(ours.config, **change))
    state = ours.state_dict()
    changed.load_state_dict({k: v for k, v in state.items() if k in changed.state_dict()}, strict=False)
    if "tie_embeddings" in change:
        torch.nn.init.normal_(changed.output.weight)
    tokens, _ = padded_batch()
    with torch.no_grad():
        gap = (changed(tokens) - ours(tokens)).abs().max() / ours(tokens).abs().max()
    assert gap > 1e-3


def test_one_sequence_and_chapter_11s_generate_greedy():
    """A sequence without a batch axis gives the batch's row; generate_greedy (no cache) gives the same
    tokens as the cached generate."""
    ours = mt.from_transformers(hf_model("gemma3"))
    tokens, _ = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens[1]), ours(tokens)[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(mt.generate_greedy(ours, tokens[1], 6), ours.generate(tokens[1:], 6)[0])


def test_weights_and_knocked_out_heads():
    ours = mt.from_transformers(hf_model("qwen3"))
    tokens, mask = padded_batch()
    with torch.no_grad():
        logits, weights = ours(tokens, mask, return_weights=True)
        assert weights.shape == (2, 2, 4, T, T)  # (n_layers, B, h, T, T)
        torch.testing.assert_close(logits, ours(tokens, mask))
        torch.testing.assert_close(weights[:, 1].sum(-1), torch.ones(2, 4, T))  # rows of real queries sum to 1
        assert weights[:, 0, :, :, :3].abs().max() == 0  # nobody attends to padding
        heads = torch.ones(2, 4, dtype=torch.bool)
        heads[1, 2] = False
        off_logits, off_weights = ours(tokens, mask, return_weights=True, head_mask=heads)
    assert off_weights[1, :, 2].abs().max() == 0 and (off_logits - logits).abs().max() > 1e-3


@pytest.mark.parametrize("flags", [dict(scale_attn_by_inverse_layer_idx=True), dict(scale_attn_weights=False)],
                         ids=["scores / (layer + 1)", "unscaled scores"])
def test_gpt2s_score_scaling_flags_are_computed(flags):
    config = FAMILIES["gpt2"]()
    for name, value in flags.items():
        setattr(config, name, value)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    model.eval()
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch()
    with torch.no_grad():
        expected, got = model(tokens, attention_mask=mask).logits, ours(tokens, mask)
    real = mask.bool()
    assert (got - expected)[real].abs().max() <= 1e-5 * expected[real].abs().max()
    plain = mt.from_transformers(hf_model("gpt2"))
    assert [b.attention.scale for b in ours.blocks] != [b.attention.scale for b in plain.blocks]


@pytest.mark.parametrize("make,field", [
    (lambda: transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=V, activation_function="relu"),
     "activation_function='relu'"),
    (lambda: transformers.LlamaConfig(**{**SIZES, "num_hidden_layers": 1}, mlp_bias=True), "mlp_bias=True"),
    (lambda: transformers.Gemma3TextConfig(**{**SIZES, "num_hidden_layers": 1}, head_dim=8,
                                           use_bidirectional_attention=True), "use_bidirectional_attention=True"),
], ids=["gpt2 relu", "llama mlp_bias", "gemma3 bidirectional"])
def test_fields_that_change_the_answer_are_refused(make, field):
    model = transformers.AutoModelForCausalLM.from_config(make())
    with pytest.raises(ValueError, match=field):
        mt.from_transformers(model)


def test_other_models_are_refused_by_model_type():
    model = transformers.OPTForCausalLM(transformers.OPTConfig(hidden_size=16, num_attention_heads=2,
                                                               num_hidden_layers=1, ffn_dim=32, vocab_size=V))
    with pytest.raises(ValueError, match="model_type='opt'"):
        mt.from_transformers(model)
    with pytest.raises(ValueError, match="model_type=None"):
        mt.from_transformers(torch.nn.Linear(2, 2))


def test_bad_inputs_are_named():
    ours = mt.from_transformers(hf_model("llama"))
    tokens, mask = padded_batch()
    with pytest.raises(ValueError, match=r"attention_mask must be .* shape \(B, cached \+ new tokens\)"):
        ours(tokens, mask[:, 1:])
    with pytest.raises(TypeError, match="integer token ids"):
        ours(tokens.float())
    with pytest.raises(ValueError, match=r"but the vocabulary has ids 0 \.\. 63 only"):
        ours(tokens + V)
    with pytest.raises(TypeError, match="cache must be a list of 2 mha.torch.KVCache"):
        ours(tokens, cache=mt.KVCache())
    with pytest.raises(ValueError, match="position_ids must be integers of the tokens' shape"):
        ours(tokens, position_ids=torch.arange(3))
    with pytest.raises(TypeError, match="config must be a mha.torch.LMConfig"):
        mt.TransformerLM({"vocab_size": 4})
    with pytest.raises(ValueError, match="norm_placement must be one of"):
        mt.LMConfig(vocab_size=4, d_model=8, n_layers=1, d_ff=8, attention={"n_heads": 2}, norm_placement="middle")


def test_gemma_3_ignores_the_attention_soft_cap_as_transformers_does():
    """Gemma3TextConfig keeps attn_logit_softcapping, but transformers' Gemma3Attention never applies it: the
    copy must not either (it once did, 1.7e-3 away at cap 30). Gemma 2's attention does apply it."""
    for family, cap in (("gemma3", 5.0), ("gemma2", 5.0)):
        config = FAMILIES[family]()
        config.attn_logit_softcapping = cap
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.3)
        model.eval()
        ours = mt.from_transformers(model)
        assert [block.attention.logit_cap for block in ours.blocks] == [None if family == "gemma3" else cap] * 2
        tokens, mask = padded_batch()
        with torch.no_grad():
            expected, got = model(tokens, attention_mask=mask).logits, ours(tokens, mask)
        real = mask.bool()
        assert (got - expected)[real].abs().max() <= 1e-5 * expected[real].abs().max(), family


@pytest.mark.parametrize("family,fields", [
    ("gpt2", dict(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1)), ("llama", dict(attention_dropout=0.1))],
    ids=["gpt2 defaults", "llama attention_dropout"])
def test_a_model_with_dropout_copies_for_inference_and_refuses_train_by_name(family, fields):
    """The copy computes without dropout: in train() mode it would differ from transformers (0.42-0.54 away
    for GPT-2's three default dropouts of 0.1), so train() is refused, naming the fields, and eval() works."""
    config = FAMILIES[family]()
    for name, value in fields.items():
        setattr(config, name, value)
    model = transformers.AutoModelForCausalLM.from_config(config)
    for name in fields:
        with pytest.raises(ValueError, match=f"{name}=0.1"):
            mt.from_transformers(model.train())
    ours = mt.from_transformers(model.eval())
    assert not ours.training
    with pytest.raises(ValueError, match="dropout"):
        ours.train()
    ours.eval()  # eval() stays allowed


def test_a_model_without_dropout_copies_in_train_mode_and_trains():
    """Dropouts of 0: train() is fine, and the logits in train mode equal transformers' in train mode."""
    config = FAMILIES["gpt2"]()
    config.attn_pdrop = config.resid_pdrop = config.embd_pdrop = 0.0
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config).train()
    ours = mt.from_transformers(model)
    assert ours.training
    tokens, _ = padded_batch()
    torch.testing.assert_close(ours(tokens), model(tokens).logits, rtol=1e-5, atol=1e-5)


def test_an_lm_head_with_a_bias_is_refused_by_name():
    model = hf_model("llama")
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with pytest.raises(ValueError, match="lm_head with a bias"):
        mt.from_transformers(model)


def test_padding_idx_is_copied_and_the_pad_row_gets_no_gradient():
    """Llama's embed_tokens has padding_idx = pad_token_id: its row gets no gradient, in theirs and in ours."""
    model = hf_model("llama")
    ours = mt.from_transformers(model)
    assert model.get_input_embeddings().padding_idx == 0 and ours.embedding.padding_idx == 0
    assert mt.from_transformers(hf_model("gpt2")).embedding.padding_idx is None  # GPT-2's wte has none
    tokens, _ = padded_batch()  # the first sequence starts with three pad tokens, id 0
    ours.train()
    model.train()
    ours(tokens).square().mean().backward()
    model(tokens).logits.square().mean().backward()
    theirs = model.get_input_embeddings().weight.grad
    assert ours.embedding.weight.grad[0].abs().max() == 0 and theirs[0].abs().max() == 0
    torch.testing.assert_close(ours.embedding.weight.grad, theirs, rtol=1e-4, atol=1e-6)
