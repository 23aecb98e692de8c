"""Multi-head latent attention (DeepSeek-V2/V3, chapter 17): our MultiHeadLatentAttention equals
transformers' DeepseekV3Attention (random weights, tiny configs, nothing downloaded), its cache holds
exactly the latents and the shared rotary keys, and the absorbed decoding step equals the expanded one
to float64 rounding, in both faces."""

import numpy as np
import pytest
import torch
from transformers import DeepseekV3Config, LlamaConfig
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
from transformers.models.llama import modeling_llama as llama

import mha.numpy as mnp
import mha.torch as mt
from mha.torch.hf.latent import copy_latent_attention, latent_arguments

D_MODEL, H, R, D_NOPE, D_ROPE, D_V = 32, 4, 8, 6, 4, 5
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 0.7, "mscale_all_dim": 0.9, "beta_fast": 32, "beta_slow": 1}


def deepseek_layer(q_lora_rank=None, interleave=False, rope=None, dtype=torch.float32, bias=True, seed=0):
    """A DeepseekV3Attention with random weights (std 0.3, so that the softmax is not flat), and its RoPE."""
    torch.manual_seed(seed)
    config = DeepseekV3Config(hidden_size=D_MODEL, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=R,
                              q_lora_rank=q_lora_rank, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE,
                              v_head_dim=D_V, rope_interleave=interleave, max_position_embeddings=64,
                              attention_bias=bias, rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e4})
    config._attn_implementation = "eager"
    attention = deepseek.DeepseekV3Attention(config, layer_idx=0).to(dtype).eval()
    with torch.no_grad():
        for p in attention.parameters():
            p.normal_(0, 0.3)
    return attention, deepseek.DeepseekV3RotaryEmbedding(config)


