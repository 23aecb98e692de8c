"""Chapter 6 in PyTorch: the encoder block and a stack of them.

Import these from `mha.torch`; they live in their own file to keep files short.
The arithmetic matches `torch.nn.TransformerEncoderLayer` step for step,
dropout included, so its weights can be copied in and the outputs compared.
"""

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch import MultiHeadAttention, check_tensor, linear_bias, linear_weight

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
        if not isinstance(encoder, nn.TransformerEncoder):
            raise TypeError(f"expected a torch.nn.TransformerEncoder, got {type(encoder).__name__}")
        if encoder.norm is not None:
            raise ValueError("nn.TransformerEncoder with a final norm cannot be copied: "
                             "Encoder has no final LayerNorm")
        blocks = [EncoderBlock.from_torch(layer) for layer in encoder.layers]
        first = blocks[0]
        ours = cls(1, first.d_model, first.attention.n_heads, first.linear_1.out_features,
                   device=first.linear_1.weight.device, dtype=first.linear_1.weight.dtype)
        ours.layers = nn.ModuleList(blocks)
        return ours.train(encoder.training)

    def numpy_params(self):
        """A list with one `mha.numpy.encoder_block` parameter dict per block."""
        return [layer.numpy_params() for layer in self.layers]


def layer_norm(x, gamma, beta, eps=1e-5):
    """Functional twin of `mha.numpy.layer_norm` (what nn.LayerNorm computes)."""
    check_tensor("x", x)
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


