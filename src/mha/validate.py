"""Input checks shared by `mha.numpy` and `mha.torch`.

Every public function checks its inputs here first, so a learner sees one clear
message ("expected ..., got ...") instead of a broadcasting error from deep
inside NumPy or PyTorch. The checks look only at shapes and dtypes, so the same
code serves both backends.
"""

import numbers


def shape_str(shape):
    """Format a shape like NumPy prints it: (2, 5) or (7,)."""
    return str(tuple(int(n) for n in shape))


def check_int(name, value, minimum=1):
    """`value` must be a Python or NumPy integer >= `minimum` (bool is refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {name}={value}")
    return int(value)


def check_base(base):
    """The base of sinusoidal or rotary wavelengths: a real number greater than 1."""
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1:
        raise ValueError(f"base must be a number greater than 1, got {base!r}")
    return float(base)


def check_eps(eps):
    """A norm's eps: a real number >= 0 (not a bool, not a string). Returns it as a float."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    return float(eps)


def check_cap(cap):
    """A soft cap: a real number > 0. Returns it."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not cap > 0:
        raise ValueError(f"cap must be a number > 0, got {cap!r}")
    return cap


def check_scale(scale):
    """A score scale: None (1 / sqrt(d_k)) or a real number > 0. Returns it."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not scale > 0):
        raise ValueError(f"scale must be None (1 / sqrt(d_k)) or a number > 0, got {scale!r}")
    return scale


def check_even_model_width(d_model):
    """Sines and cosines come in pairs, so d_model must be even."""
    d_model = check_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model={d_model} is odd, but the sinusoidal encoding fills the features "
                         f"in (sin, cos) pairs: d_model must be even")
    return d_model


def check_sequence_length(name, shape, max_len=None):
    """Token ids of shape (..., T): at least one position, and at most max_len when given."""
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"{name} must hold at least one token per sequence, got shape {shape_str(shape)}")
    if max_len is not None and shape[-1] > max_len:
        raise ValueError(f"{name} has T={shape[-1]} positions, but the model knows only max_len={max_len} positions")


def check_ndim(name, x, minimum, maximum=None):
    """`x` must have at least `minimum` (and at most `maximum`) dimensions."""
    ndim = len(x.shape)
    if ndim < minimum or (maximum is not None and ndim > maximum):
        wanted = f"{minimum}" if maximum == minimum else f"at least {minimum}"
        if maximum is not None and maximum != minimum:
            wanted = f"{minimum} to {maximum}"
        raise ValueError(
            f"{name} must have {wanted} dimensions, got {ndim} (shape {shape_str(x.shape)})"
        )


def check_sequence(name, x):
    """A sequence of vectors: shape (..., T, d) with T >= 1 and d >= 1."""
    check_ndim(name, x, 2)
    if x.shape[-2] < 1 or x.shape[-1] < 1:
        raise ValueError(
            f"{name} must have shape (..., T, d) with T >= 1 and d >= 1, "
            f"got shape {shape_str(x.shape)}"
        )


def check_matrix(name, W, rows=None, input_name="the input"):
    """A weight matrix of shape (rows, cols), `rows` matching the input width."""
    if len(W.shape) != 2:
        raise ValueError(
            f"{name} must be a matrix (2 dimensions), got shape {shape_str(W.shape)}"
        )
    if rows is not None and W.shape[0] != rows:
        raise ValueError(
            f"{name} has shape {shape_str(W.shape)}, so it expects vectors of width "
            f"{W.shape[0]}, but {input_name} has width d={rows}"
        )


def check_vector(name, b, length):
    """A bias or scale vector of shape (length,)."""
    if tuple(b.shape) != (length,):
        raise ValueError(f"{name} must have shape ({length},), got shape {shape_str(b.shape)}")


def check_same(name_a, a, name_b, b, what):
    """Two sizes that must agree, e.g. the widths of queries and keys."""
    if a != b:
        raise ValueError(f"{what} must match: {name_a}={a} but {name_b}={b}")


def check_divisible(d_model, n_heads, what="d_model"):
    """`what` (a width, d_model by default) must split evenly into n_heads heads."""
    check_int("n_heads", n_heads)
    if d_model % n_heads != 0:
        raise ValueError(f"{what}={d_model} is not divisible by n_heads={n_heads}: "
                         f"{d_model} = {d_model // n_heads} * {n_heads} + {d_model % n_heads}")


