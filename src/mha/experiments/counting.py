"""What one multi-head attention layer costs, alone and in a block: parameters and multiply-adds.

The layout counted is the one of `mha.torch.MultiHeadAttentionLoop` and
`mha.torch.MultiHeadAttention`: h heads, each with its own W_q, W_k, W_v of
shape (d_model, d_head), then W_o of shape (h * d_head, d_model). Narrow heads
have d_head = d_model / h (the usual choice); wide heads have d_head = d_model.

A multiply-add is one product added to a running sum: a (m, n) @ (n, p) matrix
product costs m * n * p of them. A multiply-add is two floating-point operations
(FLOPs), the unit of PyTorch's FlopCounterMode and of most papers: FLOPs = 2 x
multiply-adds. The counts are for one sequence (batch size 1) and leave out the
cheap parts: biases, the 1/sqrt(d_head) scaling, the softmax, LayerNorm and the
activation.
"""

from dataclasses import dataclass

from mha import validate


def head_width(d_model, n_heads, d_head=None):
    """d_head, or the narrow default d_model // n_heads when it is None."""
    d_model = validate.check_int("d_model", d_model)
    n_heads = validate.check_int("n_heads", n_heads)
    if d_head is None:
        validate.check_divisible(d_model, n_heads)
        return d_model // n_heads
    return validate.check_int("d_head", d_head)


def attention_parameters(d_model, n_heads, d_head=None, bias=False):
    """How many numbers a multi-head attention layer learns.

    Each head has W_q, W_k and W_v of shape (d_model, d_head); W_o has shape
    (n_heads * d_head, d_model). With `bias`, the heads add b_q, b_k, b_v of
    length d_head each and W_o adds b_o of length d_model.
    """
    d_head = head_width(d_model, n_heads, d_head)
    if not isinstance(bias, bool):
        raise TypeError(f"bias must be True or False, got {type(bias).__name__} {bias!r}")
    width = n_heads * d_head  # all heads side by side
    weights = 3 * d_model * width + width * d_model  # W_q, W_k, W_v of every head, then W_o
    biases = 3 * width + d_model if bias else 0
    return weights + biases


@dataclass(frozen=True)
class MultiplyAdds:
    """Multiply-adds of one attention layer, split by where they happen."""

    projections: int  # X W_q, context W_k, context W_v for every head, and the W_o product
    scores: int  # Q K^T in every head: h * T_q * T_k * d_head
    weighted_sum: int  # weights @ V in every head: h * T_q * T_k * d_head

    @property
    def attention(self):
        """The part that grows with T_q * T_k: scores plus weighted sums."""
        return self.scores + self.weighted_sum

    @property
    def total(self):
        return self.projections + self.attention


def attention_multiply_adds(T_q, T_k, d_model, n_heads, d_head=None):
    """Multiply-adds of one forward pass: T_q queries attending to T_k keys.

    Self-attention has T_q == T_k. Returns a `MultiplyAdds` with the projections
    separated from the score and weighted-sum products.
    """
    T_q = validate.check_int("T_q", T_q)
    T_k = validate.check_int("T_k", T_k)
    d_head = head_width(d_model, n_heads, d_head)
    width = n_heads * d_head
    projections = (T_q * d_model * width  # queries: (T_q, d) @ (d, h * d_head)
                   + 2 * T_k * d_model * width  # keys and values: (T_k, d) @ (d, h * d_head)
                   + T_q * width * d_model)  # output: (T_q, h * d_head) @ (h * d_head, d)
    per_product = n_heads * T_q * T_k * d_head  # (T_q, d_head) @ (d_head, T_k), or (T_q, T_k) @ (T_k, d_head)
    return MultiplyAdds(projections=projections, scores=per_product, weighted_sum=per_product)


@dataclass(frozen=True)
class BlockMultiplyAdds:
    """Multiply-adds of one self-attention block: the attention layer, then the feed-forward network."""

    projections: int  # the attention layer's X W_q, X W_k, X W_v and W_o products
    attention: int  # scores and weighted sums: only the allowed (query, key) pairs when causal
    feed_forward: int  # (T, d) @ (d, d_ff), then (T, d_ff) @ (d_ff, d)

    @property
    def total(self):
        return self.projections + self.attention + self.feed_forward


def block_multiply_adds(T, d_model, n_heads, d_ff, d_head=None, causal=False):
    """Multiply-adds of one block on T tokens: self-attention, then the feed-forward network.

    An encoder block, or the block of a decoder-only model (no cross-attention).
    With causal=True only the pairs that the causal mask allows are counted, key
    j <= query i, T (T + 1) / 2 of them: what a kernel that skips the blocked
    scores computes (PyTorch's fused kernel with is_causal=True, up to its tiles
    along the diagonal).
    """
    T = validate.check_int("T", T)
    d_head = head_width(d_model, n_heads, d_head)
    d_ff = validate.check_int("d_ff", d_ff)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
    layer = attention_multiply_adds(T, T, d_model, n_heads, d_head)
    pairs = T * (T + 1) // 2 if causal else T * T  # (query, key) pairs whose score is needed
    return BlockMultiplyAdds(projections=layer.projections,
                             attention=2 * n_heads * pairs * d_head,  # scores, then weighted sums
                             feed_forward=2 * T * d_model * d_ff)  # two products of T * d * d_ff
