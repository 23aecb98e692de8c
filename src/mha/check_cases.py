"""The inputs `mha.checks` tries: seeded random cases and the edge cases that
catch classic mistakes (batch dimensions or none, h = 1, T = 1, a fully masked
row, large logits, d_head != d)."""

from dataclasses import dataclass, field

import numpy as np

import mha.numpy as mn


@dataclass
class Case:
    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


def describe_value(name, value):
    if isinstance(value, np.ndarray):
        return f"{name}: shape {value.shape} {value.dtype}"
    if isinstance(value, dict):
        return f"{name}: {{{', '.join(value)}}}" if name != "params" else "the block's parameters"
    if isinstance(value, list):
        return f"{name}: list of {len(value)}"
    return f"{name}={value!r}"


def rng():
    return np.random.default_rng(2026)


def weights(r, rows, cols):
    return r.standard_normal((rows, cols)) / np.sqrt(rows)


def a_masked_row(T_q, T_k, row):
    mask = np.tril(np.ones((T_q, T_k), dtype=bool))
    mask[row] = False
    return mask


def softmax_cases():
    r = rng()
    return [
        Case("a vector", (r.standard_normal(5),)),
        Case("rows of a matrix", (3 * r.standard_normal((3, 5)),)),
        Case("axis=0 of a matrix", (r.standard_normal((4, 3)),), {"axis": 0}),
        Case("axis=1 of a 3-D array", (r.standard_normal((2, 3, 4)),), {"axis": 1}),
        Case("large logits", (np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]]),)),
    ]


def self_attention_cases():
    r = rng()
    return [
        Case("one sequence", (r.standard_normal((4, 3)),)),
        Case("a batch", (r.standard_normal((2, 5, 3)),)),
        Case("exclude_self", (r.standard_normal((4, 6)),), {"exclude_self": True}),
        Case("T = 1 with exclude_self", (r.standard_normal((1, 3)),), {"exclude_self": True}),
    ]


def symmetric_attention_cases():
    r = rng()
    return [
        Case("W narrower than X", (r.standard_normal((5, 4)), weights(r, 4, 2))),
        Case("a batch, W wider than X", (r.standard_normal((2, 3, 3)), weights(r, 3, 5))),
        Case("T = 1", (r.standard_normal((1, 4)), weights(r, 4, 3))),
    ]


def sdpa_cases():
    r = rng()
    return [
        Case("no mask", (r.standard_normal((4, 3)), r.standard_normal((5, 3)), r.standard_normal((5, 2)))),
        Case("a query with nothing to attend to",
             (r.standard_normal((4, 3)), r.standard_normal((5, 3)), r.standard_normal((5, 2))),
             {"mask": a_masked_row(4, 5, 2)}),
        Case("batch and heads with a causal mask",
             tuple(r.standard_normal((2, 3, 4, 5)) for _ in range(3)), {"mask": mn.causal_mask(4)}),
        Case("T = 1", tuple(r.standard_normal((1, 3)) for _ in range(3))),
    ]


def head_attention_cases():
    r = rng()
    X = r.standard_normal((5, 4))
    return [
        Case("no W_v: values are the inputs", (X, weights(r, 4, 2), weights(r, 4, 2))),
        Case("with W_v", (X, weights(r, 4, 3), weights(r, 4, 3), weights(r, 4, 2))),
        Case("a batch with a masked row",
             (r.standard_normal((2, 4, 4)), weights(r, 4, 2), weights(r, 4, 2), weights(r, 4, 3)),
             {"mask": a_masked_row(4, 4, 1)}),
        Case("context (cross-attention)",
             (X, weights(r, 4, 2), weights(r, 6, 2), weights(r, 6, 3)),
             {"context": r.standard_normal((3, 6))}),
    ]


def split_heads_cases():
    r = rng()
    return [
        Case("one sequence, 2 heads", (r.standard_normal((5, 6)), 2)),
        Case("a batch, 3 heads", (r.standard_normal((2, 4, 6)), 3)),
        Case("h = 1", (r.standard_normal((3, 4)), 1)),
        Case("d_head = 1", (r.standard_normal((2, 3, 4)), 4)),
    ]


def merge_heads_cases():
    r = rng()
    return [
        Case("2 heads", (r.standard_normal((2, 4, 3)),)),
        Case("a batch, 3 heads", (r.standard_normal((2, 3, 5, 2)),)),
        Case("h = 1", (r.standard_normal((1, 3, 4)),)),
    ]