def broadcast_batch(name_a, shape_a, name_b, shape_b):
    """The broadcast of two batch shapes, or a ValueError naming both."""
    a, b = tuple(shape_a), tuple(shape_b)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(
                f"batch dimensions of {name_a} {shape_str(shape_a)} and "
                f"{name_b} {shape_str(shape_b)} do not broadcast"
            )
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


def check_qkv(Q, K, V):
    """Queries (..., T_q, d_k), keys (..., T_k, d_k) and values (..., T_k, d_v) that fit
    together; returns the batch shape (...) they broadcast to."""
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        check_sequence(name, a)
    check_same("Q.shape[-1]", Q.shape[-1], "K.shape[-1]", K.shape[-1], "query and key widths")
    check_same("K.shape[-2]", K.shape[-2], "V.shape[-2]", V.shape[-2], "numbers of keys and values")
    batch = broadcast_batch("Q", Q.shape[:-2], "K", K.shape[:-2])
    return broadcast_batch("K and Q", batch, "V", V.shape[:-2])


def check_named_mask(name, mask_shape, is_bool, scores_shape, dtype_name):
    """`check_mask` for a mask with its own name (self_mask, memory_mask): errors start with it."""
    if name == "mask":
        return check_mask(mask_shape, is_bool, scores_shape, dtype_name)
    try:
        check_mask(mask_shape, is_bool, scores_shape, dtype_name)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name}: {error}") from None


def check_mask(mask_shape, is_bool, scores_shape, dtype_name):
    """A mask must be boolean and broadcast to the scores' shape without growing it."""
    if not is_bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got dtype {dtype_name}"
        )
    mask_shape, scores_shape = tuple(mask_shape), tuple(scores_shape)
    fits = len(mask_shape) <= len(scores_shape) and all(
        m in (1, s) for m, s in zip(reversed(mask_shape), reversed(scores_shape))
    )
    if not fits:
        raise ValueError(
            f"mask has shape {shape_str(mask_shape)} but scores have shape "
            f"{shape_str(scores_shape)}; a mask must broadcast to (..., T_q, T_k) "
            f"of the scores (with heads: (..., h, T_q, T_k))"
        )


def check_lengths(lengths, is_integer, T, values=None):
    """Padding lengths: a 1-D integer array, one length per sequence, each in 0..T.

    `values` is the list of lengths, or None when they cannot be read (meta tensors).
    """
    if len(lengths.shape) != 1:
        raise ValueError(
            f"lengths must be 1-D (one length per batch item), "
            f"got shape {shape_str(lengths.shape)}"
        )
    if not is_integer and lengths.shape[0] > 0:  # an empty list is a batch of no sequence
        raise TypeError(f"lengths must be integers, got dtype {lengths.dtype}")
    for i, n in enumerate(values or []):
        if n < 0 or n > T:
            raise ValueError(f"lengths[{i}]={n} is outside 0..T with T={T}")


ACTIVATIONS = ("relu", "gelu", "gelu_tanh")  # gelu is the exact GELU; gelu_tanh its tanh approximation


def check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f'activation must be "relu" or "gelu", got {activation!r} '
                         f'(or "gelu_tanh", the tanh approximation of GELU)')


