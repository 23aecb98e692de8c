"""`mha.torch.from_transformers` on the hybrids of chapter 18: Qwen3.5's text model (Qwen3_5ForCausalLM, dense) and
Qwen3-Next (experts with a shared expert), whose layers mix Gated DeltaNet ("linear_attention") and gated full
attention; each also through `mha.numpy.transformer_lm`; and what is refused, by name.

Tiny random configurations, nothing downloaded, held out from development (other sizes, layer patterns and seeds
than the ones the code was written against): linear layers first, full attention first, every layer linear; fewer
key heads than value heads (each key head serving consecutive value heads); Qwen3.5's mrope sections given (for
text the three rows of positions are one: plain RoPE over the rotary part); several experts active per token and
the shared expert; weights drawn from N(0, 0.3). Logits must equal transformers' (eager attention and experts,
its PyTorch references of the gated delta rule and the causal convolution, put in place of whatever kernels
`fla` or `causal_conv1d` would give where installed: `torch_references`) in float32 to 1e-5 x the largest logit
at every real token of a left-padded batch, past transformers' chunk of 64 once; in float64 unpadded to 1e-5 too
(transformers computes the delta rule in float32 whatever the model's dtype; the numpy twin agrees to 1e-10);
greedy tokens equal generate()'s with and without the cache on a left-padded batch of 3; decoding with the cache
equals the whole sequence, and the linear layers' states do not grow with T while the full layers' caches do."""

import dataclasses
import inspect

import numpy as np
import pytest
import torch
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_next import modeling_qwen3_next

from greedy import assert_greedy_matches_generate

import mha.numpy as mnp
import mha.torch as mt

MODELING = [modeling_qwen3_5, modeling_qwen3_next]
KERNELS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
           "causal_conv1d_update")

V, T = 40, 11
COMMON = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LINEAR, FULL = "linear_attention", "full_attention"
CONFIGS = {
    "qwen3_5, linear linear full, 2 key heads for 6 value heads": lambda: transformers.Qwen3_5TextConfig(
        hidden_size=36, num_attention_heads=3, num_key_value_heads=1, head_dim=10, intermediate_size=20,
        num_hidden_layers=3, layer_types=[LINEAR, LINEAR, FULL], linear_num_key_heads=2, linear_num_value_heads=6,
        linear_key_head_dim=6, linear_value_head_dim=5, linear_conv_kernel_dim=3, **COMMON),
    "qwen3_5, full first, mrope sections, half rotary": lambda: transformers.Qwen3_5TextConfig(
        hidden_size=30, num_attention_heads=2, num_key_value_heads=2, head_dim=12, intermediate_size=26,
        num_hidden_layers=4, layer_types=[FULL, LINEAR, LINEAR, FULL], linear_num_key_heads=3,
        linear_num_value_heads=3, linear_key_head_dim=5, linear_value_head_dim=7,
        rope_parameters=dict(rope_type="default", rope_theta=5000.0, partial_rotary_factor=0.5,
                             mrope_section=[1, 1, 1], mrope_interleaved=True), **COMMON),
    "qwen3_5, every layer linear, tied embeddings": lambda: transformers.Qwen3_5TextConfig(
        hidden_size=28, num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=18,
        num_hidden_layers=2, layer_types=[LINEAR, LINEAR], linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=7, linear_value_head_dim=6, linear_conv_kernel_dim=2, tie_word_embeddings=True,
        **COMMON),
    "qwen3_next, linear full linear, 3 of 6 experts, a dense layer": lambda: transformers.Qwen3NextConfig(
        hidden_size=36, num_attention_heads=3, num_key_value_heads=1, head_dim=16, intermediate_size=22,
        num_hidden_layers=3, layer_types=[LINEAR, FULL, LINEAR], num_experts=6, num_experts_per_tok=3,
        moe_intermediate_size=10, shared_expert_intermediate_size=14, mlp_only_layers=[2],
        linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=6, linear_value_head_dim=5,
        experts_implementation="eager", **COMMON),
    "qwen3_next, interval 4, 2 of 5 experts, top-k not normalised": lambda: transformers.Qwen3NextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=16,
        num_hidden_layers=4, num_experts=5, num_experts_per_tok=2, norm_topk_prob=False, moe_intermediate_size=9,
        shared_expert_intermediate_size=11, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=5, linear_value_head_dim=6, partial_rotary_factor=0.5,
        experts_implementation="eager", **COMMON),
}
EVERY_LINEAR = "qwen3_5, every layer linear, tied embeddings"  # transformers' cache needs one attention layer
LONG = ["qwen3_5, linear linear full, 2 key heads for 6 value heads",
        "qwen3_next, linear full linear, 3 of 6 experts, a dense layer"]