def attention_params(r, d, bias=True):
    params = {f"W_{n}": weights(r, d, d) for n in "qkvo"}
    if bias:
        params.update({f"b_{n}": 0.3 * r.standard_normal(d) for n in "qkvo"})
    return params


def loop_cases():
    r = rng()
    narrow = [(weights(r, 6, 3), weights(r, 6, 3), weights(r, 6, 3)) for _ in range(2)]
    wide = [(weights(r, 4, 4), weights(r, 4, 4), weights(r, 4, 4)) for _ in range(3)]
    return [
        Case("2 narrow heads", (r.standard_normal((5, 6)), narrow, weights(r, 6, 6))),
        Case("3 wide heads, a batch, causal", (r.standard_normal((2, 4, 4)), wide, weights(r, 12, 4)),
             {"mask": mn.causal_mask(4)}),
        Case("1 head", (r.standard_normal((3, 6)), narrow[:1], weights(r, 3, 6))),
    ]


def multihead_cases():
    r = rng()
    X = r.standard_normal((3, 5, 6))
    return [
        Case("a batch with padding", (X,), {**attention_params(r, 6), "n_heads": 2,
                                             "mask": mn.padding_mask([5, 3, 1], 5)}),
        Case("causal, 3 heads", (X,), {**attention_params(r, 6), "n_heads": 3, "mask": mn.causal_mask(5)}),
        Case("h = 1, no biases", (X[0],), {**attention_params(r, 6, bias=False), "n_heads": 1}),
        Case("cross-attention with a masked row", (X[0],),
             {**attention_params(r, 6), "n_heads": 2, "context": r.standard_normal((4, 6)),
              "mask": a_masked_row(5, 4, 3)}),
    ]


def causal_mask_cases():
    return [Case("T = 1", (1,)), Case("T = 4", (4,)), Case("T = 7", (7,))]


def padding_mask_cases():
    return [Case("three lengths", (np.array([3, 5, 0]), 5)), Case("one sequence", (np.array([2]), 4))]


def layer_norm_cases():
    r = rng()
    X = 2 + 3 * r.standard_normal((2, 4, 6))
    gamma, beta = 1 + 0.5 * r.standard_normal(6), r.standard_normal(6)
    return [
        Case("a batch", (X, gamma, beta)),
        Case("one vector", (X[0, 0], gamma, beta)),
        Case("a large eps", (X[0], gamma, beta), {"eps": 0.5}),
    ]


def feed_forward_cases():
    r = rng()
    X = r.standard_normal((2, 3, 4))
    params = (weights(r, 4, 8), r.standard_normal(8), weights(r, 8, 4), r.standard_normal(4))
    return [
        Case("relu", (X, *params)),
        Case("gelu", (X, *params), {"activation": "gelu"}),
    ]


def encoder_block_cases():
    r = rng()
    params = attention_params(r, 6)
    params.update({
        "gamma_1": 1 + 0.3 * r.standard_normal(6), "beta_1": 0.3 * r.standard_normal(6),
        "W_1": weights(r, 6, 10), "b_1": 0.3 * r.standard_normal(10),
        "W_2": weights(r, 10, 6), "b_2": 0.3 * r.standard_normal(6),
        "gamma_2": 1 + 0.3 * r.standard_normal(6), "beta_2": 0.3 * r.standard_normal(6),
    })
    X = r.standard_normal((2, 4, 6))
    return [
        Case("post-norm with padding", (X, 2), {**params, "mask": mn.padding_mask([4, 2], 4)}),
        Case("pre-norm, gelu", (X, 3), {**params, "norm_first": True, "activation": "gelu"}),
    ]


CASES = {
    "softmax": softmax_cases, "self_attention": self_attention_cases,
    "symmetric_attention": symmetric_attention_cases, "head_attention": head_attention_cases,
    "scaled_dot_product_attention": sdpa_cases, "split_heads": split_heads_cases,
    "merge_heads": merge_heads_cases, "multihead_attention_loop": loop_cases,
    "multihead_attention": multihead_cases, "causal_mask": causal_mask_cases,
    "padding_mask": padding_mask_cases, "layer_norm": layer_norm_cases,
    "feed_forward": feed_forward_cases, "encoder_block": encoder_block_cases,
}
# How each function returns: True for (out, weights), False for one array, or a
# tuple of part names (nested for nested results). The checks compare part by part.
PAIRS = {name: name in {"self_attention", "symmetric_attention", "head_attention",
                        "scaled_dot_product_attention", "multihead_attention_loop",
                        "multihead_attention", "encoder_block"} for name in CASES}