def check_causal(causal):
    """`causal` must be True or False: a mask passed in its place is a mistake worth naming."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
    return causal


def check_cache_entries(keys, values, k, v):
    """New keys k and values v (..., h_kv, T_new, d) that fit each other and the cached `keys` and
    `values` (None while the cache is empty): same batch, heads, widths and dtype."""
    for name, a in (("k", k), ("v", v)):
        check_ndim(name, a, 3)
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k has shape {shape_str(k.shape)} but v has shape "
                         f"{shape_str(v.shape)}: they need the same batch, heads and positions")
    if keys is None:
        return
    check_same_layout("batch size", batch_str(keys.shape[:-3]), batch_str(k.shape[:-3]))
    check_same_layout("number of key/value heads", keys.shape[-3], k.shape[-3])
    check_same_layout("key width d_head", keys.shape[-1], k.shape[-1])
    check_same_layout("value width", values.shape[-1], v.shape[-1])
    if k.dtype != keys.dtype or v.dtype != values.dtype:
        raise ValueError(f"the cache holds {keys.dtype} keys and {values.dtype} values, but the new ones are "
                         f"{k.dtype} and {v.dtype}: use one dtype for a whole generation")


def batch_str(batch):
    """A batch shape in words: `3` for (3,), `(2, 3)` for (2, 3), `none` for ()."""
    return "none" if not batch else str(batch[0]) if len(batch) == 1 else shape_str(batch)


def check_same_layout(what, cached, new):
    if cached != new:
        raise ValueError(f"the cache was filled with {what} {cached}, but the new keys have {what} {new}: "
                         f"start a new KVCache() for another batch or another layer")


def check_group_sizes(n_heads, n_kv_heads):
    """Grouped-query attention: h query heads must split evenly over h_kv key/value heads;
    returns h / h_kv, the query heads per key/value head."""
    n_heads, n_kv_heads = check_int("n_heads", n_heads), check_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: each key/value head "
                         f"must serve the same number of query heads")
    return n_heads // n_kv_heads



def check_bias(bias_shape, scores_shape):
    """An additive bias on the scores (ALiBi's) must broadcast to their shape without growing it."""
    bias_shape, scores_shape = tuple(bias_shape), tuple(scores_shape)
    fits = len(bias_shape) <= len(scores_shape) and all(
        b in (1, s) for b, s in zip(reversed(bias_shape), reversed(scores_shape)))
    if not fits:
        raise ValueError(f"bias has shape {shape_str(bias_shape)} but scores have shape "
                         f"{shape_str(scores_shape)}; a bias must broadcast to (..., T_q, T_k) "
                         f"of the scores (with heads: (..., h, T_q, T_k))")


def check_position_table(table_shape, T, d, offset):
    """A (max_len, d) position table that holds positions offset .. offset + T - 1 of a
    sequence of width d."""
    if len(table_shape) != 2:
        raise ValueError(f"the position table must have shape (max_len, d), got shape {shape_str(table_shape)}")
    offset = check_int("offset", offset, minimum=0)
    max_len, width = table_shape
    if width != d:
        raise ValueError(f"the position table has width {width} but X has width d={d}: "
                         f"a table of shape (max_len, d) is added to X")
    if offset + T > max_len:
        raise ValueError(f"sequence of T={T} at offset {offset} needs positions up to {offset + T - 1}, "
                         f"but the position table holds only max_len={max_len} positions")


# Sampling's options (chapter 14), the same in both faces -------------------------------------


def check_temperature(temperature):
    """A temperature: a finite real number > 0 (transformers: "a strictly positive float")."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or \
            not 0 < temperature < float("inf"):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} "
                         f"(for the most likely token every time, use greedy generation)")
    return float(temperature)


def check_top_k(top_k):
    """top_k: None (no top-k filter) or an integer >= 1."""
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be None or an integer >= 1, got {type(top_k).__name__} {top_k!r}")
    if top_k < 1:
        raise ValueError(f"top_k must be None (no filter) or an integer >= 1, got top_k={top_k}")
    return int(top_k)


def check_p(p):
    """top-p's p: a real number in (0, 1]."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    return float(p)


def check_top_p(top_p):
    """top_p: None (no top-p filter) or a real number in (0, 1]."""
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None (no filter) or a number in (0, 1], got {top_p!r}")
    return None if top_p is None else float(top_p)


EXPERT_SCORINGS = ("softmax", "sigmoid")  # a router's scores: a softmax over the experts, or a sigmoid each


def check_routing(n_experts, top_k, scoring, normalize):
    """A router's settings: scoring "softmax" or "sigmoid", normalize a bool, 1 <= top_k <= n_experts."""
    if scoring not in EXPERT_SCORINGS:
        raise ValueError(f'scoring must be "softmax" or "sigmoid", got {scoring!r}')
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be True or False, got {normalize!r}")
    check_int("top_k", top_k)
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} is more than the {n_experts} experts")


def check_groups(n_experts, n_groups, top_groups):
    """Group-limited routing's settings: n_groups equal groups of at least 2 experts, top_groups <= n_groups."""
    check_int("n_groups", n_groups)
    check_int("top_groups", top_groups)
    if n_experts % n_groups:
        raise ValueError(f"{n_experts} experts do not split into n_groups={n_groups} equal groups")
    if n_groups > 1 and n_experts // n_groups < 2:
        raise ValueError(f"a group's score sums its two best experts, but n_groups={n_groups} leaves "
                         f"{n_experts // n_groups} expert per group")
    if top_groups > n_groups:
        raise ValueError(f"top_groups={top_groups} is more than n_groups={n_groups}")