@pytest.fixture(autouse=True)
def torch_references(monkeypatch):
    """transformers picks fla's or causal_conv1d's kernels when they are installed (they need CUDA), else its
    PyTorch references: the references, always, whatever is installed (each kernel wraps its reference)."""
    for module in MODELING:
        for name in KERNELS:
            monkeypatch.setattr(module, name, inspect.unwrap(getattr(module, name)))


def hf_model(name, seed=3, dtype=torch.float32, std=0.3):
    config = CONFIGS[name]()
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, std)
    return model.to(dtype).eval()


def padded_batch(seed=0, B=2, pads=4, length=T):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, V, (B, length), generator=generator)
    mask = torch.ones_like(tokens)
    for b in range(B - 1):  # the last sequence unpadded, the others padded on the left, less and less
        mask[b, :max(pads - b, 0)] = 0
    return tokens.masked_fill(mask == 0, 0), mask


def relative_gap(got, expected, where):
    return ((got - expected)[where].abs().max() / expected[where].abs().max()).item()


def linear_layers(ours):
    return [i for i, block in enumerate(ours.blocks) if block.linear]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_copy_has_the_layer_pattern_and_the_parts_of_the_model(name):
    model = hf_model(name)
    ours = mt.from_transformers(model)
    expected = tuple("linear" if kind == LINEAR else "full" for kind in model.config.layer_types)
    assert ours.config.layer_types == expected and "linear" in expected
    assert [type(block.attention).__name__ for block in ours.blocks] == \
        ["GatedDeltaNet" if kind == "linear" else "GroupedQueryAttention" for kind in expected]
    config = model.config
    assert ours.config.linear_attention == {**ours.config.linear_attention, **dict(
        n_key_heads=config.linear_num_key_heads, n_value_heads=config.linear_num_value_heads,
        key_head_dim=config.linear_key_head_dim, value_head_dim=config.linear_value_head_dim)}
    for block in ours.blocks:
        if not block.linear:  # Qwen's gated attention: the output gate, (1 + w) QK-norms, a partial RoPE
            assert block.attention.output_gate and block.attention.q_norm.unit_offset
            assert block.attention.rotary_dim == int(config.head_dim * config.rope_parameters["partial_rotary_factor"])
    kinds = [type(block.feed_forward).__name__ for block in ours.blocks]
    if config.model_type == "qwen3_next":
        dense = set(config.mlp_only_layers)
        assert kinds == ["GatedFeedForward" if i in dense else "MixtureOfExperts" for i in range(len(kinds))]
        assert all(block.feed_forward.shared is not None for i, block in enumerate(ours.blocks) if i not in dense)
    else:
        assert set(kinds) == {"GatedFeedForward"}


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers_at_every_real_token_of_a_padded_batch(name):
    model = hf_model(name)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch(B=3)
    with torch.no_grad():
        expected, got = model(tokens, attention_mask=mask, use_cache=False).logits, ours(tokens, mask)
    real = mask.bool()
    assert expected[real].abs().max() > 1.0
    assert relative_gap(got, expected, real) <= 1e-5


