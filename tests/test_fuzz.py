"""Fuzzing: hypothesis draws random valid configurations (batch ranks, masks of every rank,
dtypes, causal, cross-attention, chunk sizes) and checks every path against one float64
reference; it also draws invalid ones and demands a ValueError or TypeError.
Bounded to a few dozen examples each, so that it runs in well under a minute."""

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
    """A valid call: shapes, a mask of any broadcastable rank (or none), causal, cross, dtype, chunk."""
    batch = draw(st.sampled_from([(), (1,), (2,), (2, 1)]))
    h, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    T_q = draw(st.integers(1, 5))
    cross = draw(st.booleans())
    T_k = draw(st.integers(1, 5)) if cross else T_q
    full = (*batch, h, T_q, T_k)
    rank = draw(st.sampled_from([None, 0, 1, 2, 3, len(full)]))
    mask_shape = None if rank is None else tuple(draw(st.sampled_from([1, n])) for n in full[len(full) - rank:])
    return dict(batch=batch, h=h, d=h * d_head, T_q=T_q, T_k=T_k, cross=cross, mask_shape=mask_shape,
                causal=draw(st.booleans()), bias=draw(st.booleans()), chunk=draw(st.integers(1, 6)),
                dtype=draw(st.sampled_from([np.float32, np.float64])), seed=draw(st.integers(0, 2**16)))


def inputs(c):
    rng = np.random.default_rng(c["seed"])
    X = rng.standard_normal((*c["batch"], c["T_q"], c["d"]))
    context = rng.standard_normal((*c["batch"], c["T_k"], c["d"])) if c["cross"] else None
    mask = None if c["mask_shape"] is None else rng.random(c["mask_shape"]) < 0.7
    return X, context, mask


def reference_mask(c, mask):
    """The mask the reference uses: `mask` and, with causal, query i sees keys 0..i."""
    causal = np.tril(np.ones((c["T_q"], c["T_k"]), dtype=bool)) if c["causal"] else None
    if mask is None:
        return causal
    return mask if causal is None else mask & causal


@settings(max_examples=40, deadline=None)
@given(configurations())
def test_every_path_agrees_with_one_float64_reference(c):
    torch.manual_seed(c["seed"])
    module = mt.MultiHeadAttention(c["d"], c["h"], bias=c["bias"], dtype=TORCH[c["dtype"]]).eval()
    params = module.numpy_params()
    X, context, mask = inputs(c)
    both = reference_mask(c, mask)
    expected, weights = mn.multihead_attention(X, n_heads=c["h"], context=context, mask=both,
                                               **{k: None if v is None else v.astype(np.float64)
                                                  for k, v in params.items()})
    cast = (lambda a: None if a is None else a.astype(c["dtype"]))
    x, ctx = torch.as_tensor(cast(X)), None if context is None else torch.as_tensor(cast(context))
    m = None if mask is None else torch.as_tensor(mask)
    got = {"numpy": mn.multihead_attention(cast(X), n_heads=c["h"], context=cast(context), mask=both, **params)[0]}
    with torch.no_grad():
        got["torch fused"] = module(x, ctx, m, causal=c["causal"])
        out, torch_weights = module(x, ctx, m, return_weights=True, causal=c["causal"])
        got["torch explicit"] = out
    np.testing.assert_allclose(torch_weights.numpy(), weights, **TOLERANCE[c["dtype"]])
    Q, K, V = (mn.split_heads(a @ params[f"W_{n}"] + (0 if params[f"b_{n}"] is None else params[f"b_{n}"]), c["h"])
               for a, n in ((cast(X), "q"), (cast(X if context is None else context), "k"),
                            (cast(X if context is None else context), "v")))
    heads, _ = mn.scaled_dot_product_attention(Q, K, V, both)
    got["numpy chunked"] = mn.chunked_attention(Q, K, V, both, chunk=c["chunk"])
    got["torch chunked"] = mt.chunked_attention(*(torch.as_tensor(a) for a in (Q, K, V)),
                                                None if both is None else torch.as_tensor(both), chunk=c["chunk"])
    for name, out in got.items():
        out = out.numpy() if isinstance(out, torch.Tensor) else out
        assert out.dtype == c["dtype"], f"{name} returned {out.dtype}"
        target = heads if "chunked" in name else expected
        np.testing.assert_allclose(out, target, err_msg=name, **TOLERANCE[c["dtype"]])


MUTATIONS = {
    "mask of floats": lambda c, X, ctx, m: (X, ctx, np.ones((c["T_q"], c["T_k"]))),
    "mask that does not broadcast": lambda c, X, ctx, m: (X, ctx, np.ones((c["T_q"] + 1, c["T_k"] + 1), bool)),
    "mask with too many dimensions": lambda c, X, ctx, m: (X, ctx, np.ones((3, 1, *c["batch"], 1, 1, 1), bool)),
    "context of another width": lambda c, X, ctx, m: (X, np.ones((c["T_k"], c["d"] + 1)), m),
    "input of another width": lambda c, X, ctx, m: (X[..., :-1] if c["d"] > 1 else np.ones((2, 2)), ctx, m),
    "a vector for X": lambda c, X, ctx, m: (np.ones(c["d"]), ctx, m),
    "strings for X": lambda c, X, ctx, m: (np.array([["a"] * c["d"]]), ctx, m),
}


@settings(max_examples=40, deadline=None)
@given(configurations(), st.sampled_from(sorted(MUTATIONS)))
def test_every_invalid_call_is_a_clear_error(c, mutation):
    torch.manual_seed(c["seed"])
    module = mt.MultiHeadAttention(c["d"], c["h"], dtype=TORCH[c["dtype"]])
    X, context, mask = MUTATIONS[mutation](c, *inputs(c))
    with pytest.raises((ValueError, TypeError)):
        mn.multihead_attention(X, n_heads=c["h"], context=context, mask=mask, **module.numpy_params())
    with pytest.raises((ValueError, TypeError)):
        module(as_tensor(X, c), as_tensor(context, c), as_tensor(mask, c))


def as_tensor(a, c):
    """`a` as the module would be given it: floats in the module's dtype; strings stay an array."""
    if a is None or a.dtype.kind == "U":
        return a
    return torch.as_tensor(a.astype(c["dtype"]) if a.dtype.kind == "f" else a)
