"""Chapters 6 and 9 in PyTorch: the encoder block, the decoder block, and stacks of them.

Import these from `mha.torch`. They build on `mha.torch.attention`. The arithmetic matches `torch.nn.TransformerEncoderLayer` and
`torch.nn.TransformerDecoderLayer` step for step, dropout included, so their
weights can be copied in and the outputs compared.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.attention import MultiHeadAttention, causal_mask, linear_bias, linear_weight
from mha.torch.tensors import check_dropout, check_input, check_mask_tensor, check_tensor

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


class Dropout(nn.Dropout):
    """nn.Dropout that is the identity when p = 0 or in evaluation mode, without drawing
    random numbers (so that torch.func.vmap needs no randomness flag)."""

    def forward(self, x):
        return x if self.p == 0 or not self.training else super().forward(x)


class FeedForward(nn.Module):
    """The position-wise feed-forward network: linear, activation, dropout, linear, dropout.

    (..., T, d_model) -> (..., T, d_model), through a hidden width d_ff.
    """

    def __init__(self, d_model, d_ff, *, activation="relu", dropout=0.0, bias=True, device=None, dtype=None):
        super().__init__()
        validate.check_activation(activation)
        validate.check_int("d_ff", d_ff)
        options = dict(bias=bias, device=device, dtype=dtype)
        self.activation = activation
        self.linear_1 = nn.Linear(d_model, d_ff, **options)
        self.linear_2 = nn.Linear(d_ff, d_model, **options)
        self.dropout_hidden = Dropout(check_dropout(dropout))
        self.dropout_ff = Dropout(dropout)

    def forward(self, x):
        check_input(self, "x", x, self.linear_1.in_features, weight=self.linear_1.weight)
        hidden = self.dropout_hidden(ACTIVATIONS[self.activation](self.linear_1(x)))  # (..., T, d_ff)
        return self.dropout_ff(self.linear_2(hidden))  # (..., T, d_model)

    def numpy_params(self):
        """W_1, b_1, W_2, b_2 for `mha.numpy.feed_forward`, row-vector convention."""
        return {"W_1": linear_weight(self.linear_1), "b_1": linear_bias(self.linear_1),
                "W_2": linear_weight(self.linear_2), "b_2": linear_bias(self.linear_2)}


def activation_name(layer):
    """ "relu", "gelu" or "gelu_tanh": the activation of a PyTorch Transformer layer, which
    may be a function or a module; any other is refused, never copied as something else."""
    activation = layer.activation
    if activation is F.relu or type(activation) is nn.ReLU:
        return "relu"
    if activation is F.gelu or type(activation) is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}[getattr(activation, "approximate", "none")]
    raise ValueError(f"only relu and gelu activations can be copied (gelu exact or tanh), got {activation!r}")


def block_options(layer):
    """The options of our block that copies `layer`, a PyTorch Transformer encoder or decoder layer."""
    weight = layer.linear1.weight
    return dict(dropout=layer.dropout.p, norm_first=layer.norm_first, eps=layer.norm1.eps,
                activation=activation_name(layer), bias=layer.linear1.bias is not None,
                device=weight.device, dtype=weight.dtype)


def norms_of(block):
    """Our block's LayerNorms in order: norm_1, norm_2 (and norm_3 in a decoder block)."""
    return [getattr(block, f"norm_{i}") for i in range(1, 4) if hasattr(block, f"norm_{i}")]


@torch.no_grad()
def copy_norms_and_feed_forward(block, layer):
    """Load a PyTorch layer's norm1, norm2 (, norm3), linear1 and linear2 into our block."""
    for i, norm in enumerate(norms_of(block), start=1):
        norm.load_state_dict(getattr(layer, f"norm{i}").state_dict())
    block.feed_forward.linear_1.load_state_dict(layer.linear1.state_dict())
    block.feed_forward.linear_2.load_state_dict(layer.linear2.state_dict())
    return block.train(layer.training)


def norm_and_feed_forward_params(block):
    """gamma_i, beta_i of every LayerNorm, and W_1, b_1, W_2, b_2, row-vector convention."""
    params = {}
    for i, norm in enumerate(norms_of(block), start=1):
        params[f"gamma_{i}"] = norm.weight.detach().cpu().numpy()
        params[f"beta_{i}"] = linear_bias(norm)
    return {**params, **block.feed_forward.numpy_params()}


