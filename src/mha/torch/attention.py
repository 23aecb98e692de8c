"""Multi-head attention in PyTorch: the same ideas as `mha.numpy`, as trainable modules.

Same conventions as `mha.numpy`: inputs (..., T, d), boolean masks with True =
"may attend" broadcasting to (..., h, T_q, T_k), a query with nothing to attend
to gets zero weights. Nothing here names a device: every tensor is made on the
device and with the dtype of the input, so the modules run on CPU, GPU or `meta`.

`nn.Linear` stores its weight as (d_out, d_in) and computes x @ weight.T; the
NumPy face uses W of shape (d_in, d_out). `numpy_params()` converts.

`mha.torch.chunked` and `mha.torch.blocks` build on this module.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from mha import validate
from mha.torch.tensors import (at_least_2d, can_overwrite, check_dropout, check_input, check_is_tensor,
                                check_mask_tensor, check_qkv_tensors, check_x_and_context,
                                under_transform)


def masked_softmax(scores, mask=None):
    """Softmax over the last axis where `mask` is True; an empty row gives zeros."""
    check_is_tensor("scores", scores)
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor, got dtype {scores.dtype}")
    if mask is None:
        return scores.softmax(dim=-1)
    check_mask_tensor(mask, scores.shape, like=scores)
    has_any = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
    keep = mask | ~has_any  # an empty row keeps everything, then is zeroed below
    weights = scores.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    return weights * has_any


def masked_softmax_(scores, mask=None):
    """`masked_softmax` written into `scores` itself, when `can_overwrite(scores)`.

    Saves allocating a second (..., T_q, T_k) tensor, which at long T costs about as
    much time as the softmax itself. `scores` must already have the full shape.
    """
    if mask is not None:
        has_any = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
        scores.masked_fill_(~(mask | ~has_any), float("-inf"))
    torch.softmax(scores, dim=-1, out=scores)
    return scores if mask is None else scores.mul_(has_any)


def check_bias_tensor(bias, scores_shape, like):
    """An additive score bias: a floating tensor on `like`'s device that broadcasts to `scores_shape`."""
    check_is_tensor("bias", bias)
    if not bias.is_floating_point():
        raise TypeError(f"bias must be a floating-point tensor, got dtype {bias.dtype}")
    validate.check_bias(bias.shape, scores_shape)
    if bias.device != like.device:
        raise ValueError(f"bias is on {bias.device}, the input on {like.device}: make it with device=x.device")


def additive_mask(bias, mask, dtype):
    """`bias`, and -inf where `mask` is False: one float mask, as F.scaled_dot_product_attention takes."""
    bias = bias.to(dtype)
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


def as_batch_of_matrices(a, batch):
    """(..., T, d) broadcast to `batch` and flattened to (N, T, d), N the product of `batch`:
    a view when `a` is contiguous and already has that batch, else one copy (split heads are views)."""
    return a.expand(*batch, *a.shape[-2:]).reshape(math.prod(batch), *a.shape[-2:])  # (N, T, d)


def scaled_scores(Q, K, batch, scale=None):
    """Q K^T * scale (default 1 / sqrt(d_k)), shape (*batch, T_q, T_k), in one batched product that
    scales as it multiplies: no pass over memory to scale Q, none over the scores to scale them."""
    Q3, K3 = as_batch_of_matrices(Q, batch), as_batch_of_matrices(K, batch)  # (N, T_q, d_k), (N, T_k, d_k)
    scale = 1 / math.sqrt(Q.shape[-1]) if scale is None else scale
    scores = torch.baddbmm(Q3.new_zeros(()), Q3, K3.transpose(-2, -1), beta=0, alpha=scale)  # (N, T_q, T_k)
    return scores.view(*batch, Q.shape[-2], K.shape[-2])  # (..., T_q, T_k)


