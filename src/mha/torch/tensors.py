"""What the PyTorch face accepts, checked before any arithmetic: tensors, masks and modules.

The shape rules are those of `mha.validate`, shared with the NumPy face; this
module adds what only tensors have: a dtype of their own (floating point), a
device, and autograd. `can_overwrite` says when a fast path may write into a
tensor in place.
"""

import torch
from torch.autograd import forward_ad

from mha import validate


def check_is_tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}"
                        + (": convert it with torch.as_tensor" if hasattr(x, "__array__") else ""))


def check_tensor(name, x, width=None, input_name=None):
    """`x` must be a floating tensor of shape (..., T, d), with d == width if given."""
    check_is_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    validate.check_sequence(name, x)
    if width is not None and x.shape[-1] != width:
        raise ValueError(
            f"{name} has shape {validate.shape_str(x.shape)}, so width {x.shape[-1]}, "
            f"but {input_name or 'the module'} expects width {width}"
        )


def check_same_device(name, x, other_name, other):
    if x.device != other.device:
        raise ValueError(f"{name} is on {x.device}, {other_name} on {other.device}: "
                         f"move one with .to({other.device.type!r})")


def check_mask_tensor(mask, scores_shape, name="mask", like=None):
    """A boolean tensor that broadcasts to `scores_shape` (and is on the device of `like`)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of booleans, got {type(mask).__name__}")
    validate.check_named_mask(name, mask.shape, mask.dtype == torch.bool, scores_shape, mask.dtype)
    if like is not None:
        check_same_device(name, mask, "the input", like)


def check_qkv_tensors(Q, K, V):
    """Q, K and V must be floating tensors of one dtype and device that fit together;
    returns their batch shape."""
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        check_tensor(name, a)
    for name, a in (("K", K), ("V", V)):
        if a.dtype != Q.dtype:
            raise TypeError(f"Q has dtype {Q.dtype} but {name} has dtype {a.dtype}: give them one dtype")
        check_same_device(name, a, "Q", Q)
    return validate.check_qkv(Q, K, V)


def check_input(module, name, x, width, input_name=None, *, weight=None):
    """`x` into `module`: a floating tensor (..., T, width) with the dtype and device of its weights.

    `weight`: one of the module's parameters, to compare with; by default the first of
    `module.parameters()`, which a module called once per generated token can spare itself."""
    check_tensor(name, x, width, input_name)
    if weight is None:
        weight = next(module.parameters(), None)
    if weight is None:
        return
    if x.dtype != weight.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but {type(module).__name__}'s parameters are "
                        f"{weight.dtype}: convert one, e.g. {name}.to({weight.dtype}) or module.to({x.dtype})")
    check_same_device(name, x, f"{type(module).__name__}'s parameters", weight)


def check_dropout(p):
    """A dropout probability in [0, 1), checked when the module is made, not at its first call."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ValueError(f"dropout must be a probability in [0, 1), got {p!r}")
    return float(p)


def can_overwrite(t):
    """Whether a fast path may write into `t`: no autograd graph records it, and no
    torch.func transform (vmap, jvp, grad) or forward-mode AD is looking at it."""
    if t.requires_grad or torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    return torch.autograd.forward_ad.unpack_dual(t).tangent is None


def under_transform(x):
    """Whether `x` is seen through a torch.func transform or carries a forward-AD tangent:
    PyTorch's fused attention kernels support neither forward AD nor every transform."""
    if torch._C._functorch.is_functorch_wrapped_tensor(x):
        return True
    # outside a dual level (forward AD's context) no tensor carries a tangent
    return forward_ad._current_level >= 0 and forward_ad.unpack_dual(x).tangent is not None


def check_x_and_context(module, x, context, width):
    """A module's queries `x` and the sequence they attend to (`context`, or x itself):
    both checked by `check_input`; returns that sequence and the batch shape they share."""
    source = x if context is None else context
    check_input(module, "x", x, width)
    check_input(module, "context", source, width)
    return source, validate.broadcast_batch("x", x.shape[:-2], "context", source.shape[:-2])


def at_least_2d(mask):
    """A 0-D or 1-D mask as a (1, 1) or (1, T_k) view: the same broadcast, and a shape
    that PyTorch's fused kernel accepts."""
    return mask if mask is None or mask.dim() >= 2 else mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
