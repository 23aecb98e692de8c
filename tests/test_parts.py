"""The parts of today's models beside attention: RMSNorm and the gated feed-forwards.

Each is proven equal to the layer that defines it (torch.nn.RMSNorm; Hugging Face's
LlamaRMSNorm, GemmaRMSNorm, LlamaMLP, GemmaMLP) with the same weights, drawn large
enough that a wrong formula shows, and the NumPy face equal to the PyTorch face.
"""

import numpy as np
import pytest
import torch
from transformers import GemmaConfig, LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

import mha.numpy as mnp
import mha.torch as mt

D, D_FF = 24, 40


def inputs(dtype=torch.float32, scale=3.0, seed=0):
    return scale * torch.randn(2, 7, D, generator=torch.Generator().manual_seed(seed)).to(dtype)  # (B, T, d)


def drawn(module, std=0.5, mean=0.0, seed=1):
    """The module with every weight drawn from N(mean, std^2): far from the default init."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(mean + std * torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.dtype))
    return module


def llama_config():
    return LlamaConfig(hidden_size=D, intermediate_size=D_FF, num_attention_heads=4, num_key_value_heads=2,
                       hidden_act="silu")


def gemma_config(hidden_activation="gelu_pytorch_tanh"):
    return GemmaConfig(hidden_size=D, intermediate_size=D_FF, num_attention_heads=4, num_key_value_heads=1,
                       head_dim=6, hidden_activation=hidden_activation)


# RMSNorm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_equals_torch_rms_norm(dtype):
    theirs = drawn(torch.nn.RMSNorm(D, eps=1e-6, dtype=dtype), mean=1.0)
    ours = mt.RMSNorm(D, eps=1e-6, dtype=dtype)
    ours.weight.data.copy_(theirs.weight.data)
    x = inputs(dtype)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(ours(x), theirs(x), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_equals_llamas_in_every_dtype(dtype):
    theirs = drawn(LlamaRMSNorm(D, eps=1e-5), mean=1.0).to(dtype)
    ours = mt.RMSNorm(D, eps=1e-5, dtype=dtype)
    ours.weight.data.copy_(theirs.weight.data)
    x = inputs(dtype)
    assert torch.equal(ours(x), theirs(x))  # same operations in the same order: bit for bit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unit_offset_equals_gemmas_norm_which_scales_by_one_plus_w_in_float32(dtype):
    theirs = drawn(GemmaRMSNorm(D, eps=1e-6), std=0.7).to(dtype)
    ours = mt.RMSNorm(D, eps=1e-6, unit_offset=True, dtype=dtype)
    ours.weight.data.copy_(theirs.weight.data)
    x = inputs(dtype)
    assert torch.equal(ours(x), theirs(x))
    llama_form = mt.RMSNorm(D, eps=1e-6, dtype=dtype)
    llama_form.weight.data.copy_(1 + theirs.weight.data.float())
    if dtype == torch.bfloat16:  # Llama's order (cast, then scale) rounds twice: not Gemma's numbers
        assert not torch.equal(llama_form(x), theirs(x))


def test_a_fresh_norm_is_the_identity_scale_in_both_forms():
    x = inputs(torch.float64)
    plain, offset = mt.RMSNorm(D, dtype=torch.float64), mt.RMSNorm(D, unit_offset=True, dtype=torch.float64)
    torch.testing.assert_close(plain(x), offset(x), rtol=0, atol=0)
    rms = plain(x).pow(2).mean(-1).sqrt()  # (B, T): each normalised vector has root mean square 1
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-5, atol=0)


@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numpy_rms_norm_equals_the_module(unit_offset, dtype):
    ours = drawn(mt.RMSNorm(D, unit_offset=unit_offset, dtype=dtype), mean=0.0 if unit_offset else 1.0)
    x = inputs(dtype)
    expected = ours(x).detach().numpy()
    got = mnp.rms_norm(x.numpy(), **ours.numpy_params())
    assert got.dtype == expected.dtype
    tolerance = 2e-6 if dtype == torch.float32 else 1e-14
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


def test_rms_norm_differs_from_layer_norm_where_the_mean_is_not_zero():
    x = inputs(torch.float64) + 2.0  # a mean far from 0: LayerNorm removes it, RMSNorm does not
    rms = mt.RMSNorm(D, dtype=torch.float64)(x)
    layer = torch.nn.functional.layer_norm(x, (D,), eps=1e-6)
    assert (rms - layer).abs().max() > 0.5


# Gated feed-forwards -----------------------------------------------------------------------

def test_swiglu_equals_llamas_mlp():
    theirs = drawn(LlamaMLP(llama_config()))
    ours = mt.SwiGLU.from_hf(theirs)
    x = inputs()
    assert isinstance(ours, mt.SwiGLU) and ours.activation == "silu"
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-5)
    assert ours(x).abs().max() > 10  # large enough that a wrong activation would show


def test_geglu_equals_gemmas_mlp_with_tanh_gelu_and_not_exact_gelu():
    theirs = drawn(GemmaMLP(gemma_config()))
    ours = mt.GeGLU.from_hf(theirs)
    x = inputs()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-5)
    with torch.no_grad():  # the same MLP with the exact GELU: a difference the test would see
        exact = ours.W_down(torch.nn.functional.gelu(ours.W_gate(x)) * ours.W_up(x))
    assert (exact - theirs(x)).abs().max() > 1e-3


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numpy_gated_feed_forward_equals_the_module(activation, dtype):
    ours = drawn(mt.GatedFeedForward(D, D_FF, activation=activation, dtype=dtype))
    x = inputs(dtype)
    params = ours.numpy_params()
    named = {"silu": mnp.swiglu, "gelu_tanh": mnp.geglu}[activation]
    got = named(x.numpy(), params["W_gate"], params["W_up"], params["W_down"])
    np.testing.assert_allclose(got, ours(x).detach().numpy(), rtol=1e-5 if dtype == torch.float32 else 1e-12,
                               atol=1e-4 if dtype == torch.float32 else 1e-11)
    np.testing.assert_array_equal(mnp.gated_feed_forward(x.numpy(), **params), got)


def test_silu_is_x_times_sigmoid_and_finite_at_the_extremes():
    x = np.array([-1000.0, -20.0, -1.0, 0.0, 1.0, 20.0, 1000.0])
    expected = torch.nn.functional.silu(torch.tensor(x)).numpy()
    np.testing.assert_allclose(mnp.silu(x), expected, rtol=1e-15, atol=0)
    assert np.all(np.isfinite(mnp.silu(x)))


# Bad input ---------------------------------------------------------------------------------

def test_bad_parts_are_refused_by_name():
    with pytest.raises(ValueError, match='"silu" \\(SwiGLU\\) or "gelu_tanh" \\(GeGLU\\), got \'relu\''):
        mt.GatedFeedForward(D, D_FF, activation="relu")
    with pytest.raises(ValueError, match="activation"):
        mnp.gated_feed_forward(np.ones((2, D)), np.ones((D, 4)), np.ones((D, 4)), np.ones((4, D)), activation="gelu")
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        mt.RMSNorm(D, eps=-1e-6)
    with pytest.raises(TypeError, match="unit_offset must be True or False"):
        mt.RMSNorm(D, unit_offset="gemma")
    with pytest.raises(ValueError, match="weight"):
        mnp.rms_norm(np.ones((3, D)), np.ones(D + 1))
    with pytest.raises(ValueError, match="width"):
        mt.RMSNorm(D)(torch.ones(3, D + 1))


def test_a_gelu_mlp_with_exact_gelu_is_refused_not_copied_as_tanh():
    theirs = GemmaMLP(gemma_config(hidden_activation="gelu"))
    with pytest.raises(ValueError, match="activation 'gelu'"):
        mt.GatedFeedForward.from_hf(theirs)
    with pytest.raises(ValueError, match="uses gelu_tanh, but SwiGLU uses silu"):
        mt.SwiGLU.from_hf(GemmaMLP(gemma_config()))


# Soft-capping -----------------------------------------------------------------------------------

def test_soft_cap_equals_gemma2s_final_logit_capping_and_stays_inside_the_cap():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, final_logit_softcapping=3.0)
    model = drawn(Gemma2ForCausalLM(config), std=0.6).eval()
    tokens = torch.arange(12)[None] % 50
    with torch.no_grad():
        capped = model(tokens).logits  # (1, T, vocab), capped by Gemma 2
        model.config.final_logit_softcapping = None
        raw = model(tokens).logits
    assert raw.abs().max() > 6.0  # far beyond the cap: the test would see a wrong formula
    assert torch.equal(mt.soft_cap(raw, 3.0), capped)
    assert capped.abs().max() < 3.0
    np.testing.assert_allclose(mnp.soft_cap(raw.double().numpy(), 3.0), mt.soft_cap(raw.double(), 3.0).numpy(),
                               rtol=1e-15, atol=1e-15)


def test_soft_cap_is_about_the_identity_far_below_the_cap():
    x = np.linspace(-0.5, 0.5, 11)
    np.testing.assert_allclose(mnp.soft_cap(x, 50.0), x, rtol=1e-4)


@pytest.mark.parametrize("cap", [0, -1.0, True, "30"])
def test_a_cap_that_is_not_positive_is_refused(cap):
    with pytest.raises(ValueError, match="cap must be a number > 0"):
        mt.soft_cap(torch.ones(3), cap)
    with pytest.raises(ValueError, match="cap must be a number > 0"):
        mnp.soft_cap(np.ones(3), cap)