def soft_cap(x, cap):
    """cap * tanh(x / cap), computed in that order as Gemma 2 does: about x while |x| is small
    against cap, never beyond +-cap. x: a floating tensor of any shape; cap: a number > 0."""
    check_is_tensor("x", x)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    cap = validate.check_cap(cap)
    return (x / cap).tanh() * cap


def scaled_dot_product_attention(Q, K, V, mask=None, dropout=0.0, *, bias=None, scale=None, logit_cap=None):
    """The explicit form: softmax(Q K^T / sqrt(d_k) + bias) V, returning (out, weights).

    Q: (..., T_q, d_k), K: (..., T_k, d_k), V: (..., T_k, d_v); `bias` (e.g. ALiBi's)
    broadcasts to (..., T_q, T_k). `scale` replaces 1 / sqrt(d_k) (Gemma's
    query_pre_attn_scalar ** -0.5); `logit_cap` soft-caps the scores before the bias and
    the mask (Gemma 2). Returns out (..., T_q, d_v) and weights (..., T_q, T_k) (before dropout).
    """
    batch = check_qkv_tensors(Q, K, V)
    if mask is not None:
        check_mask_tensor(mask, (*batch, Q.shape[-2], K.shape[-2]), like=Q)  # the scores' shape
    if bias is not None:
        check_bias_tensor(bias, (*batch, Q.shape[-2], K.shape[-2]), like=Q)
    dtype = Q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype  # half: computed in float32
    Q, K, V = (a.to(work) for a in (Q, K, V))
    scores = scaled_scores(Q, K, batch, validate.check_scale(scale))  # (..., T_q, T_k)
    if logit_cap is not None:
        scores = soft_cap(scores, logit_cap)
    if bias is not None:
        scores = scores + bias.to(work)  # (..., T_q, T_k)
    weights = masked_softmax_(scores, mask) if can_overwrite(scores) else masked_softmax(scores, mask)
    out = (F.dropout(weights, dropout) if dropout else weights) @ V  # (..., T_q, d_v)
    return out.to(dtype), weights.to(dtype)


