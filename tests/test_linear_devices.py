"""Chapter 18's layers on other devices: the chunked rules and GatedDeltaNet make every tensor where their input is
(they run on `meta`, shapes only), and on a GPU, where there is one, they give the CPU's numbers in float32 and
float64, and a bfloat16 layer stays near its float32 self. On a machine without CUDA the GPU cases are skipped and the
CPU cases run: the comparison itself is tested here every time."""

import pytest
import torch

import mha.torch as mt
from conftest import CPU_AND_CUDA, DEVICES, on_device


def inputs(dtype, device, B=2, h=3, T=77, d_k=8, d_v=6, seed=0):
    """q, k (L2-normalised), v, g (log decays in (-1, 0)) and beta, drawn in float64 on the CPU and moved."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (mt.l2_normalize(torch.randn(B, h, T, d_k, generator=gen, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(B, h, T, d_v, generator=gen, dtype=torch.float64)
    g = -torch.rand(B, h, T, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, h, T, generator=gen, dtype=torch.float64)
    return [t.to(device, dtype) for t in (q, k, v, g, beta)]  # the same numbers, rounded to dtype


def layer(seed=0):
    torch.manual_seed(seed)
    net = mt.GatedDeltaNet(32, n_key_heads=2, n_value_heads=4, key_head_dim=8, value_head_dim=6, chunk_size=16)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.2 * torch.randn_like(p))  # off the initial values, so that every part shows
    return net.eval()


@pytest.mark.parametrize("device", DEVICES)
def test_the_chunked_rules_and_the_layer_make_their_tensors_on_the_inputs_device(device):
    q, k, v, g, beta = inputs(torch.float32, device)
    out, state = mt.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=16)
    assert out.device.type == state.device.type == torch.device(device).type
    assert tuple(out.shape) == (2, 3, 77, 6) and tuple(state.shape) == (2, 3, 8, 6)
    out, state = mt.linear_attention_chunked(mt.elu_feature_map(q), mt.elu_feature_map(k), v, chunk_size=16)
    assert out.device.type == state.device.type == torch.device(device).type
    net, cache = on_device(layer(), device), None
    x = torch.randn(2, 20, 32, device=device)
    cache = net.new_cache()
    y = net(x, cache=cache)
    step = net(x[:, :1], cache=cache)
    assert y.device.type == step.device.type == torch.device(device).type
    assert cache.position == 21 and cache.recurrent_state.device.type == torch.device(device).type


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_the_chunked_rule_on_a_device_equals_the_recurrent_rule_in_float64_on_the_cpu(device, dtype, tol):
    q, k, v, g, beta = inputs(dtype, device)
    out, state = mt.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=16)
    ref_out, ref_state = mt.gated_delta_rule_recurrent(*inputs(torch.float64, "cpu"))
    assert out.device.type == torch.device(device).type
    torch.testing.assert_close(out.cpu().double(), ref_out, rtol=0, atol=tol * ref_out.abs().max().item())
    torch.testing.assert_close(state.cpu().double(), ref_state, rtol=0, atol=tol * ref_state.abs().max().item())


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_the_layer_prefill_and_cached_decoding_on_a_device_equal_the_cpu(device):
    net = layer(1)
    x = torch.randn(2, 40, 32, generator=torch.Generator().manual_seed(1))
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[1, :7] = False  # left padding
    with torch.no_grad():
        ref = net.double()(x.double(), keep=keep)
        moved = on_device(net.float(), device)
        cache = moved.new_cache()
        prefill = moved(x[:, :33].to(device), keep=keep[:, :33].to(device), cache=cache)
        steps = [moved(x[:, t:t + 1].to(device), cache=cache) for t in range(33, 40)]
    got = torch.cat([prefill, *steps], dim=1).cpu().double()
    scale = ref.abs().max().item()
    torch.testing.assert_close(got[keep], ref[keep], rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_a_bfloat16_layer_stays_near_its_float32_self(device):
    net = on_device(layer(2), device)
    x = torch.randn(2, 50, 32, generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        full = net(x)
        half = on_device(net, device).to(torch.bfloat16)(x.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16
    gap = (half.float() - full).abs().max().item() / full.abs().max().item()
    assert gap < 0.05, f"bfloat16 output {gap:.3f} of the largest output away from float32"
