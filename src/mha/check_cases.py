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
PAIRS = {name: name in {"self_attention", "symmetric_attention", "head_attention",
                        "scaled_dot_product_attention", "multihead_attention_loop",
                        "multihead_attention", "encoder_block"} for name in CASES}