def split_heads(x, n_heads):
    """(..., T, d) -> (..., h, T, d // h), a view: no copy."""
    check_is_tensor("x", x)
    validate.check_ndim("x", x, 2)
    validate.check_divisible(x.shape[-1], n_heads)
    *batch, T, d = x.shape
    x = x.view(*batch, T, n_heads, d // n_heads)  # (..., T, h, d_head)
    return x.transpose(-3, -2)  # (..., h, T, d_head)


def merge_heads(x):
    """(..., h, T, d_head) -> (..., T, h * d_head): the inverse of `split_heads`."""
    check_is_tensor("x", x)
    validate.check_ndim("x", x, 3)
    *batch, h, T, d_head = x.shape
    x = x.transpose(-3, -2)  # (..., T, h, d_head)
    return x.reshape(*batch, T, h * d_head)  # (..., T, h * d_head)


def causal_mask(T, device=None):
    """(T, T) boolean: query t may attend to keys 0..t."""
    T = validate.check_int("T", T)
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def padding_mask(lengths, T):
    """(B, 1, 1, T) boolean: True at the real keys of each sequence, on lengths' device."""
    T = validate.check_int("T", T)
    lengths = torch.as_tensor(lengths)
    is_integer = not lengths.is_floating_point() and lengths.dtype != torch.bool and not lengths.is_complex()
    values = None if lengths.is_meta else lengths.tolist()
    validate.check_lengths(lengths, is_integer, T, values)
    real = torch.arange(T, device=lengths.device) < lengths[:, None]  # (B, T)
    return real[:, None, None, :]  # (B, 1, 1, T)


def with_causal(mask, T_q, T_k, device):
    """`mask` (or None) and query i attends to keys 0..i, as `is_causal=True` in PyTorch."""
    causal = torch.ones(T_q, T_k, dtype=torch.bool, device=device).tril()  # (T_q, T_k)
    return causal if mask is None else mask & causal


def is_watched(*tensors):
    """Whether autograd would record an operation on these tensors, or a torch.func transform
    or forward-mode AD looks at one of them: then no operation may write into a given `out`."""
    grad = torch.is_grad_enabled()
    return any((grad and t.requires_grad) or under_transform(t) for t in tensors)


def linear_weight(layer):
    """An nn.Linear's weight in the row-vector convention, (d_in, d_out), as NumPy."""
    return layer.weight.detach().T.cpu().numpy()


def linear_bias(layer):
    return None if layer.bias is None else layer.bias.detach().cpu().numpy()


class SymmetricAttention(nn.Module):
    """Chapter 2: one learned W for queries and keys; values are the inputs."""

    def __init__(self, d_model, d_embed, *, device=None, dtype=None):
        super().__init__()
        self.d_model = validate.check_int("d_model", d_model)
        self.W = nn.Linear(d_model, validate.check_int("d_embed", d_embed), bias=False,
                           device=device, dtype=dtype)

    def forward(self, x, mask=None, return_weights=False):
        check_input(self, "x", x, self.d_model)
        e = self.W(x)  # (..., T, d_embed)
        out, weights = scaled_dot_product_attention(e, e, x, mask)  # symmetric scores
        return (out, weights) if return_weights else out

    def numpy_params(self):
        return {"W": linear_weight(self.W)}


class HeadAttention(nn.Module):
    """Chapter 3: one head with its own W_q, W_k and (if `values`) W_v."""

    def __init__(self, d_model, d_head, *, values=True, device=None, dtype=None):
        super().__init__()
        self.d_model = validate.check_int("d_model", d_model)
        validate.check_int("d_head", d_head)
        options = dict(bias=False, device=device, dtype=dtype)
        self.W_q = nn.Linear(d_model, d_head, **options)
        self.W_k = nn.Linear(d_model, d_head, **options)
        self.W_v = nn.Linear(d_model, d_head, **options) if values else None

    def forward(self, x, context=None, mask=None, return_weights=False):
        source, _ = check_x_and_context(self, x, context, self.d_model)
        values = source if self.W_v is None else self.W_v(source)  # (..., T_k, d_v)
        out, weights = scaled_dot_product_attention(self.W_q(x), self.W_k(source), values, mask)
        return (out, weights) if return_weights else out

    def numpy_params(self):
        W_v = None if self.W_v is None else linear_weight(self.W_v)
        return {"W_q": linear_weight(self.W_q), "W_k": linear_weight(self.W_k), "W_v": W_v}


class MultiHeadAttentionLoop(nn.Module):
    """Chapter 4: separate heads run one by one, concatenated, projected by W_o.

    d_head defaults to d_model // n_heads (narrow); d_head=d_model is wide attention.
    """

    def __init__(self, d_model, n_heads, d_head=None, *, device=None, dtype=None):
        super().__init__()
        self.d_model = validate.check_int("d_model", d_model)
        self.n_heads = validate.check_int("n_heads", n_heads)
        if d_head is None:
            validate.check_divisible(d_model, n_heads)
            d_head = d_model // n_heads
        options = dict(device=device, dtype=dtype)
        self.heads = nn.ModuleList(HeadAttention(d_model, d_head, **options) for _ in range(n_heads))
        self.W_o = nn.Linear(n_heads * d_head, d_model, bias=False, **options)

    def forward(self, x, context=None, mask=None, return_weights=False):
        source, batch = check_x_and_context(self, x, context, self.d_model)
        shape = (*batch, self.n_heads, x.shape[-2], source.shape[-2])
        if mask is not None:
            check_mask_tensor(mask, shape, like=x)
            mask = mask.expand(shape)  # (..., h, T_q, T_k)
        results = [head(x, context, None if mask is None else mask[..., i, :, :], return_weights=True)
                   for i, head in enumerate(self.heads)]
        out = self.W_o(torch.cat([out for out, _ in results], dim=-1))  # (..., T_q, d_model)
        weights = torch.stack([w for _, w in results], dim=-3)  # (..., h, T_q, T_k)
        return (out, weights) if return_weights else out

    @classmethod
    def from_fused(cls, fused):
        """The loop that computes what a `MultiHeadAttention` without biases computes:
        head i takes row block i of each nn.Linear weight (column block i of W_q, W_k, W_v)."""
        if not isinstance(fused, MultiHeadAttention) or fused.W_q.bias is not None:
            raise TypeError(f"expected a mha.torch.MultiHeadAttention with bias=False, got {fused!r}")
        weight = fused.W_o.weight
        loop = cls(fused.d_model, fused.n_heads, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for n in "qkv":
                rows = getattr(fused, f"W_{n}").weight.chunk(fused.n_heads, dim=0)  # (d_head, d) each
                for head, block in zip(loop.heads, rows):
                    getattr(head, f"W_{n}").weight.copy_(block)
            loop.W_o.weight.copy_(weight)
        return loop.train(fused.training)

    def numpy_params(self):
        heads = [tuple(head.numpy_params().values()) for head in self.heads]
        return {"heads": heads, "W_o": linear_weight(self.W_o)}


class MultiHeadAttention(nn.Module):
    """Chapter 5: all heads in one projection each for Q, K, V, split logically.

    forward(x, context=None, mask=None, return_weights=False, *, causal=False, bias=None)
    takes PyTorch's fused kernel when weights are not asked for and the explicit form when
    they are. causal=True lets query i attend to keys 0..i only (on top of `mask`,
    if any); without a mask it takes the kernel's own causal path, which never
    builds the mask and skips the blocked half of the scores. `bias` (e.g. ALiBi's,
    (h, T_q, T_k)) is added to the scores; the kernel gets it as a float mask.
    """

    def __init__(self, d_model, n_heads, *, bias=True, dropout=0.0, device=None, dtype=None):
        super().__init__()
        self.d_model = validate.check_int("d_model", d_model)
        validate.check_divisible(d_model, n_heads)
        self.n_heads = n_heads
        self.dropout = check_dropout(dropout)
        options = dict(bias=bias, device=device, dtype=dtype)
        self.W_q = nn.Linear(d_model, d_model, **options)
        self.W_k = nn.Linear(d_model, d_model, **options)
        self.W_v = nn.Linear(d_model, d_model, **options)
        self.W_o = nn.Linear(d_model, d_model, **options)

    def forward(self, x, context=None, mask=None, return_weights=False, *, causal=False, bias=None):
        source, batch = check_x_and_context(self, x, context, self.d_model)
        if mask is not None:
            check_mask_tensor(mask, (*batch, self.n_heads, x.shape[-2], source.shape[-2]), like=x)
            mask = at_least_2d(mask)  # (1, 1) or (1, T_k) for a 0-D or 1-D mask
        if bias is not None:
            check_bias_tensor(bias, (*batch, self.n_heads, x.shape[-2], source.shape[-2]), like=x)
        # weights asked for, or a torch.func transform or forward AD watching (the fused kernels
        # have no forward AD): the explicit form
        explicit = return_weights or any(map(under_transform, (x, source, *self.parameters())))
        if explicit and source is x and self.can_pack(x):
            q, k, v = self.packed_heads(x)  # (..., h, T, d_head) each
        else:
            q = self.heads(self.W_q, x, copy=explicit)  # (..., h, T_q, d_head)
            k = self.heads(self.W_k, source, copy=explicit)  # (..., h, T_k, d_head)
            v = self.heads(self.W_v, source, copy=explicit)  # (..., h, T_k, d_head)
        dropout = self.dropout if self.training else 0.0
        if causal and (explicit or mask is not None or bias is not None):  # these need the mask itself
            mask = with_causal(mask, q.shape[-2], k.shape[-2], x.device)
            causal = False
        if explicit:
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout, bias=bias)
        else:
            attn_mask = mask if bias is None else at_least_2d(additive_mask(bias, mask, q.dtype))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=causal)
        out = self.W_o(merge_heads(out))  # (..., T_q, d_model)
        return (out, weights) if return_weights else out

    def heads(self, layer, x, copy=False):
        """layer(x) split into heads, (..., h, T, d_head): a view, or with `copy` a contiguous
        tensor, which the explicit form needs. Where no autograd or transform watches, the copy
        adds the bias as it goes: on a CPU, nn.Linear writes its bias into the output before the
        product, a pass over memory that this saves (as nn.MultiheadAttention's fast path does)."""
        if not copy or layer.bias is None or is_watched(x, layer.weight, layer.bias):
            return split_heads(layer(x), self.n_heads)  # the explicit form copies it
        heads = split_heads(F.linear(x, layer.weight), self.n_heads)  # (..., h, T, d_head), a view
        bias = layer.bias.view(self.n_heads, 1, -1)  # (h, 1, d_head)
        return torch.add(heads, bias, out=heads.new_empty(heads.shape))  # (..., h, T, d_head), contiguous

    def can_pack(self, x):
        """Whether self-attention's three projections may run as one product: no autograd or
        transform watching, and the three layers alike (all with a bias, or none)."""
        layers = (self.W_q, self.W_k, self.W_v)
        biases = [layer.bias is not None for layer in layers]
        return all(biases) and not is_watched(x, *self.parameters())

    def packed_heads(self, x):
        """q, k, v of self-attention, each (..., h, T, d_head) and contiguous, from one matrix
        product with W_Q, W_K and W_V side by side (one product of width 3d runs faster than
        three of width d, as in nn.MultiheadAttention's packed in_proj_weight), the biases added
        while the heads are laid out."""
        weight = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])  # (3 d_model, d_in)
        bias = torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias])  # (3 d_model,)
        qkv = F.linear(x, weight).unflatten(-1, (3, self.n_heads, -1))  # (..., T, 3, h, d_head), a view
        qkv = qkv.movedim(-3, 0).transpose(-3, -2)  # (3, ..., h, T, d_head), still a view
        bias = bias.view(3, *[1] * (x.dim() - 2), self.n_heads, 1, -1)  # (3, 1.., h, 1, d_head)
        heads = torch.add(qkv, bias, out=qkv.new_empty(qkv.shape))  # (3, ..., h, T, d_head), contiguous
        return heads.unbind(0)

    @classmethod
    def from_torch(cls, m):
        """A copy of a `torch.nn.MultiheadAttention`'s weights (same device and dtype).

        Note the masks: nn.MultiheadAttention's boolean `attn_mask` and
        `key_padding_mask` mean True = "may NOT attend"; ours mean the opposite.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim, "
                             "add_bias_kv=False and add_zero_attn=False can be copied")
        weight = m.in_proj_weight
        ours = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None,
                   dropout=m.dropout, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for layer, w in zip((ours.W_q, ours.W_k, ours.W_v), weight.chunk(3)):
                layer.weight.copy_(w)
            ours.W_o.weight.copy_(m.out_proj.weight)
            if m.in_proj_bias is not None:
                for layer, b in zip((ours.W_q, ours.W_k, ours.W_v), m.in_proj_bias.chunk(3)):
                    layer.bias.copy_(b)
                ours.W_o.bias.copy_(m.out_proj.bias)
        return ours.train(m.training)

    def numpy_params(self):
        """W_q ... b_o for `mha.numpy.multihead_attention`, in the row-vector convention."""
        layers = {"q": self.W_q, "k": self.W_k, "v": self.W_v, "o": self.W_o}
        params = {f"W_{n}": linear_weight(layer) for n, layer in layers.items()}
        params.update({f"b_{n}": linear_bias(layer) for n, layer in layers.items()})
        return params
