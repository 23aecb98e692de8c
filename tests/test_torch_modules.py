"""The mha.torch modules: equal to their NumPy twins, correct gradients, any device."""

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from mha.experiments.heads import SumOfHeadsAttention
from conftest import DEVICES, assert_close, assert_matches_cpu, on_device

D, H, T = 6, 2, 4
F64 = dict(dtype=torch.float64)


def module_cases():
    """(name, module, forward arguments) for every module, in float64."""
    x = torch.randn(2, T, D, **F64)
    context = torch.randn(2, T + 1, D, **F64)
    mask = mt.causal_mask(T)
    padding = mt.padding_mask(torch.tensor([T + 1, 2]), T + 1)
    return [
        ("symmetric", mt.SymmetricAttention(D, 3, **F64), (x,)),
        ("head", mt.HeadAttention(D, 3, **F64), (x, context, padding[:, 0])),
        ("head-no-values", mt.HeadAttention(D, 3, values=False, **F64), (x, None, mask)),
        ("loop-narrow", mt.MultiHeadAttentionLoop(D, H, **F64), (x, None, mask)),
        ("loop-wide", mt.MultiHeadAttentionLoop(D, H, d_head=D, **F64), (x, context, padding)),
        ("fused", mt.MultiHeadAttention(D, H, **F64), (x, context, padding)),
        ("encoder-block", mt.EncoderBlock(D, H, 10, **F64), (x, mask)),
        ("encoder-pre-gelu", mt.Encoder(2, D, H, 10, norm_first=True, activation="gelu", **F64), (x, mask)),
    ]


@pytest.mark.parametrize("name,module,args", module_cases(), ids=[c[0] for c in module_cases()])
def test_gradcheck(name, module, args):
    """Analytic gradients equal finite differences, for the input and every parameter."""
    names = [n for n, _ in module.named_parameters()]
    leaves = [args[0].clone().requires_grad_()]
    leaves += [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]

    def run(x, *params):
        return torch.func.functional_call(module, dict(zip(names, params)), (x, *args[1:]))

    assert torch.autograd.gradcheck(run, tuple(leaves), eps=1e-6, atol=1e-5)


def test_gradcheck_through_a_fully_masked_row():
    q, k, v = (torch.randn(2, 3, 4, **F64, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False

    def attend(q, k, v):
        return mt.scaled_dot_product_attention(q, k, v, mask)[0]

    assert torch.autograd.gradcheck(attend, (q, k, v))
    attend(q, k, v).sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, 1] == 0).all()


def returns_weights(module):
    """Whether the module's forward takes return_weights=True."""
    return "return_weights" in module.forward.__code__.co_varnames


def input_and_parameter_gradients(module, args):
    """d(sum of squared outputs) with respect to the input and to every parameter."""
    x = args[0].detach().requires_grad_()
    loss = module(x, *args[1:]).square().sum()
    return torch.autograd.grad(loss, [x, *module.parameters()])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,module,args", module_cases(), ids=[c[0] for c in module_cases()])
def test_runs_on_any_device(name, module, args, device):
    """No tensor is made on a fixed device: outputs and weights follow the input to `meta`,
    and on a GPU they equal the CPU's (same weights, same inputs)."""
    module_there = on_device(module, device)
    args_there = [on_device(a, device) for a in args]
    with torch.no_grad():
        assert_matches_cpu(module_there(*args_there), module(*args), device, f"{name} output")
        if returns_weights(module):
            assert_matches_cpu(module_there(*args_there, return_weights=True),
                               module(*args, return_weights=True), device, f"{name} (output, weights)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,module,args", module_cases(), ids=[c[0] for c in module_cases()])
def test_gradients_on_any_device(name, module, args, device):
    """The backward pass follows the input too; on a GPU, the gradients of the input and of
    every parameter equal the CPU's."""
    there = input_and_parameter_gradients(on_device(module, device), [on_device(a, device) for a in args])
    assert_matches_cpu(there, input_and_parameter_gradients(module, args), device, f"{name} gradients")


@pytest.mark.parametrize("device", DEVICES)
def test_masks_follow_the_requested_device(device):
    """causal_mask and padding_mask are made on the device asked for, with the CPU's values."""
    assert_matches_cpu(mt.causal_mask(3, device=device), mt.causal_mask(3), device, "causal mask")
    lengths = torch.tensor([1, 3])
    assert_matches_cpu(mt.padding_mask(lengths.to(device), 3), mt.padding_mask(lengths, 3), device, "padding mask")


def test_symmetric_attention_equals_numpy():
    module = mt.SymmetricAttention(D, 3, **F64)
    x = torch.randn(2, T, D, **F64)
    out, weights = module(x, return_weights=True)
    expected, expected_w = mn.symmetric_attention(x.numpy(), **module.numpy_params())
    assert_close(out, expected)
    assert_close(weights, expected_w)


