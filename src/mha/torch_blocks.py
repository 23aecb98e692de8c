"""Chapters 6 and 9 in PyTorch: the encoder block, the decoder block, and stacks of them.

Import these from `mha.torch`; they live in their own file to keep files short.
The arithmetic matches `torch.nn.TransformerEncoderLayer` and
`torch.nn.TransformerDecoderLayer` step for step, dropout included, so their
weights can be copied in and the outputs compared.
"""

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class EncoderBlock(nn.Module):
    """Self-attention and a feed-forward network, each with a residual and a LayerNorm.

    Post-norm (norm_first=False): x = LN_1(x + MHA(x)); x = LN_2(x + FF(x)).
    Pre-norm (norm_first=True):   x = x + MHA(LN_1(x)); x = x + FF(LN_2(x)).
    """

    def __init__(self, d_model, n_heads, d_ff, *, dropout=0.0, norm_first=False, eps=1e-5,
                 activation="relu", bias=True, device=None, dtype=None):
        super().__init__()
        validate.check_activation(activation)
        validate.check_int("d_ff", d_ff)
        options = dict(bias=bias, device=device, dtype=dtype)
        self.d_model, self.norm_first, self.activation = d_model, norm_first, activation
        self.attention = MultiHeadAttention(d_model, n_heads, dropout=dropout, **options)
        self.norm_1 = nn.LayerNorm(d_model, eps=eps, **options)
        self.linear_1 = nn.Linear(d_model, d_ff, **options)
        self.linear_2 = nn.Linear(d_ff, d_model, **options)
        self.norm_2 = nn.LayerNorm(d_model, eps=eps, **options)
        self.dropout_attention = nn.Dropout(dropout)
        self.dropout_hidden = nn.Dropout(dropout)
        self.dropout_ff = nn.Dropout(dropout)

    def attend(self, x, mask, return_weights):
        out = self.attention(x, mask=mask, return_weights=return_weights)
        out, weights = out if return_weights else (out, None)
        return self.dropout_attention(out), weights

    def feed_forward(self, x):
        hidden = self.dropout_hidden(ACTIVATIONS[self.activation](self.linear_1(x)))  # (..., T, d_ff)
        return self.dropout_ff(self.linear_2(hidden))  # (..., T, d_model)

    def forward(self, x, mask=None, return_weights=False):
        check_tensor("x", x, self.d_model)
        if self.norm_first:
            attended, weights = self.attend(self.norm_1(x), mask, return_weights)
            x = x + attended
            x = x + self.feed_forward(self.norm_2(x))
        else:
            attended, weights = self.attend(x, mask, return_weights)
            x = self.norm_1(x + attended)
            x = self.norm_2(x + self.feed_forward(x))
        return (x, weights) if return_weights else x

    @classmethod
    def from_torch(cls, layer):
        """A copy of a `torch.nn.TransformerEncoderLayer` (relu or gelu activation)."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"expected a torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
        kinds = {1: "relu", 2: "gelu"}
        if layer.activation_relu_or_gelu not in kinds:
            raise ValueError("only relu and gelu activations can be copied, got "
                             f"{layer.activation!r}")
        weight = layer.linear1.weight
        ours = cls(layer.linear1.in_features, layer.self_attn.num_heads, layer.linear1.out_features,
                   dropout=layer.dropout.p, norm_first=layer.norm_first, eps=layer.norm1.eps,
                   activation=kinds[layer.activation_relu_or_gelu],
                   bias=layer.linear1.bias is not None, device=weight.device, dtype=weight.dtype)
        ours.attention = MultiHeadAttention.from_torch(layer.self_attn)
        pairs = [(ours.norm_1, layer.norm1), (ours.norm_2, layer.norm2),
                 (ours.linear_1, layer.linear1), (ours.linear_2, layer.linear2)]
        for mine, theirs in pairs:
            mine.load_state_dict(theirs.state_dict())
        return ours.train(layer.training)

    def numpy_params(self):
        """The parameters of `mha.numpy.encoder_block`, row-vector convention."""
        params = self.attention.numpy_params()
        for i, norm in ((1, self.norm_1), (2, self.norm_2)):
            params[f"gamma_{i}"] = norm.weight.detach().cpu().numpy()
            params[f"beta_{i}"] = linear_bias(norm)
        for i, linear in ((1, self.linear_1), (2, self.linear_2)):
            params[f"W_{i}"] = linear_weight(linear)
            params[f"b_{i}"] = linear_bias(linear)
        return params


def copy_stack(cls, stack, torch_type, block_type):
    """Our `cls` (Encoder or Decoder) holding copies of a PyTorch stack's layers."""
    if not isinstance(stack, torch_type):
        raise TypeError(f"expected a torch.nn.{torch_type.__name__}, got {type(stack).__name__}")
    if stack.norm is not None:
        raise ValueError(f"nn.{torch_type.__name__} with a final norm cannot be copied: "
                         f"{cls.__name__} has no final LayerNorm")
    ours = cls.__new__(cls)
    nn.Module.__init__(ours)
    ours.layers = nn.ModuleList(block_type.from_torch(layer) for layer in stack.layers)
    return ours.train(stack.training)


class Encoder(nn.Module):
    """A stack of `n_layers` encoder blocks with the same options."""

    def __init__(self, n_layers, d_model, n_heads, d_ff, **options):
        super().__init__()
        validate.check_int("n_layers", n_layers)
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, n_heads, d_ff, **options) for _ in range(n_layers)
        )

    def forward(self, x, mask=None, return_weights=False):
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, mask=mask, return_weights=True) if return_weights else (layer(x, mask), None)
            all_weights.append(weights)
        return (x, all_weights) if return_weights else x

    @classmethod
    def from_torch(cls, encoder):
        """A copy of a `torch.nn.TransformerEncoder` (without a final norm)."""
        return copy_stack(cls, encoder, nn.TransformerEncoder, EncoderBlock)

    def numpy_params(self):
        """A list with one `mha.numpy.encoder_block` parameter dict per block."""
        return [layer.numpy_params() for layer in self.layers]