class EncoderBlock(nn.Module):
    """Self-attention and a feed-forward network, each with a residual and a LayerNorm.

    Post-norm (norm_first=False): x = LN_1(x + MHA(x)); x = LN_2(x + FF(x)).
    Pre-norm (norm_first=True):   x = x + MHA(LN_1(x)); x = x + FF(LN_2(x)).
    forward(x, mask=None, return_weights=False, *, causal=False): causal=True lets query t
    attend to keys 0..t only, on top of `mask` (as nn.TransformerEncoderLayer's is_causal with
    a causal mask, or DecoderBlock's causal); without a mask, PyTorch's fused kernel skips the
    blocked half of the scores.
    """

    def __init__(self, d_model, n_heads, d_ff, *, dropout=0.0, norm_first=False, eps=1e-5,
                 activation="relu", bias=True, device=None, dtype=None):
        super().__init__()
        options = dict(bias=bias, device=device, dtype=dtype)
        self.d_model, self.norm_first, self.activation = d_model, norm_first, activation
        self.attention = MultiHeadAttention(d_model, n_heads, dropout=dropout, **options)
        self.norm_1 = nn.LayerNorm(d_model, eps=eps, **options)
        self.feed_forward = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, **options)
        self.norm_2 = nn.LayerNorm(d_model, eps=eps, **options)
        self.dropout_attention = Dropout(dropout)

    def attend(self, x, mask, return_weights, causal):
        out = self.attention(x, mask=mask, return_weights=return_weights, causal=causal)
        out, weights = out if return_weights else (out, None)
        return self.dropout_attention(out), weights

    def forward(self, x, mask=None, return_weights=False, *, causal=False):
        """x: (..., T, d); mask: True = may attend, broadcasting to (..., h, T, T). Returns
        (..., T, d), and with return_weights=True also the weights (..., h, T, T)."""
        check_input(self, "x", x, self.d_model)
        validate.check_causal(causal)
        if self.norm_first:
            attended, weights = self.attend(self.norm_1(x), mask, return_weights, causal)
            x = x + attended
            x = x + self.feed_forward(self.norm_2(x))
        else:
            attended, weights = self.attend(x, mask, return_weights, causal)
            x = self.norm_1(x + attended)
            x = self.norm_2(x + self.feed_forward(x))
        return (x, weights) if return_weights else x

    @classmethod
    def from_torch(cls, layer):
        """A copy of a `torch.nn.TransformerEncoderLayer` (relu or exact gelu activation)."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"expected a torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
        ours = cls(layer.linear1.in_features, layer.self_attn.num_heads, layer.linear1.out_features,
                   **block_options(layer))
        ours.attention = MultiHeadAttention.from_torch(layer.self_attn)
        return copy_norms_and_feed_forward(ours, layer)

    def numpy_params(self):
        """The parameters of `mha.numpy.encoder_block`, row-vector convention."""
        return {**self.attention.numpy_params(), **norm_and_feed_forward_params(self)}


class BlockStack(nn.Module):
    """A stack of blocks of one kind in `self.layers`: the base of `Encoder` and `Decoder`."""

    torch_type = block_type = None  # each subclass names the PyTorch stack it copies, and its block

    @classmethod
    def from_torch(cls, stack):
        """A copy of the PyTorch stack `cls.torch_type` (without a final norm)."""
        if not isinstance(stack, cls.torch_type):
            raise TypeError(f"expected a torch.nn.{cls.torch_type.__name__}, got {type(stack).__name__}")
        if stack.norm is not None:
            raise ValueError(f"nn.{cls.torch_type.__name__} with a final norm cannot be copied: "
                             f"{cls.__name__} has no final LayerNorm")
        ours = cls.__new__(cls)
        nn.Module.__init__(ours)
        ours.layers = nn.ModuleList(cls.block_type.from_torch(layer) for layer in stack.layers)
        return ours.train(stack.training)

    def numpy_params(self):
        """A list with one parameter dict per block, for the NumPy face's stack."""
        return [layer.numpy_params() for layer in self.layers]


class Encoder(BlockStack):
    """A stack of `n_layers` encoder blocks with the same options."""

    torch_type, block_type = nn.TransformerEncoder, EncoderBlock

    def __init__(self, n_layers, d_model, n_heads, d_ff, **options):
        super().__init__()
        validate.check_int("n_layers", n_layers)
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, n_heads, d_ff, **options) for _ in range(n_layers)
        )

    def forward(self, x, mask=None, return_weights=False, *, causal=False):
        """Every block with the same `mask` and `causal`; with return_weights=True also a list
        of each block's weights (..., h, T, T)."""
        all_weights = []
        for layer in self.layers:
            out = layer(x, mask=mask, return_weights=return_weights, causal=causal)
            x, weights = out if return_weights else (out, None)
            all_weights.append(weights)
        return (x, all_weights) if return_weights else x


def layer_norm(x, gamma, beta, eps=1e-5):
    """Functional twin of `mha.numpy.layer_norm` (what nn.LayerNorm computes)."""
    check_tensor("x", x)
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


# The decoder (chapter 9) ------------------------------------------------------------------