@pytest.mark.parametrize("name", LONG)
def test_logits_equal_transformers_past_its_chunk_of_64(name):
    """80 tokens: transformers' chunked rule crosses a chunk boundary (64), and so does ours. Weights from
    N(0, 0.2) here: over 80 tokens at 0.3, both float32 copies drift about 1e-4 from the float64 model (the state
    carries every token's rounding) and from each other up to 0.9e-5 (seeds 3 to 5), too close to the tolerance
    to tell a bug from rounding; at 0.2 they agree to 4e-6."""
    model = hf_model(name, std=0.2)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch(seed=5, pads=7, length=80)
    with torch.no_grad():
        expected, got = model(tokens, attention_mask=mask, use_cache=False).logits, ours(tokens, mask)
    assert relative_gap(got, expected, mask.bool()) <= 1e-5


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers_in_float64(name):
    """Within 1e-5 as in float32, not closer: transformers computes the gated delta rule in float32 whatever the
    model's dtype (its reference functions cast q, k, v, g and beta to float32). Ours stays in float64 (its
    numpy twin agrees to 1e-10 below)."""
    model = hf_model(name, dtype=torch.float64)
    ours = mt.from_transformers(model)
    tokens, _ = padded_batch(seed=4, pads=0)
    with torch.no_grad():
        expected, got = model(tokens, use_cache=False).logits, ours(tokens)
    assert got.dtype == torch.float64
    assert relative_gap(got, expected, torch.ones_like(tokens, dtype=torch.bool)) <= 1e-5