def layer_norm(x, gamma, beta, eps=1e-5):
    """Functional twin of `mha.numpy.layer_norm` (what nn.LayerNorm computes)."""
    check_tensor("x", x)
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


# The decoder (chapter 9) ------------------------------------------------------------------

def check_named_mask(name, mask, scores_shape):
    """A boolean mask tensor (or None) that broadcasts to the scores; errors name the mask."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of booleans, got {type(mask).__name__}")
    try:
        validate.check_mask(mask.shape, mask.dtype == torch.bool, scores_shape, mask.dtype)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name}: {error}") from None
    return mask


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output (`memory`), feed-forward.

    Each sublayer has a residual and a LayerNorm, as in `nn.TransformerDecoderLayer`:
    Post-norm: x = LN_1(x + SA(x)); x = LN_2(x + CA(x, memory)); x = LN_3(x + FF(x)).
    Pre-norm:  x = x + SA(LN_1(x)); x = x + CA(LN_2(x), memory); x = x + FF(LN_3(x)).
    """

    def __init__(self, d_model, n_heads, d_ff, *, dropout=0.0, norm_first=False, eps=1e-5,
                 activation="relu", bias=True, device=None, dtype=None):
        super().__init__()
        validate.check_activation(activation)
        validate.check_int("d_ff", d_ff)
        options = dict(bias=bias, device=device, dtype=dtype)
        self.d_model, self.norm_first, self.activation = d_model, norm_first, activation
        self.self_attention = MultiHeadAttention(d_model, n_heads, dropout=dropout, **options)
        self.cross_attention = MultiHeadAttention(d_model, n_heads, dropout=dropout, **options)
        self.norm_1, self.norm_2, self.norm_3 = (nn.LayerNorm(d_model, eps=eps, **options) for _ in range(3))
        self.linear_1 = nn.Linear(d_model, d_ff, **options)
        self.linear_2 = nn.Linear(d_ff, d_model, **options)
        self.dropout_self, self.dropout_cross, self.dropout_hidden, self.dropout_ff = (
            nn.Dropout(dropout) for _ in range(4))

    def masks(self, x, memory, self_mask, memory_mask, causal):
        """Check the inputs; return both masks, the causal mask folded into self_mask if asked."""
        check_tensor("x", x, self.d_model)
        check_tensor("memory", memory, self.d_model, "the decoder block")
        batch = validate.broadcast_batch("x", x.shape[:-2], "memory", memory.shape[:-2])
        h, T, T_k = self.self_attention.n_heads, x.shape[-2], memory.shape[-2]
        self_mask = check_named_mask("self_mask", self_mask, (*batch, h, T, T))
        memory_mask = check_named_mask("memory_mask", memory_mask, (*batch, h, T, T_k))
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

    feed_forward = EncoderBlock.feed_forward  # the same network, with the same attribute names

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
        kinds = {F.relu: "relu", F.gelu: "gelu"}
        if layer.activation not in kinds:
            raise ValueError(f"only relu and gelu activations can be copied, got {layer.activation!r}")
        weight = layer.linear1.weight
        ours = cls(layer.linear1.in_features, layer.self_attn.num_heads, layer.linear1.out_features,
                   dropout=layer.dropout.p, norm_first=layer.norm_first, eps=layer.norm1.eps,
                   activation=kinds[layer.activation], bias=layer.linear1.bias is not None,
                   device=weight.device, dtype=weight.dtype)
        ours.self_attention = MultiHeadAttention.from_torch(layer.self_attn)
        ours.cross_attention = MultiHeadAttention.from_torch(layer.multihead_attn)
        pairs = [(ours.norm_1, layer.norm1), (ours.norm_2, layer.norm2), (ours.norm_3, layer.norm3),
                 (ours.linear_1, layer.linear1), (ours.linear_2, layer.linear2)]
        for mine, theirs in pairs:
            mine.load_state_dict(theirs.state_dict())
        return ours.train(layer.training)

    def numpy_params(self):
        """The parameters of `mha.numpy.decoder_block`, row-vector convention."""
        params = {f"self_{k}": v for k, v in self.self_attention.numpy_params().items()}
        params.update({f"cross_{k}": v for k, v in self.cross_attention.numpy_params().items()})
        for i, norm in enumerate((self.norm_1, self.norm_2, self.norm_3), start=1):
            params[f"gamma_{i}"] = norm.weight.detach().cpu().numpy()
            params[f"beta_{i}"] = linear_bias(norm)
        for i, linear in ((1, self.linear_1), (2, self.linear_2)):
            params[f"W_{i}"] = linear_weight(linear)
            params[f"b_{i}"] = linear_bias(linear)
        return params


class Decoder(nn.Module):
    """A stack of `n_layers` decoder blocks with the same options, all reading the same memory."""

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

    @classmethod
    def from_torch(cls, decoder):
        """A copy of a `torch.nn.TransformerDecoder` (without a final norm)."""
        return copy_stack(cls, decoder, nn.TransformerDecoder, DecoderBlock)

    def numpy_params(self):
        """A list with one `mha.numpy.decoder_block` parameter dict per block."""
        return [layer.numpy_params() for layer in self.layers]


# Imported last, not first: mha.torch imports this module at its own end, so either of
# the two can be imported first (the functions above look these names up when called).
from mha.torch import MultiHeadAttention, causal_mask, check_tensor, linear_bias, linear_weight  # noqa: E402
