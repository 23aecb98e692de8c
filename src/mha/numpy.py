"""Multi-head attention in NumPy: the reference that reads like the math.

Conventions (the same in `mha.torch`):
- inputs are row vectors: shape (..., T, d); leading batch dimensions are optional;
- a projection is `X @ W + b` with `W` of shape (d_in, d_out);
- masks are boolean, True means "may attend", and broadcast to (..., h, T_q, T_k);
- a query that may attend to nothing gets zero weights and a zero output.
"""

import math

import numpy as np
from scipy.special import erf

from mha import validate


def as_float_array(name, x):
    """`x` as a floating-point array; integers become float64, float32 stays float32."""
    x = np.asarray(x)
    if x.dtype == bool or not np.issubdtype(x.dtype, np.number):
        raise TypeError(f"{name} must be an array of numbers, got dtype {x.dtype}")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    return x


def transpose(X):
    """Swap the last two axes: (..., T, d) -> (..., d, T)."""
    return np.swapaxes(X, -1, -2)


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, computed without overflow."""
    x = as_float_array("x", x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))  # the largest entry becomes exp(0) = 1
    return e / e.sum(axis=axis, keepdims=True)


def masked_softmax(scores, mask=None):
    """Softmax over the last axis, keeping only entries where `mask` is True.

    A row with no True entry gets all-zero weights instead of NaN.
    """
    if mask is None:
        return softmax(scores)
    has_any = mask.any(axis=-1, keepdims=True)  # (..., T_q, 1)
    keep = mask | ~has_any  # an empty row keeps everything, then is zeroed below
    weights = softmax(np.where(keep, scores, -np.inf))
    return weights * has_any


def self_attention(X, exclude_self=False):
    """Each output is a softmax-weighted average of the inputs.

    X: (..., T, d). Scores X X^T / sqrt(d); with `exclude_self` a token may not
    attend to itself. Returns out (..., T, d) and weights (..., T, T).
    """
    X = as_float_array("X", X)
    validate.check_sequence("X", X)
    T, d = X.shape[-2:]
    scores = X @ transpose(X) / math.sqrt(d)  # (..., T, T)
    mask = ~np.eye(T, dtype=bool) if exclude_self else None
    weights = masked_softmax(scores, mask)
    return weights @ X, weights


def symmetric_attention(X, W):
    """Attention with one learned matrix W: scores (XW)(XW)^T / sqrt(d_embed).

    X: (..., T, d), W: (d, d_embed). The values are the inputs themselves.
    Returns out (..., T, d) and weights (..., T, T), which come from a
    symmetric score matrix.
    """
    X, W = as_float_array("X", X), as_float_array("W", W)
    validate.check_sequence("X", X)
    validate.check_matrix("W", W, rows=X.shape[-1], input_name="X")
    E = X @ W  # (..., T, d_embed)
    scores = E @ transpose(E) / math.sqrt(W.shape[1])  # (..., T, T), symmetric
    weights = softmax(scores)
    return weights @ X, weights


def scaled_dot_product_attention(Q, K, V, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V, with an optional boolean mask.

    Q: (..., T_q, d_k), K: (..., T_k, d_k), V: (..., T_k, d_v).
    Returns out (..., T_q, d_v) and weights (..., T_q, T_k).
    """
    Q, K, V = (as_float_array(n, a) for n, a in (("Q", Q), ("K", K), ("V", V)))
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        validate.check_sequence(name, a)
    validate.check_same("Q.shape[-1]", Q.shape[-1], "K.shape[-1]", K.shape[-1], "query and key widths")
    validate.check_same("K.shape[-2]", K.shape[-2], "V.shape[-2]", V.shape[-2], "numbers of keys and values")
    batch = validate.broadcast_batch("Q", Q.shape[:-2], "K", K.shape[:-2])
    validate.broadcast_batch("K and Q", batch, "V", V.shape[:-2])
    scores = Q @ transpose(K) / math.sqrt(Q.shape[-1])  # (..., T_q, T_k)
    if mask is not None:
        mask = np.asarray(mask)
        validate.check_mask(mask.shape, mask.dtype == bool, scores.shape, mask.dtype)
    weights = masked_softmax(scores, mask)
    return weights @ V, weights