class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output (`memory`), feed-forward.

    Each sublayer has a residual and a LayerNorm, as in `nn.TransformerDecoderLayer`:
    Post-norm: x = LN_1(x + SA(x)); x = LN_2(x + CA(x, memory)); x = LN_3(x + FF(x)).
    Pre-norm:  x = x + SA(LN_1(x)); x = x + CA(LN_2(x), memory); x = x + FF(LN_3(x)).
    """

    def __init__(self, d_model, n_heads, d_ff, *, dropout=0.0, norm_first=False, eps=1e-5,
                 activation="relu", bias=True, device=None, dtype=None):
        super().__init__()
        options = dict(bias=bias, device=device, dtype=dtype)
        self.d_model, self.norm_first, self.activation = d_model, norm_first, activation
        self.self_attention = MultiHeadAttention(d_model, n_heads, dropout=dropout, **options)
        self.cross_attention = MultiHeadAttention(d_model, n_heads, dropout=dropout, **options)
        self.norm_1, self.norm_2, self.norm_3 = (nn.LayerNorm(d_model, eps=eps, **options) for _ in range(3))
        self.feed_forward = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, **options)
        self.dropout_self, self.dropout_cross = Dropout(dropout), Dropout(dropout)

    def masks(self, x, memory, self_mask, memory_mask, causal):
        """Check the inputs; return both masks, the causal mask folded into self_mask if asked."""
        check_input(self, "x", x, self.d_model)
        check_input(self, "memory", memory, self.d_model, "the decoder block")
        batch = validate.broadcast_batch("x", x.shape[:-2], "memory", memory.shape[:-2])
        h, T, T_k = self.self_attention.n_heads, x.shape[-2], memory.shape[-2]
        if self_mask is not None:
            check_mask_tensor(self_mask, (*batch, h, T, T), "self_mask", like=x)
        if memory_mask is not None:
            check_mask_tensor(memory_mask, (*batch, h, T, T_k), "memory_mask", like=x)
        if causal:
            future = causal_mask(T, device=x.device)  # (T, T)
            self_mask = future if self_mask is None else self_mask & future  # allowed only if allowed by both
        return self_mask, memory_mask

    def attend(self, which, x, context, mask, return_weights):
        attention, dropout = ((self.self_attention, self.dropout_self) if which == "self"
                              else (self.cross_attention, self.dropout_cross))
        out = attention(x, context=context, mask=mask, return_weights=return_weights)
        out, weights = out if return_weights else (out, None)
        return dropout(out), weights

    def forward(self, x, memory, self_mask=None, memory_mask=None, causal=False, return_weights=False):
        """x: (..., T, d), the target; memory: (..., T_k, d). Masks: True = may attend;
        self_mask broadcasts to (..., h, T, T), memory_mask to (..., h, T, T_k)."""
        self_mask, memory_mask = self.masks(x, memory, self_mask, memory_mask, causal)
        if self.norm_first:
            attended, self_weights = self.attend("self", self.norm_1(x), None, self_mask, return_weights)
            x = x + attended
            attended, cross_weights = self.attend("cross", self.norm_2(x), memory, memory_mask, return_weights)
            x = x + attended
            x = x + self.feed_forward(self.norm_3(x))
        else:
            attended, self_weights = self.attend("self", x, None, self_mask, return_weights)
            x = self.norm_1(x + attended)
            attended, cross_weights = self.attend("cross", x, memory, memory_mask, return_weights)
            x = self.norm_2(x + attended)
            x = self.norm_3(x + self.feed_forward(x))
        return (x, (self_weights, cross_weights)) if return_weights else x

    @classmethod
    def from_torch(cls, layer):
        """A copy of a `torch.nn.TransformerDecoderLayer` (relu or gelu activation).

        Its boolean tgt_mask, memory_mask and key padding masks mean True = "may NOT
        attend"; ours mean the opposite.
        """
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"expected a torch.nn.TransformerDecoderLayer, got {type(layer).__name__}")
        ours = cls(layer.linear1.in_features, layer.self_attn.num_heads, layer.linear1.out_features,
                   **block_options(layer))
        ours.self_attention = MultiHeadAttention.from_torch(layer.self_attn)
        ours.cross_attention = MultiHeadAttention.from_torch(layer.multihead_attn)
        return copy_norms_and_feed_forward(ours, layer)

    def numpy_params(self):
        """The parameters of `mha.numpy.decoder_block`, row-vector convention."""
        params = {f"self_{k}": v for k, v in self.self_attention.numpy_params().items()}
        params.update({f"cross_{k}": v for k, v in self.cross_attention.numpy_params().items()})
        return {**params, **norm_and_feed_forward_params(self)}


class Decoder(BlockStack):
    """A stack of `n_layers` decoder blocks with the same options, all reading the same memory."""

    torch_type, block_type = nn.TransformerDecoder, DecoderBlock

    def __init__(self, n_layers, d_model, n_heads, d_ff, **options):
        super().__init__()
        validate.check_int("n_layers", n_layers)
        self.layers = nn.ModuleList(DecoderBlock(d_model, n_heads, d_ff, **options) for _ in range(n_layers))

    def forward(self, x, memory, self_mask=None, memory_mask=None, causal=False, return_weights=False):
        all_weights = []
        for layer in self.layers:
            out = layer(x, memory, self_mask, memory_mask, causal, return_weights=return_weights)
            x, weights = out if return_weights else (out, None)
            all_weights.append(weights)
        return (x, all_weights) if return_weights else x
