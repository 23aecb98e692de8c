"""Fuzzing chapter 12: hypothesis draws grouped-query configurations (batch ranks, group sizes,
masks of every rank, causal, RoPE, dtypes, a cache split anywhere) and checks every path against
one float64 reference; it also draws invalid calls and demands a ValueError or TypeError."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mha.numpy as mn
import mha.torch as mt

TOLERANCE = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}
TORCH = {np.float32: torch.float32, np.float64: torch.float64}


@st.composite
def configurations(draw):
    """A valid call, and where to cut it into a prefix that fills a cache and the rest."""
    batch = draw(st.sampled_from([(), (1,), (2,), (2, 1)]))
    h_kv, group, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3))
    T = draw(st.integers(1, 6))
    full = (*batch, h_kv * group, T, T)
    rank = draw(st.sampled_from([None, 0, 1, 2, 3, len(full)]))
    mask_shape = None if rank is None else tuple(draw(st.sampled_from([1, n])) for n in full[len(full) - rank:])
    return dict(batch=batch, h=h_kv * group, h_kv=h_kv, d_head=d_head, d=draw(st.integers(1, 9)), T=T,
                mask_shape=mask_shape, causal=draw(st.booleans()), bias=draw(st.booleans()),
                rope_base=draw(st.sampled_from([None, 100.0, 10000.0])), split=draw(st.integers(0, T)),
                dtype=draw(st.sampled_from([np.float32, np.float64])), seed=draw(st.integers(0, 2**16)))


def module_and_inputs(c):
    torch.manual_seed(c["seed"])
    module = mt.GroupedQueryAttention(c["d"], c["h"], c["h_kv"], d_head=c["d_head"], bias=c["bias"],
                                      rope_base=c["rope_base"], dtype=TORCH[c["dtype"]])
    rng = np.random.default_rng(c["seed"])
    X = rng.standard_normal((*c["batch"], c["T"], c["d"])).astype(c["dtype"])
    mask = None if c["mask_shape"] is None else rng.random(c["mask_shape"]) < 0.7
    return module, X, mask


@settings(max_examples=40, deadline=None)
@given(configurations())
def test_every_path_agrees_with_one_float64_reference(c):
    module, X, mask = module_and_inputs(c)
    params = module.numpy_params()
    params64 = {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v for k, v in params.items()}
    expected, weights = mn.grouped_query_attention(X.astype(np.float64), mask=mask, causal=c["causal"], **params64)
    x, m = torch.as_tensor(X), None if mask is None else torch.as_tensor(mask)
    got = {"numpy": mn.grouped_query_attention(X, mask=mask, causal=c["causal"], **params)[0]}
    with torch.no_grad():
        got["torch fused"] = module(x, m, causal=c["causal"])[0]
        got["torch explicit"], torch_weights = module(x, m, return_weights=True, causal=c["causal"])
        if c["causal"] and mask is None:  # decoding after a cached prefix, as in generation
            cache, s = mt.KVCache(), c["split"]
            pieces = [module(x[..., a:b, :], causal=True, cache=cache)[0] for a, b in ((0, s), (s, c["T"])) if b > a]
            got["torch cached"] = torch.cat(pieces, dim=-2)
    np.testing.assert_allclose(torch_weights.numpy(), weights, **TOLERANCE[c["dtype"]])
    for name, out in got.items():
        out = out.numpy() if isinstance(out, torch.Tensor) else out
        assert out.dtype == c["dtype"], f"{name} returned {out.dtype}"
        np.testing.assert_allclose(out, expected, err_msg=name, **TOLERANCE[c["dtype"]])


MUTATIONS = {
    "mask of floats": lambda c, X, m: (X, np.ones((c["T"], c["T"]))),
    "mask that does not broadcast": lambda c, X, m: (X, np.ones((c["T"] + 1, c["T"] + 1), bool)),
    "mask with too many dimensions": lambda c, X, m: (X, np.ones((3, 1, *c["batch"], 1, 1, 1), bool)),
    "input of another width": lambda c, X, m: (np.ones((*X.shape[:-1], c["d"] + 1), X.dtype), m),
    "a vector for X": lambda c, X, m: (np.ones(c["d"], X.dtype), m),
    "strings for X": lambda c, X, m: (np.array([["a"] * c["d"]]), m),
}


@settings(max_examples=40, deadline=None)
@given(configurations(), st.sampled_from(sorted(MUTATIONS)))
def test_every_invalid_call_is_a_clear_error(c, mutation):
    module, X, mask = module_and_inputs(c)
    X, mask = MUTATIONS[mutation](c, X, mask)
    with pytest.raises((ValueError, TypeError)):
        mn.grouped_query_attention(X, mask=mask, **module.numpy_params())
    with pytest.raises((ValueError, TypeError)):
        module(*(a if a is None or a.dtype.kind == "U" else torch.as_tensor(a) for a in (X, mask)))