def head_attention(X, W_q, W_k, W_v=None, *, context=None, mask=None):
    """One attention head: queries from X, keys and values from `context` (default X).

    X: (..., T_q, d), W_q and W_k: (d, d_head), W_v: (d, d_v) or None, in which
    case the values are the inputs themselves. Returns out (..., T_q, d_v) and
    weights (..., T_q, T_k).
    """
    X = as_float_array("X", X)
    source = X if context is None else as_float_array("context", context)
    validate.check_sequence("X", X)
    validate.check_sequence("context", source)
    W_q, W_k = as_float_array("W_q", W_q), as_float_array("W_k", W_k)
    validate.check_matrix("W_q", W_q, rows=X.shape[-1], input_name="X")
    validate.check_matrix("W_k", W_k, rows=source.shape[-1], input_name="context")
    validate.check_same("W_q.shape[1]", W_q.shape[1], "W_k.shape[1]", W_k.shape[1], "query and key widths")
    V = source
    if W_v is not None:
        W_v = as_float_array("W_v", W_v)
        validate.check_matrix("W_v", W_v, rows=source.shape[-1], input_name="context")
        V = source @ W_v  # (..., T_k, d_v)
    return scaled_dot_product_attention(X @ W_q, source @ W_k, V, mask)


def split_heads(X, n_heads):
    """(..., T, d) -> (..., h, T, d // h): each head gets its own column block."""
    X = np.asarray(X)
    validate.check_ndim("X", X, 2)
    validate.check_divisible(X.shape[-1], n_heads)
    *batch, T, d = X.shape
    X = X.reshape(*batch, T, n_heads, d // n_heads)  # (..., T, h, d_head)
    return np.swapaxes(X, -3, -2)  # (..., h, T, d_head)


def merge_heads(X):
    """(..., h, T, d_head) -> (..., T, h * d_head): the inverse of `split_heads`."""
    X = np.asarray(X)
    validate.check_ndim("X", X, 3)
    *batch, h, T, d_head = X.shape
    X = np.swapaxes(X, -3, -2)  # (..., T, h, d_head)
    return X.reshape(*batch, T, h * d_head)  # (..., T, h * d_head)


def attention_shape(X, context, n_heads):
    """The shape of the scores, (..., h, T_q, T_k), once X and context broadcast."""
    batch = validate.broadcast_batch("X", X.shape[:-2], "context", context.shape[:-2])
    return (*batch, n_heads, X.shape[-2], context.shape[-2])


def multihead_attention_loop(X, heads, W_o, *, context=None, mask=None):
    """Several heads, one after another, outputs concatenated and projected by W_o.

    heads: [(W_q_i, W_k_i, W_v_i), ...], any head width (wide or narrow).
    W_o: (sum of the heads' d_v, d_out). Returns out (..., T_q, d_out) and
    weights (..., h, T_q, T_k).
    """
    X = as_float_array("X", X)
    source = X if context is None else as_float_array("context", context)
    validate.check_sequence("X", X)
    validate.check_sequence("context", source)
    if len(heads) < 1:
        raise ValueError("heads must hold at least one (W_q, W_k, W_v) triple, got none")
    shape = attention_shape(X, source, len(heads))
    if mask is not None:
        mask = np.asarray(mask)
        validate.check_mask(mask.shape, mask.dtype == bool, shape, mask.dtype)
        mask = np.broadcast_to(mask, shape)  # (..., h, T_q, T_k)
    outputs, weights = [], []
    for i, (W_q, W_k, W_v) in enumerate(heads):
        head_mask = None if mask is None else mask[..., i, :, :]  # (..., T_q, T_k)
        out, w = head_attention(X, W_q, W_k, W_v, context=context, mask=head_mask)
        outputs.append(out)
        weights.append(w)
    concat = np.concatenate(outputs, axis=-1)  # (..., T_q, h * d_v)
    W_o = as_float_array("W_o", W_o)
    validate.check_matrix("W_o", W_o, rows=concat.shape[-1], input_name="the heads' concatenation")
    return concat @ W_o, np.stack(weights, axis=-3)


def project(name, x, W, b, input_name):
    """x @ W + b, with W: (d_in, d_out) and b: (d_out,) or None."""
    W = as_float_array(name, W)
    validate.check_matrix(name, W, rows=x.shape[-1], input_name=input_name)
    out = x @ W
    if b is not None:
        b = as_float_array("b" + name[1:], b)
        validate.check_vector("b" + name[1:], b, W.shape[1])
        out = out + b
    return out


def multihead_attention(X, W_q, W_k, W_v, W_o, n_heads, *, context=None, mask=None,
                        b_q=None, b_k=None, b_v=None, b_o=None):
    """All heads at once: one projection each for Q, K, V, split, attend, merge, W_o.

    X: (..., T_q, d), W_q/W_k/W_v: (d, d_model), W_o: (d_model, d_out).
    Head i uses column block i of W_q, W_k and W_v. Returns out (..., T_q, d_out)
    and weights (..., h, T_q, T_k).
    """
    X = as_float_array("X", X)
    source = X if context is None else as_float_array("context", context)
    validate.check_sequence("X", X)
    validate.check_sequence("context", source)
    Q = project("W_q", X, W_q, b_q, "X")  # (..., T_q, d_model)
    K = project("W_k", source, W_k, b_k, "context")  # (..., T_k, d_model)
    V = project("W_v", source, W_v, b_v, "context")  # (..., T_k, d_model)
    validate.check_same("W_q.shape[1]", Q.shape[-1], "W_k.shape[1]", K.shape[-1], "query and key widths")
    validate.check_divisible(Q.shape[-1], n_heads)
    validate.check_divisible(V.shape[-1], n_heads)
    Q, K, V = (split_heads(a, n_heads) for a in (Q, K, V))  # (..., h, T, d_head)
    out, weights = scaled_dot_product_attention(Q, K, V, mask)  # (..., h, T_q, d_head)
    return project("W_o", merge_heads(out), W_o, b_o, "the merged heads"), weights


def causal_mask(T):
    """(T, T) boolean: query t may attend to keys 0..t (on and below the diagonal)."""
    T = validate.check_int("T", T)
    return np.tril(np.ones((T, T), dtype=bool))


def padding_mask(lengths, T):
    """(B, 1, 1, T) boolean: True at the real keys of each sequence, False at padding."""
    T = validate.check_int("T", T)
    lengths = np.asarray(lengths)
    validate.check_lengths(lengths, np.issubdtype(lengths.dtype, np.integer), T, lengths.tolist())
    real = np.arange(T) < lengths[:, None]  # (B, T)
    return real[:, None, None, :]  # (B, 1, 1, T)


def layer_norm(X, gamma, beta, eps=1e-5):
    """Normalise each vector over its d features, then scale and shift.

    Uses the biased variance, as torch.nn.LayerNorm does. X: (..., d),
    gamma and beta: (d,) (beta may be None).
    """
    X, gamma = as_float_array("X", X), as_float_array("gamma", gamma)
    validate.check_ndim("X", X, 1)
    validate.check_vector("gamma", gamma, X.shape[-1])
    mean = X.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((X - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1), divided by d
    out = (X - mean) / np.sqrt(var + eps) * gamma
    if beta is not None:
        beta = as_float_array("beta", beta)
        validate.check_vector("beta", beta, X.shape[-1])
        out = out + beta
    return out


def relu(x):
    return np.maximum(x, 0)


def gelu(x):
    """The exact GELU, x * Phi(x), with Phi the standard normal CDF."""
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def feed_forward(X, W_1, b_1, W_2, b_2, activation="relu"):
    """Position-wise feed-forward: activation(X W_1 + b_1) W_2 + b_2.

    X: (..., d), W_1: (d, d_ff), W_2: (d_ff, d). Biases may be None.
    """
    validate.check_activation(activation)
    X = as_float_array("X", X)
    validate.check_ndim("X", X, 1)
    H = project("W_1", X, W_1, b_1, "X")  # (..., d_ff)
    H = relu(H) if activation == "relu" else gelu(H)
    return project("W_2", H, W_2, b_2, "the hidden layer")  # (..., d)


ATTENTION_PARAMS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
BLOCK_PARAMS = ATTENTION_PARAMS + ("gamma_1", "beta_1", "W_1", "b_1", "W_2", "b_2", "gamma_2", "beta_2")
OPTIONAL_PARAMS = ("b_q", "b_k", "b_v", "b_o", "beta_1", "b_1", "b_2", "beta_2")


def check_block_params(params):
    unknown = sorted(set(params) - set(BLOCK_PARAMS))
    missing = [k for k in BLOCK_PARAMS if k not in params and k not in OPTIONAL_PARAMS]
    if unknown or missing:
        raise TypeError(
            f"encoder_block expects parameters {', '.join(BLOCK_PARAMS)} "
            f"(biases and betas may be None); unknown: {unknown}, missing: {missing}"
        )


def encoder_block(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    """Multi-head self-attention and feed-forward, each with a residual and a LayerNorm.

    Post-norm (norm_first=False): X = LN_1(X + MHA(X)); X = LN_2(X + FF(X)).
    Pre-norm (norm_first=True):   X = X + MHA(LN_1(X)); X = X + FF(LN_2(X)).
    X: (..., T, d). Returns out (..., T, d) and weights (..., h, T, T).
    """
    check_block_params(params)
    validate.check_activation(activation)
    p = {k: params.get(k) for k in BLOCK_PARAMS}
    attention = {k: p[k] for k in ATTENTION_PARAMS}

    def norm_1(x):
        return layer_norm(x, p["gamma_1"], p["beta_1"], eps)

    def norm_2(x):
        return layer_norm(x, p["gamma_2"], p["beta_2"], eps)

    def ff(x):
        return feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"], activation)

    X = as_float_array("X", X)
    if norm_first:
        attended, weights = multihead_attention(norm_1(X), n_heads=n_heads, mask=mask, **attention)
        X = X + attended
        return X + ff(norm_2(X)), weights
    attended, weights = multihead_attention(X, n_heads=n_heads, mask=mask, **attention)
    X = norm_1(X + attended)
    return norm_2(X + ff(X)), weights


def encoder(X, layers, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu"):
    """A stack of encoder blocks; `layers` is a list of parameter dicts, one per block.

    Returns out (..., T, d) and a list with each block's weights (..., h, T, T).
    """
    if len(layers) < 1:
        raise ValueError("layers must hold at least one block's parameters, got none")
    all_weights = []
    for params in layers:
        X, weights = encoder_block(X, n_heads, mask=mask, norm_first=norm_first,
                                   eps=eps, activation=activation, **params)
        all_weights.append(weights)
    return X, all_weights


# The decoder (chapter 9) ------------------------------------------------------------------

DECODER_BLOCK_PARAMS = tuple(f"{part}_{name}" for part in ("self", "cross") for name in ATTENTION_PARAMS) + (
    "gamma_1", "beta_1", "gamma_2", "beta_2", "gamma_3", "beta_3", "W_1", "b_1", "W_2", "b_2")


def check_decoder_params(params):
    unknown = sorted(set(params) - set(DECODER_BLOCK_PARAMS))
    optional = ("b_", "beta_", "self_b_", "cross_b_")
    missing = [k for k in DECODER_BLOCK_PARAMS if k not in params and not k.startswith(optional)]
    if unknown or missing:
        raise TypeError(
            "decoder_block expects parameters self_W_q, self_W_k, self_W_v, self_W_o (self-attention), "
            "cross_W_q, cross_W_k, cross_W_v, cross_W_o (cross-attention), gamma_1, gamma_2, gamma_3, "
            "W_1, W_2, and optionally the biases self_b_q ... cross_b_o, b_1, b_2 and beta_1, beta_2, "
            f"beta_3 (None for none); unknown: {unknown}, missing: {missing}"
        )


def check_named_mask(name, mask, scores_shape):
    """`mask` as an array (or None), checked against the scores' shape; errors name the mask."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    try:
        validate.check_mask(mask.shape, mask.dtype == bool, scores_shape, mask.dtype)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name}: {error}") from None
    return mask


def decoder_block(X, memory, n_heads, *, self_mask=None, memory_mask=None, causal=False,
                  norm_first=False, eps=1e-5, activation="relu", **params):
    """Masked self-attention, cross-attention to `memory`, feed-forward; each with residual and LayerNorm.

    Post-norm: X = LN_1(X + SA(X)); X = LN_2(X + CA(X, memory)); X = LN_3(X + FF(X)).
    Pre-norm:  X = X + SA(LN_1(X)); X = X + CA(LN_2(X), memory); X = X + FF(LN_3(X)).
    X: (..., T, d), the target; memory: (..., T_k, d), the encoder's output (never normalised here).
    self_mask broadcasts to (..., h, T, T) and memory_mask to (..., h, T, T_k); causal=True also
    applies causal_mask(T) to the self-attention. params: self_W_q ... self_b_o, cross_W_q ...
    cross_b_o, gamma_1 ... beta_3, W_1, b_1, W_2, b_2. Returns out (..., T, d) and the pair
    (self_weights (..., h, T, T), cross_weights (..., h, T, T_k)).
    """
    check_decoder_params(params)
    validate.check_activation(activation)
    validate.check_int("n_heads", n_heads)
    X, memory = as_float_array("X", X), as_float_array("memory", memory)
    validate.check_sequence("X", X)
    validate.check_sequence("memory", memory)
    validate.check_same("X.shape[-1]", X.shape[-1], "memory.shape[-1]", memory.shape[-1],
                        "widths of X and memory")
    validate.broadcast_batch("X", X.shape[:-2], "memory", memory.shape[:-2])
    self_mask = check_named_mask("self_mask", self_mask, attention_shape(X, X, n_heads))
    memory_mask = check_named_mask("memory_mask", memory_mask, attention_shape(X, memory, n_heads))
    if causal:
        future = causal_mask(X.shape[-2])  # (T, T)
        self_mask = future if self_mask is None else self_mask & future  # allowed only if allowed by both
    p = {k: params.get(k) for k in DECODER_BLOCK_PARAMS}

    def attend(part, x, context, mask):  # part is "self" or "cross"
        weights = {k: p[f"{part}_{k}"] for k in ATTENTION_PARAMS}
        return multihead_attention(x, n_heads=n_heads, context=context, mask=mask, **weights)

    def norm(i, x):
        return layer_norm(x, p[f"gamma_{i}"], p[f"beta_{i}"], eps)

    def ff(x):
        return feed_forward(x, p["W_1"], p["b_1"], p["W_2"], p["b_2"], activation)

    if norm_first:
        attended, self_weights = attend("self", norm(1, X), None, self_mask)
        X = X + attended
        attended, cross_weights = attend("cross", norm(2, X), memory, memory_mask)
        X = X + attended
        return X + ff(norm(3, X)), (self_weights, cross_weights)
    attended, self_weights = attend("self", X, None, self_mask)
    X = norm(1, X + attended)
    attended, cross_weights = attend("cross", X, memory, memory_mask)
    X = norm(2, X + attended)
    return norm(3, X + ff(X)), (self_weights, cross_weights)


def decoder(X, memory, layers, n_heads, *, self_mask=None, memory_mask=None, causal=False,
            norm_first=False, eps=1e-5, activation="relu"):
    """A stack of decoder blocks that all read the same memory; `layers` holds one parameter dict per block.

    Returns out (..., T, d) and a list with each block's (self_weights, cross_weights).
    """
    if len(layers) < 1:
        raise ValueError("layers must hold at least one block's parameters, got none")
    all_weights = []
    for params in layers:
        X, weights = decoder_block(X, memory, n_heads, self_mask=self_mask, memory_mask=memory_mask,
                                   causal=causal, norm_first=norm_first, eps=eps,
                                   activation=activation, **params)
        all_weights.append(weights)
    return X, all_weights


def attention_at_offset(weights, offset):
    """The average weight a query gives to the key `offset` positions away: (..., T_q, T_k) -> (...).

    offset=-1 scores attention to the previous token, +1 to the next one and 0
    to the token itself. Only queries i whose key i + offset exists are
    averaged (T - |offset| of them when T_q = T_k = T): nothing wraps around.
    """
    weights = as_float_array("weights", weights)
    validate.check_ndim("weights", weights, 2)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an integer, got {type(offset).__name__} {offset!r}")
    T_q, T_k = weights.shape[-2:]
    if not -T_q < offset < T_k:
        raise ValueError(f"offset={offset} leaves no query with a key at that distance: "
                         f"weights have T_q={T_q} queries and T_k={T_k} keys")
    return np.diagonal(weights, offset, axis1=-2, axis2=-1).mean(axis=-1)  # weights[..., i, i + offset]


from mha.chunked import chunked_attention  # noqa: E402  (attention in bounded memory, chapter 8)