@pytest.mark.parametrize("values", [True, False])
def test_head_attention_equals_numpy(values):
    module = mt.HeadAttention(D, 4, values=values, **F64)
    x, context = torch.randn(2, T, D, **F64), torch.randn(2, T + 2, D, **F64)
    out, weights = module(x, context, return_weights=True)
    expected, expected_w = mn.head_attention(x.numpy(), context=context.numpy(), **module.numpy_params())
    assert out.shape[-1] == (4 if values else D)
    assert_close(out, expected)
    assert_close(weights, expected_w)


@pytest.mark.parametrize("d_head", [None, D, 5])
def test_loop_module_equals_numpy_loop(d_head):
    module = mt.MultiHeadAttentionLoop(D, 3, d_head, **F64)
    x = torch.randn(2, T, D, **F64)
    mask = mt.padding_mask(torch.tensor([T, 1]), T)
    out, weights = module(x, mask=mask, return_weights=True)
    expected, expected_w = mn.multihead_attention_loop(x.numpy(), mask=mask.numpy(), **module.numpy_params())
    assert_close(out, expected)
    assert_close(weights, expected_w)
    assert weights.shape == (2, 3, T, T)


def test_fast_and_explicit_paths_agree_in_training_without_dropout():
    module = mt.MultiHeadAttention(D, H, **F64).train()
    x = torch.randn(3, T, D, **F64)
    assert_close(module(x, mask=mt.causal_mask(T)), module(x, mask=mt.causal_mask(T), return_weights=True)[0])


def test_dropout_changes_training_outputs_only():
    module = mt.MultiHeadAttention(D, H, dropout=0.5, **F64)
    x = torch.randn(3, T, D, **F64)
    assert not torch.allclose(module(x), module(x))
    module.eval()
    assert torch.equal(module(x), module(x))


def test_torch_layer_norm_twin_equals_numpy():
    x, gamma, beta = torch.randn(2, T, D, **F64), torch.randn(D, **F64), torch.randn(D, **F64)
    assert_close(mt.layer_norm(x, gamma, beta), mn.layer_norm(x.numpy(), gamma.numpy(), beta.numpy()))


def test_modules_train_and_reduce_a_loss():
    """A few steps of SGD on a fixed batch must lower the loss of the fused module."""
    torch.manual_seed(1)
    module = mt.MultiHeadAttention(D, H)
    x, target = torch.randn(8, T, D), torch.randn(8, T, D)
    optimiser = torch.optim.SGD(module.parameters(), lr=0.1)
    losses = []
    for _ in range(20):
        loss = (module(x) - target).square().mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]


def test_numpy_params_follow_the_row_convention():
    module = mt.MultiHeadAttention(4, 2, **F64)
    x = torch.randn(3, 4, **F64)
    params = module.numpy_params()
    assert params["W_q"].shape == (4, 4)
    assert_close(x.numpy() @ params["W_q"] + params["b_q"], module.W_q(x))
    assert isinstance(params["W_o"], np.ndarray)


def constructed_on(device):
    """Every module, built with device=..., and an input for it on that device."""
    options = dict(device=device, dtype=torch.float64)
    x = torch.randn(2, T, D, dtype=torch.float64).to(device)
    return [
        ("symmetric", mt.SymmetricAttention(D, 3, **options), (x,)),
        ("head", mt.HeadAttention(D, 3, **options), (x,)),
        ("loop", mt.MultiHeadAttentionLoop(D, H, **options), (x,)),
        ("sum-of-heads", SumOfHeadsAttention(D, H, **options), (x,)),
        ("fused", mt.MultiHeadAttention(D, H, **options), (x,)),
        ("encoder", mt.Encoder(2, D, H, 10, **options), (x,)),
        ("decoder", mt.Decoder(2, D, H, 10, **options), (x, x)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_modules_are_made_on_the_requested_device(device):
    """device=... puts every parameter there, and the output stays there; on a GPU the
    output equals that of the same module moved to the CPU."""
    for name, module, args in constructed_on(device):
        assert all(p.device.type == device for p in module.parameters()), name
        with torch.no_grad():
            out = module(*args)
            if device != "meta":
                assert_matches_cpu(out, on_device(module, "cpu")(*[a.cpu() for a in args]), device, name)
        assert out.device.type == device and out.shape[:-1] == args[0].shape[:-1], name


@pytest.mark.parametrize("shape", [(5, 16), (2, 5, 16), (2, 3, 5, 16)])
def test_the_packed_self_attention_path_equals_three_separate_projections(shape, monkeypatch):
    """With the weights asked for and no autograd, self-attention projects with W_Q, W_K, W_V side
    by side in one product; it must give what three separate projections give."""
    torch.manual_seed(0)
    layer = mt.MultiHeadAttention(16, 4, dtype=torch.float64).eval()
    x, mask = torch.randn(*shape, dtype=torch.float64), torch.rand(5, 5) > 0.3
    calls = []
    packed_heads = layer.packed_heads
    monkeypatch.setattr(layer, "packed_heads", lambda x: calls.append(x.shape) or packed_heads(x))
    with torch.no_grad():
        packed = layer(x, mask=mask, return_weights=True)
        monkeypatch.setattr(layer, "can_pack", lambda x: False)
        separate = layer(x, mask=mask, return_weights=True)
    assert calls == [x.shape]
    for a, b in zip(packed, separate):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