@pytest.mark.parametrize("name", CONFIGS)
def test_the_numpy_twin_computes_the_same_logits_with_short_chunks_too(name):
    """mnp.transformer_lm (the linear layers through mnp.gated_delta_net, a recurrence) equals the torch face to
    1e-10 in float64, with the model's chunks of 64 and with chunks of 3 (several chunk boundaries in T)."""
    ours = mt.from_transformers(hf_model(name, dtype=torch.float64))
    config = dataclasses.replace(ours.config, linear_attention={**ours.config.linear_attention, "chunk_size": 3})
    short = mt.TransformerLM(config, dtype=torch.float64)
    short.load_state_dict(ours.state_dict())
    tokens, mask = padded_batch(B=3)
    real = mask.bool().numpy()
    got = mnp.transformer_lm(tokens.numpy(), **ours.numpy_params(), attention_mask=mask.numpy())
    for model in (ours, short.eval()):
        with torch.no_grad():
            expected = model(tokens, mask).numpy()
        np.testing.assert_allclose(got[real], expected[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_equal_generates_with_and_without_the_cache(name):
    """8 new tokens for a left-padded batch of 3, on prompts whose top-1 margins exceed 1e-3. Where every layer is
    linear, transformers 5.23's cache cannot run (its get_seq_length asks for an attention layer): ours, cached,
    is compared with its generate(use_cache=False) there."""
    model = hf_model(name)
    ours = mt.from_transformers(model)
    batches = (padded_batch(seed, B=3) for seed in range(6))
    assert_greedy_matches_generate(model, ours, batches, their_cache=name != EVERY_LINEAR)


@pytest.mark.parametrize("name", CONFIGS)
def test_decoding_with_the_cache_equals_the_whole_sequence_and_the_states_do_not_grow(name):
    """Prefill 4 tokens, then one at a time: every step's logits equal the whole sequence's. Each linear layer's
    StateCache holds its recurrent state and its convolution's last inputs, the bytes of mt.gated_delta_state_bytes
    at every step; each full layer's KVCache grows by a position a step."""
    model = hf_model(name)
    ours = mt.from_transformers(model)
    tokens, mask = padded_batch(B=3)
    B, options = len(tokens), ours.config.linear_attention
    state = mt.gated_delta_state_bytes(**{key: options[key] for key in ("n_key_heads", "n_value_heads", "key_head_dim",
                                                                       "value_head_dim", "conv_kernel")},
                                       batch=B, bytes_per_value=4)
    linear, cache = linear_layers(ours), ours.new_cache()
    full = [i for i in range(len(cache)) if i not in linear]
    steps, sizes = [], []
    with torch.no_grad():
        steps.append(ours(tokens[:, :4], mask[:, :4], cache=cache))
        for t in range(4, T):
            sizes.append([cache[i].nbytes for i in linear])
            assert mt.cache_bytes(cache) == len(linear) * state + sum(cache[i].nbytes for i in full)
            assert all(len(cache[i]) == t for i in full)
            steps.append(ours(tokens[:, t:t + 1], mask[:, :t + 1], cache=cache))
        whole = ours(tokens, mask)
    assert relative_gap(torch.cat(steps, dim=1), whole, mask.bool()) <= 1e-5
    assert sizes == [[state] * len(linear)] * len(sizes)
    assert all(cache[i].position == T and cache[i].dropped == 0 for i in linear)


# What is refused, by name ---------------------------------------------------------------------------------


def test_an_mrope_that_is_not_three_sections_or_not_qwen3_5s_is_refused_by_name():
    model = hf_model("qwen3_5, full first, mrope sections, half rotary")
    model.config.rope_parameters["mrope_section"] = [1, 2]
    with pytest.raises(ValueError, match=r"mrope_section=\[1, 2\].*model_type='qwen3_5_text'"):
        mt.from_transformers(model)
    model = hf_model("qwen3_next, linear full linear, 3 of 6 experts, a dense layer")
    model.config.rope_parameters.update(rope_type="linear", factor=2.0, mrope_section=[1, 1, 1])  # not Qwen3.5's
    with pytest.raises(ValueError, match=r"RoPE 'linear' with \['mrope_section'\].*model_type='qwen3_next'"):
        mt.from_transformers(model)


def test_what_a_linear_layer_does_beyond_gated_deltanet_is_refused_by_name():
    model = hf_model("qwen3_5, linear linear full, 2 key heads for 6 value heads")
    model.model.layers[1].linear_attn.norm.variance_epsilon = 1e-3  # one linear layer unlike the other
    with pytest.raises(ValueError, match="linear-attention layers that differ from layer to layer"):
        mt.from_transformers(model)
    model = hf_model("qwen3_next, linear full linear, 3 of 6 experts, a dense layer")
    conv = model.model.layers[2].linear_attn.conv1d
    conv.bias = torch.nn.Parameter(torch.ones(conv.out_channels))
    with pytest.raises(ValueError, match="a bias in the causal convolution of Qwen3NextGatedDeltaNet"):
        mt.from_transformers(model)


def tiny_config(**changes):
    linear = dict(n_key_heads=1, n_value_heads=2, key_head_dim=4, value_head_dim=3)
    options = dict(vocab_size=V, d_model=8, n_layers=3, d_ff=12, attention=dict(n_heads=2, d_head=4),
                   layer_types=("linear", "full", "linear"), linear_attention=linear)
    return mt.LMConfig(**{**options, **changes})


@pytest.mark.parametrize("changes,error,words", [
    (dict(layer_types=("linear", "full")), ValueError, r"layer_types needs one of .* per layer \(n_layers=3\)"),
    (dict(layer_types=("linear", "full", "mamba")), ValueError, r"got \('linear', 'full', 'mamba'\)"),
    (dict(linear_attention=None), TypeError, "linear_attention must be a dict of GatedDeltaNet arguments"),
    (dict(linear_attention=dict(n_key_heads=1, n_value_heads=2, key_head_dim=4)), ValueError,
     r"missing \['value_head_dim'\]"),
    (dict(linear_attention=dict(n_key_heads=1, n_value_heads=2, key_head_dim=4, value_head_dim=3, gate="tanh")),
     ValueError, r"unknown \['gate'\]"),
    (dict(layer_types=()), ValueError, "layer_types names none"),
    (dict(kv_sharing=(0, 0, 2)), ValueError, r"kv_sharing\[1\] = 0: a linear layer has no keys"),
    (dict(attention_type="latent"), ValueError, "attention_type='grouped' layers only"),
])
def test_bad_hybrid_configurations_are_named(changes, error, words):
    with pytest.raises(error, match=words):
        tiny_config(**changes)


def test_a_hybrid_refuses_attention_weights_and_head_masks_by_name():
    ours = mt.from_transformers(hf_model("qwen3_5, linear linear full, 2 key heads for 6 value heads"))
    tokens, mask = padded_batch()
    with pytest.raises(ValueError, match=r"return_weights=True .* layers \[0, 1\] are linear"):
        ours(tokens, mask, return_weights=True)
    with pytest.raises(ValueError, match=r"a head_mask .* layers \[0, 1\] are linear"):
        ours(tokens, head_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"return_weights=True .* layers \[0, 1\] are linear"):
        mnp.transformer_lm(tokens.numpy(), **ours.numpy_params(), return_weights=True)
    assert ours.n_heads == 3
    every_linear = mt.TransformerLM(tiny_config(layer_types=("linear",) * 3, attention={}))
    assert every_linear.n_heads is None and len(linear_layers(every_linear)) == 3
