"""The parts of today's language models beside attention, as modules (chapter 13).

- `RMSNorm`: equal to torch.nn.RMSNorm and to Llama's LlamaRMSNorm; with
  unit_offset=True, to Gemma's, which stores w, scales by (1 + w) and computes in float32.
- `GatedFeedForward`: act(x W_gate) * (x W_up), then W_down, without biases;
  `SwiGLU` (SiLU, equal to Llama's LlamaMLP) and `GeGLU` (GELU's tanh approximation,
  equal to Gemma's GemmaMLP) are it with the activation fixed.

- `soft_cap`: cap * tanh(x / cap) (Gemma 2's scores and final logits).

The same names and numbers as `mha.numpy.parts` (`rms_norm`, `gated_feed_forward`),
fed by each module's `numpy_params()`.
"""

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.attention import linear_weight, soft_cap  # noqa: F401 (soft_cap is a part too)
from mha.torch.blocks import ACTIVATIONS
from mha.torch.hf import configuration as hf_configuration
from mha.torch.hf import weights as hf_weights
from mha.torch.tensors import check_input

HALF = (torch.float16, torch.bfloat16)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, (..., d) -> (..., d).

    unit_offset=False (Llama, Mistral, Qwen, OLMo): the weight starts at 1, and the
    normalised x is cast back to the input's dtype before the weight multiplies it.
    unit_offset=True (Gemma): the weight starts at 0 and the scale is (1 + weight),
    applied in float32 before the cast. Half-precision inputs are normalised in float32.
    """

    def __init__(self, d_model, eps=1e-6, *, unit_offset=False, device=None, dtype=None):
        super().__init__()
        validate.check_int("d_model", d_model)
        if not isinstance(unit_offset, bool):
            raise TypeError(f"unit_offset must be True or False, got {unit_offset!r}")
        self.eps, self.unit_offset = validate.check_eps(eps), unit_offset
        start = torch.zeros if unit_offset else torch.ones
        self.weight = nn.Parameter(start(d_model, device=device, dtype=dtype))

    def forward(self, x):
        check_input(self, "x", x, self.weight.shape[0], weight=self.weight)
        work = x.float() if x.dtype in HALF else x
        normed = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., d)
        if self.unit_offset:
            return (normed * (1 + self.weight.to(work.dtype))).to(x.dtype)
        return self.weight * normed.to(x.dtype)

    def numpy_params(self):
        """weight (and eps, unit_offset) for `mha.numpy.rms_norm`."""
        return {"weight": self.weight.detach().cpu().numpy(), "eps": self.eps, "unit_offset": self.unit_offset}

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}, unit_offset={self.unit_offset}"


GATES = {"silu": F.silu, "gelu_tanh": ACTIVATIONS["gelu_tanh"]}


class GatedFeedForward(nn.Module):
    """act(x W_gate) * (x W_up), then W_down: (..., T, d_model) -> (..., T, d_model), no biases.

    activation: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU, with GELU's tanh approximation; Shazeer's uses the exact GELU).
    """

    def __init__(self, d_model, d_ff, *, activation="silu", device=None, dtype=None):
        super().__init__()
        if activation not in GATES:
            raise ValueError(f'activation must be "silu" (SwiGLU) or "gelu_tanh" (GeGLU), got {activation!r}')
        validate.check_int("d_model", d_model)
        validate.check_int("d_ff", d_ff)
        options = dict(bias=False, device=device, dtype=dtype)
        self.activation = activation
        self.W_gate = nn.Linear(d_model, d_ff, **options)
        self.W_up = nn.Linear(d_model, d_ff, **options)
        self.W_down = nn.Linear(d_ff, d_model, **options)

    def forward(self, x):
        check_input(self, "x", x, self.W_gate.in_features, weight=self.W_gate.weight)
        return self.W_down(GATES[self.activation](self.W_gate(x)) * self.W_up(x))  # (..., T, d_model)

    def numpy_params(self):
        """W_gate, W_up, W_down (row-vector convention) and activation for `mha.numpy.gated_feed_forward`."""
        return {"W_gate": linear_weight(self.W_gate), "W_up": linear_weight(self.W_up),
                "W_down": linear_weight(self.W_down), "activation": self.activation}

    @classmethod
    def from_hf(cls, mlp):
        """A copy of a Hugging Face gated MLP (gate_proj, up_proj, down_proj, no biases: Llama's,
        Mistral's, Qwen's, Gemma's, OLMo's), with the activation its config names (read, and the
        tensors copied, in `mha.torch.hf`)."""
        gate_proj = hf_weights.gated_projections(mlp)[0]  # a ValueError unless all three are bias-free nn.Linear
        activation = hf_configuration.hf_activation(mlp)
        fixed = getattr(cls, "FIXED_ACTIVATION", None)
        if fixed is not None and fixed != activation:
            raise ValueError(f"{type(mlp).__name__} uses {activation}, but {cls.__name__} uses {fixed}: "
                             f"copy it with GatedFeedForward.from_hf")
        options = dict(device=gate_proj.weight.device, dtype=gate_proj.weight.dtype)
        d_model, d_ff = gate_proj.in_features, gate_proj.out_features
        ours = cls(d_model, d_ff, **options) if fixed else cls(d_model, d_ff, activation=activation, **options)
        hf_weights.copy_gated_feed_forward(ours, mlp)
        return ours.train(mlp.training)


class SwiGLU(GatedFeedForward):
    """Llama's feed-forward: silu(x W_gate) * (x W_up), then W_down."""

    FIXED_ACTIVATION = "silu"

    def __init__(self, d_model, d_ff, *, device=None, dtype=None):
        super().__init__(d_model, d_ff, activation="silu", device=device, dtype=dtype)


class GeGLU(GatedFeedForward):
    """Gemma's feed-forward: gelu_tanh(x W_gate) * (x W_up), then W_down."""

    FIXED_ACTIVATION = "gelu_tanh"

    def __init__(self, d_model, d_ff, *, device=None, dtype=None):
        super().__init__(d_model, d_ff, activation="gelu_tanh", device=device, dtype=dtype)