def their_forward(attention, rotary, x, lengths=None):
    """Their attention over x (B, T, d), causal, with left padding of T - lengths (as their models mask)."""
    B, T = x.shape[:2]
    lengths = torch.full((B,), T) if lengths is None else torch.as_tensor(lengths)
    real = torch.arange(T)[None] >= (T - lengths)[:, None]  # (B, T): left padding
    positions = (real.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    allowed = torch.ones(T, T, dtype=torch.bool).tril() & real[:, None, None, :]  # (B, 1, T, T)
    additive = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
    with torch.no_grad():
        return attention(x, rotary(x, positions), additive)[0], real, positions


def our_copy(attention, **changes):
    ours = mt.MultiHeadLatentAttention(D_MODEL, **{**latent_arguments(attention), **changes},
                                       dtype=attention.o_proj.weight.dtype)
    return copy_latent_attention(ours, attention)


CASES = [(None, False, None), (12, True, None), (12, False, YARN), (None, True, YARN)]


@pytest.mark.parametrize("q_lora_rank,interleave,rope", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prompt_equals_deepseek_v3_attention(q_lora_rank, interleave, rope, dtype):
    attention, rotary = deepseek_layer(q_lora_rank, interleave, rope, dtype)
    ours = our_copy(attention)
    assert ours.scale == attention.scaling  # YaRN's mscale_all_dim squared, where given
    x = torch.randn(2, 7, D_MODEL, dtype=dtype)
    expected, _, _ = their_forward(attention, rotary, x)
    with torch.no_grad():
        fast, explicit = ours(x)[0], ours(x, return_weights=True)[0]
    # float64: their RMSNorms compute in float32, so agreement is to float32's rounding
    for got in (fast, explicit):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("q_lora_rank,interleave,rope", CASES[:2])
def test_left_padded_prompt_equals_theirs_at_real_tokens(q_lora_rank, interleave, rope):
    attention, rotary = deepseek_layer(q_lora_rank, interleave, rope)
    ours = our_copy(attention)
    x = torch.randn(3, 7, D_MODEL)
    expected, real, positions = their_forward(attention, rotary, x, lengths=[7, 4, 2])
    with torch.no_grad():
        got = ours(x, mask=real[:, None, None, :], positions=positions)[0]
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("absorbed", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decoding_token_by_token_equals_their_prompt(absorbed, dtype):
    attention, rotary = deepseek_layer(12, True, YARN, dtype)
    ours = our_copy(attention, absorbed=absorbed)
    x = torch.randn(2, 6, D_MODEL, dtype=dtype)
    expected, _, _ = their_forward(attention, rotary, x)
    cache = ours.new_cache()
    with torch.no_grad():
        first = ours(x[:, :2], cache=cache)[0]  # a prompt of 2, then one token at a time
        steps = [ours(x[:, t:t + 1], cache=cache)[0] for t in range(2, 6)]
    got = torch.cat([first, *steps], dim=1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


def test_absorbed_module_step_equals_expanded_step_in_float64():
    attention, _ = deepseek_layer(12, True, YARN, torch.float64)
    absorbed, expanded = our_copy(attention), our_copy(attention, absorbed=False)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    padding = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    padding[1, ..., :3] = False  # the second sequence's first 3 keys are padding
    results = []
    for ours in (absorbed, expanded):
        cache = ours.new_cache()
        with torch.no_grad():
            ours(x[:, :8], cache=cache, mask=padding[..., :8])
            results.append(ours(x[:, 8:], cache=cache, mask=padding, return_weights=True))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-12)
    assert results[0][1].shape == (2, H, 1, 9) and (results[0][1][1, ..., :3] == 0).all()


def test_cache_holds_exactly_the_latents_and_the_rotary_keys():
    attention, _ = deepseek_layer(12, True, None, torch.float64)
    ours = our_copy(attention)
    x = torch.randn(3, 5, D_MODEL, dtype=torch.float64)
    cache = ours.new_cache()
    with torch.no_grad():
        ours(x[:, :4], cache=cache)
        ours(x[:, 4:], cache=cache)
        compressed = attention.kv_a_proj_with_mqa(x)
        latents = attention.kv_a_layernorm(compressed[..., :R])
    assert isinstance(cache, mt.LatentCache) and len(cache) == cache.position == 5 and cache.dropped == 0
    assert cache.latents.shape == (3, 5, R) and cache.rotary_keys.shape == (3, 5, D_ROPE)
    assert cache.indexer_keys is None
    torch.testing.assert_close(cache.latents, latents, rtol=0, atol=1e-6)  # their norm computes in float32
    assert cache.nbytes == mt.latent_cache_bytes(1, R, D_ROPE, 5, batch=3, bytes_per_value=8)
    assert cache.nbytes == 3 * 5 * (R + D_ROPE) * 8  # float64: 8 bytes a value
    assert mt.latent_cache_bytes(61, 512, 64, 8192) == mnp.latent_cache_bytes(61, 512, 64, 8192) == 61 * 576 * 8192 * 2
    # against multi-head attention's cache of the same heads: 2 h (d_nope + d_rope) per token, not r + d_rope
    assert mt.kv_cache_bytes(1, H, D_NOPE + D_ROPE, 5, batch=3, bytes_per_value=8) > cache.nbytes


def random_decode_inputs(rng, batch=(2,), h=H, T=7, dtype=np.float64):
    shapes = [(*batch, h, D_NOPE), (*batch, h, D_ROPE), (*batch, T, R), (*batch, T, D_ROPE),  # queries, the cache
              (h, R, D_NOPE), (h, R, D_V)]  # W_uk, W_uv
    return [rng.normal(size=shape).astype(dtype) for shape in shapes]


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_absorbed_decode_equals_expanded_decode_in_float64(batch):
    rng = np.random.default_rng(len(batch))
    inputs = random_decode_inputs(rng, batch)
    mask = rng.random((*batch, H, 7)) > 0.3
    mask[..., 0, :] = False  # head 0 may attend to nothing: zero weights, zero output
    for face, convert in ((mnp, np.asarray), (mt, torch.as_tensor)):
        absorbed = face.absorbed_latent_decode(*map(convert, inputs), 0.3, convert(mask))
        expanded = face.expanded_latent_decode(*map(convert, inputs), 0.3, convert(mask))
        for a, b in zip(absorbed, expanded):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)
        assert (np.asarray(absorbed[0])[..., 0, :] == 0).all() and (np.asarray(absorbed[1])[..., 0, :] == 0).all()
    numpy_out = mnp.absorbed_latent_decode(*inputs, 0.3)
    torch_out = mt.absorbed_latent_decode(*map(torch.as_tensor, inputs), 0.3)
    for a, b in zip(numpy_out, torch_out):
        np.testing.assert_allclose(b.numpy(), a, rtol=0, atol=1e-12)


def test_absorbed_decode_is_the_formula_head_by_head():
    rng = np.random.default_rng(5)
    q_nope, q_rope, latents, rotary_keys, W_uk, W_uv = random_decode_inputs(rng, ())
    out, weights = mnp.absorbed_latent_decode(q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, 0.25)
    for i in range(H):
        keys = np.concatenate([latents @ W_uk[i], rotary_keys], axis=-1)  # (T, d_nope + d_rope)
        scores = 0.25 * keys @ np.concatenate([q_nope[i], q_rope[i]])
        w = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
        np.testing.assert_allclose(weights[i], w, rtol=1e-12)
        np.testing.assert_allclose(out[i], w @ (latents @ W_uv[i]), rtol=1e-12)


def test_float32_stays_float32_and_bad_shapes_are_named():
    inputs = random_decode_inputs(np.random.default_rng(0), dtype=np.float32)
    out, weights = mnp.absorbed_latent_decode(*inputs, np.float64(0.3))
    assert out.dtype == weights.dtype == np.float32
    with pytest.raises(ValueError, match="W_uk has shape"):
        mnp.absorbed_latent_decode(*inputs[:4], inputs[4][:, :, :-1], inputs[5], 0.3)
    with pytest.raises(ValueError, match="do not broadcast"):
        mnp.absorbed_latent_decode(np.zeros((3, H, D_NOPE), np.float32), *inputs[1:], 0.3)


def test_decode_flops_count_the_two_forms():
    deepseek_v3 = dict(n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    counts = mnp.latent_decode_flops(4096, **deepseek_v3)
    assert counts == mt.latent_decode_flops(4096, **deepseek_v3)
    h, r = 128, 512
    assert counts["expanded"] == 4096 * (r * h * 256 + h * 192 + h * 128)
    assert counts["absorbed"] == h * 128 * r + 4096 * h * (2 * r + 64) + h * r * 128
    assert counts["full_cache"] == 4096 * h * (128 + 64 + 128)
    assert counts["expanded"] > 100 * counts["absorbed"]
    one, two = (mnp.latent_decode_flops(T, **deepseek_v3) for T in (1, 2))  # the cost of one more cached token
    assert {form: two[form] - one[form] for form in one} == {"expanded": 16_818_176, "absorbed": 139_264,
                                                             "full_cache": 40_960}


def test_arguments_refuse_what_is_not_computed():
    attention, _ = deepseek_layer()
    arguments = latent_arguments(attention)
    assert arguments == dict(n_heads=H, kv_lora_rank=R, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE,
                             v_head_dim=D_V, q_lora_rank=None, rope_base=1e4, rope_scaling=None, rope_interleave=False,
                             norm_eps=1e-6, scale=attention.scaling, bias=True, indexer=None)
    attention.config.num_key_value_heads = 2
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        latent_arguments(attention)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1)
    with pytest.raises(TypeError, match="DeepseekV3Attention"):
        latent_arguments(llama.LlamaAttention(config, layer_idx=0))
    with pytest.raises(TypeError, match="LatentCache"):
        our_copy(deepseek_layer()[0])(torch.randn(1, 2, D_MODEL), cache=mt.KVCache())


def test_the_config_s_default_key_value_heads_are_read_as_one_per_head():
    """DeepseekV3Config keeps num_key_value_heads=128 unless told otherwise: a tiny model of 4 heads built without
    setting it runs in transformers' sdpa as one key and value per query head (its eager path fails on it), and
    is copied: logits and greedy tokens as transformers' own."""
    from transformers import DeepseekV3ForCausalLM

    config = DeepseekV3Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=4,
                              qk_rope_head_dim=4, v_head_dim=4, first_k_dense_replace=2)
    assert config.num_key_value_heads == 128
    torch.manual_seed(1)  # seed 0 draws a greedy step whose two best logits are 1e-4 apart: not a test of the copy
    model = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # larger than the initialisation: greedy choices clear of ties
            parameter.normal_(0.0, 0.3)
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    ours = mt.from_transformers(model)
    with torch.no_grad():
        theirs = model(tokens).logits
        assert (ours(tokens) - theirs).abs().max() <= 1e-5 * theirs.abs().max()
        prompt = tokens[:, :3]
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
        top_two = model(expected).logits[:, 2:-1].topk(2, dim=-1).values  # (B, 6, 2): each greedy choice's lead
    assert float((top_two[..., 0] - top_two[..., 1]).min()) > 1e-3
    eos = config.eos_token_id  # 1 by default: transformers writes it again once a sequence has ended
    assert torch.equal(ours.generate(prompt, 6, eos_token_id=eos, pad_token_id=eos), expected)


FACE_CASES = [dict(), dict(q_lora_rank=12, rope_interleave=True, bias=True),
              dict(q_lora_rank=12, rope_scaling=YARN, indexer=dict(n_heads=16, head_dim=8, top_k=3))]


@pytest.mark.parametrize("options", FACE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_face_equals_numpy_face(options, dtype):
    torch.manual_seed(3)
    ours = mt.MultiHeadLatentAttention(D_MODEL, H, kv_lora_rank=R, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE,
                                       v_head_dim=D_V, dtype=dtype, **options)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 9, D_MODEL, dtype=dtype)
    padding = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    padding[1, ..., :2] = False
    with torch.no_grad():
        out, weights = ours(x, mask=padding, return_weights=True)
    scaling = {key: value for key, value in (options.get("rope_scaling") or {}).items() if key != "rope_theta"} or None
    expected = mnp.latent_attention(x.numpy(), ours.numpy_params(), n_heads=H, qk_nope_head_dim=D_NOPE,
                                    qk_rope_head_dim=D_ROPE, v_head_dim=D_V, rope_scaling=scaling,
                                    rope_interleave=ours.rope_interleave, indexer=options.get("indexer"),
                                    mask=padding.numpy())
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert expected[0].dtype == (np.float64 if dtype == torch.float64 else np.float32)
    np.testing.assert_allclose(out.numpy(), expected[0], rtol=0, atol=tolerance)
    np.testing.assert_allclose(weights.numpy(), expected[1], rtol=0, atol=tolerance)


def test_the_absorbed_step_never_expands_the_cache():
    attention, _ = deepseek_layer(12, True)
    calls = []
    for absorbed in (True, False):
        ours = our_copy(attention, absorbed=absorbed)
        ours.W_ukv.register_forward_hook(lambda module, inputs, output: calls.append((absorbed, inputs[0].shape)))
        cache = ours.new_cache()
        with torch.no_grad():
            ours(torch.randn(1, 5, D_MODEL), cache=cache)  # the prompt: expanded in both
            ours(torch.randn(1, 1, D_MODEL), cache=cache)  # one token: absorbed, or expanded over all 6
    assert calls == [(True, (1, 5, R)), (False, (1, 5, R)), (False, (1, 6, R))]


def test_absorbed_decode_gradcheck():
    rng = np.random.default_rng(1)
    inputs = [torch.tensor(a, requires_grad=True) for a in random_decode_inputs(rng, (2,), h=2, T=4)]
    inputs[4], inputs[5] = inputs[4][:2].detach().requires_grad_(), inputs[5][:2].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: mt.absorbed_latent_decode(*a, 0.3)[0], inputs)
