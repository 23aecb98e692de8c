"""The mha.torch modules: equal to their NumPy twins, correct gradients, any device."""

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import assert_close

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


@pytest.mark.parametrize("name,module,args", module_cases(), ids=[c[0] for c in module_cases()])
def test_runs_on_meta_tensors(name, module, args):
    """No tensor is made on a fixed device: everything follows the input to `meta`."""
    module = module.to("meta")
    meta_args = [None if a is None else a.to("meta") for a in args]
    out = module(*meta_args)
    assert out.device.type == "meta" and out.shape[:-1] == args[0].shape[:-1]
    if hasattr(module, "forward") and "return_weights" in module.forward.__code__.co_varnames:
        _, weights = module(*meta_args, return_weights=True)
        first = weights[0] if isinstance(weights, list) else weights
        assert first.device.type == "meta"


def test_masks_follow_the_requested_device():
    assert mt.causal_mask(3, device="meta").device.type == "meta"
    assert mt.padding_mask(torch.tensor([1, 2], device="meta"), 3).device.type == "meta"


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