def decoder_block_params(r, d, d_ff, bias=True):
    """Every parameter of mha.numpy.decoder_block; with bias=False the biases and betas are None."""
    params = {f"{part}_{k}": v for part in ("self", "cross") for k, v in attention_params(r, d).items()}
    for i in (1, 2, 3):
        params[f"gamma_{i}"], params[f"beta_{i}"] = 1 + 0.3 * r.standard_normal(d), 0.3 * r.standard_normal(d)
    params.update({"W_1": weights(r, d, d_ff), "b_1": 0.3 * r.standard_normal(d_ff),
                   "W_2": weights(r, d_ff, d), "b_2": 0.3 * r.standard_normal(d)})
    if not bias:
        params.update({k: None for k in params if k.startswith(("self_b_", "cross_b_", "b_", "beta_"))})
    return params


def decoder_block_cases():
    r = rng()
    X, memory = r.standard_normal((2, 4, 6)), r.standard_normal((2, 5, 6))
    return [
        Case("post-norm, causal, padded target and source", (X, memory, 2),
             {**decoder_block_params(r, 6, 10), "causal": True, "self_mask": mn.padding_mask([4, 3], 4),
              "memory_mask": mn.padding_mask([5, 2], 5)}),
        Case("pre-norm, gelu, one sequence, the causal mask given as self_mask", (X[0, :3], memory[0], 3),
             {**decoder_block_params(r, 6, 10), "norm_first": True, "activation": "gelu",
              "self_mask": mn.causal_mask(3)}),
        Case("no biases, a source with no real token", (X, memory[:, :3], 2),
             {**decoder_block_params(r, 6, 8, bias=False), "causal": True, "eps": 0.1,
              "memory_mask": mn.padding_mask([3, 0], 3)}),
    ]


CASES["decoder_block"] = decoder_block_cases
PAIRS["decoder_block"] = ("out", ("self_weights", "cross_weights"))


def attention_at_offset_cases():
    r = rng()

    def rows(*shape):  # attention weights: each row sums to 1
        return mn.softmax(2 * r.standard_normal(shape))

    return [
        Case("one head, the previous token", (rows(5, 5), -1)),
        Case("heads, the next token", (rows(3, 6, 6), 1)),
        Case("a batch of heads, the token itself", (rows(2, 3, 4, 4), 0)),
        Case("two tokens back", (rows(2, 6, 6), -2)),
        Case("more keys than queries", (rows(3, 5), 2)),
    ]


CASES["attention_at_offset"] = attention_at_offset_cases
PAIRS["attention_at_offset"] = False


def chunked_attention_cases():
    r = rng()
    X = r.standard_normal((2, 5, 4))
    masked = np.ones((2, 5, 5), dtype=bool)
    masked[0, 3] = False  # query 3 of sequence 0 may attend to nothing
    masked[1, :, :2] = False  # sequence 1: the whole first chunk is blocked
    far = np.array([[30.0, 30.0], [-30.0, -30.0], [-29.0, -31.0]])  # scores about 1273, -1273, -1273
    return [
        Case("one sequence, chunk does not divide T",
             (r.standard_normal((6, 3)), r.standard_normal((7, 3)), r.standard_normal((7, 2))), {"chunk": 3}),
        Case("a batch, chunk divides T", (X, X, r.standard_normal((2, 5, 3))), {"chunk": 5}),
        Case("a fully masked row and a fully masked first chunk",
             (X, X, r.standard_normal((2, 5, 3))), {"mask": masked, "chunk": 2}),
        Case("large logits, causal", tuple(30 * r.standard_normal((2, 4, 4, 3)) for _ in range(3)),
             {"mask": mn.causal_mask(4), "chunk": 3}),
        Case("very negative scores after a masked chunk",
             (np.array([[30.0, 30.0]]), far, r.standard_normal((3, 2))),
             {"mask": np.array([[False, True, True]]), "chunk": 1}),
        Case("chunk larger than T", tuple(r.standard_normal((3, 2)) for _ in range(3)), {"chunk": 8}),
    ]


CASES["chunked_attention"] = chunked_attention_cases
PAIRS["chunked_attention"] = False  # chunked attention returns out only: no weights
