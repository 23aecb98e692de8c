"""Chapter 12's library, both faces: repeat_kv, rotary embeddings, grouped-query attention
and the key-value cache, against independent formulas and against each other.
(Against Hugging Face's Llama: tests/test_grouped_llama.py.)"""

import itertools

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import CPU_AND_CUDA, DEVICES, assert_close, assert_close_on, assert_matches_cpu

F64 = dict(dtype=torch.float64)


def gqa_params(rng, d, h, h_kv, d_head, dtype=np.float64, bias=False):
    """Weights for mha.numpy.grouped_query_attention, scaled like a real init."""
    cols = {"q": h * d_head, "k": h_kv * d_head, "v": h_kv * d_head}
    params = {f"W_{n}": rng.standard_normal((d, c)) / np.sqrt(d) for n, c in cols.items()}
    params["W_o"] = rng.standard_normal((h * d_head, d)) / np.sqrt(h * d_head)
    for n, c in {**cols, "o": d}.items():
        params[f"b_{n}"] = 0.1 * rng.standard_normal(c) if bias else None
    return {k: None if v is None else v.astype(dtype) for k, v in params.items()}


def gqa_by_loop(X, p, h, h_kv, causal=False, rope_base=None):
    """Grouped-query attention written head by head, without repeat_kv: query head j reads
    key/value head j // (h / h_kv)."""
    d_head = p["W_q"].shape[1] // h
    T = X.shape[-2]
    positions = np.arange(T)
    outs = []
    for j in range(h):
        g = j // (h // h_kv)
        q = X @ p["W_q"][:, j * d_head:(j + 1) * d_head]
        k = X @ p["W_k"][:, g * d_head:(g + 1) * d_head]
        v = X @ p["W_v"][:, g * d_head:(g + 1) * d_head]
        if rope_base is not None:
            q, k = rotate_by_complex_numbers(q, positions, rope_base), rotate_by_complex_numbers(k, positions, rope_base)
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_head)
        if causal:
            scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        outs.append((w / w.sum(-1, keepdims=True)) @ v)
    return np.concatenate(outs, axis=-1) @ p["W_o"]


def rotate_by_complex_numbers(x, positions, base):
    """RoPE by its definition: the pair (x_i, x_{i + d/2}) as the complex number x_i + i x_{i + d/2},
    multiplied by exp(i * position * base^(-2i/d))."""
    d = x.shape[-1]
    z = x[..., : d // 2] + 1j * x[..., d // 2:]
    theta = base ** (-np.arange(0, d, 2) / d)  # (d/2,)
    z = z * np.exp(1j * positions[:, None] * theta)  # (T, d/2)
    return np.concatenate([z.real, z.imag], axis=-1)


# repeat_kv ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,n_rep", [((3, 4, 5), 2), ((2, 2, 3, 4), 4), ((2, 3, 1, 2, 5, 2), 3), ((1, 1, 1), 1)])
def test_repeat_kv_gives_query_head_j_the_kv_head_j_over_n_rep(shape, n_rep):
    x = np.random.default_rng(0).standard_normal(shape)
    got = mn.repeat_kv(x, n_rep)
    assert got.shape == (*shape[:-3], shape[-3] * n_rep, *shape[-2:])
    for j in range(got.shape[-3]):
        np.testing.assert_array_equal(got[..., j, :, :], x[..., j // n_rep, :, :])
    torch_got = mt.repeat_kv(torch.as_tensor(x), n_rep)
    assert torch.equal(torch_got, torch.as_tensor(x).repeat_interleave(n_rep, dim=-3))
    np.testing.assert_array_equal(torch_got.numpy(), got)


@pytest.mark.parametrize("face,make", [(mn, np.zeros), (mt, torch.zeros)], ids=["numpy", "torch"])
def test_repeat_kv_refuses_bad_input(face, make):
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        face.repeat_kv(make((4, 5)), 2)
    with pytest.raises(ValueError, match="n_rep must be at least 1"):
        face.repeat_kv(make((2, 4, 5)), 0)
    with pytest.raises(TypeError, match="n_rep must be an integer"):
        face.repeat_kv(make((2, 4, 5)), 2.0)


# rotary embeddings --------------------------------------------------------------------------

@pytest.mark.parametrize("offset", [0, 3, 5000])
def test_float64_tables_equal_the_formula_to_1e_10(offset):
    T, d, base = 7, 16, 10000.0
    angles = (offset + np.arange(T))[:, None] * base ** (-2 * np.arange(d // 2) / d)  # (T, d/2), float64
    expected_cos, expected_sin = np.tile(np.cos(angles), 2), np.tile(np.sin(angles), 2)
    for cos, sin in (mn.rotary_embedding(T, d, base, offset), mt.rotary_embedding(T, d, base, offset, **F64)):
        assert cos.shape == sin.shape == (T, d)
        np.testing.assert_allclose(np.asarray(cos), expected_cos, rtol=0, atol=1e-10)
        np.testing.assert_allclose(np.asarray(sin), expected_sin, rtol=0, atol=1e-10)


def test_tables_continue_from_the_offset():
    full_cos, full_sin = mt.rotary_embedding(12, 8, **F64)
    cos, sin = mt.rotary_embedding(5, 8, offset=7, **F64)
    assert torch.equal(cos, full_cos[7:]) and torch.equal(sin, full_sin[7:])
    np.testing.assert_array_equal(mn.rotary_embedding(5, 8, offset=7)[0], mn.rotary_embedding(12, 8)[0][7:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_tables_and_the_rotation_follow_the_dtype(dtype):
    cos, sin = mt.rotary_embedding(4, 6, dtype=dtype)
    x = torch.randn(2, 4, 6).to(dtype)
    assert cos.dtype == sin.dtype == mt.apply_rotary(x, cos, sin).dtype == dtype
    assert mn.rotary_embedding(4, 6, dtype=np.float32)[0].dtype == np.float32


@pytest.mark.parametrize("shape", [(5, 8), (3, 5, 8), (2, 3, 5, 8)])
def test_apply_rotary_turns_pairs_i_and_i_plus_half_d(shape):
    x = np.random.default_rng(1).standard_normal(shape)
    cos, sin = mn.rotary_embedding(5, 8, base=100.0, offset=2)
    expected = rotate_by_complex_numbers(x, 2 + np.arange(5), 100.0)
    np.testing.assert_allclose(mn.apply_rotary(x, cos, sin), expected, rtol=1e-12, atol=1e-12)
    tc, ts = mt.rotary_embedding(5, 8, base=100.0, offset=2, **F64)
    np.testing.assert_allclose(mt.apply_rotary(torch.as_tensor(x), tc, ts).numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(mn.apply_rotary(x, cos, sin), axis=-1), np.linalg.norm(x, axis=-1))


def test_the_score_depends_only_on_the_distance():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal(16), rng.standard_normal(16)
    cos, sin = mn.rotary_embedding(64, 16)

    def score(i, j):
        return mn.apply_rotary(q[None], cos[i:i + 1], sin[i:i + 1]) @ mn.apply_rotary(k[None], cos[j:j + 1],
                                                                                      sin[j:j + 1]).T
    for i, j in [(3, 1), (10, 2), (40, 40), (5, 20)]:
        assert abs(score(i, j) - score(i + 17, j + 17)) < 1e-10
    assert abs(score(3, 1) - score(4, 1)) > 1e-3  # and it does depend on the distance


@pytest.mark.parametrize("face,make", [(mn, np.ones), (mt, torch.ones)], ids=["numpy", "torch"])
def test_rotary_refuses_odd_widths_and_mismatched_tables(face, make):
    with pytest.raises(ValueError, match="d_head must be even"):
        face.rotary_embedding(4, 7)
    with pytest.raises(ValueError, match="d_head must be even"):
        face.apply_rotary(make((4, 7)), make((4, 7)), make((4, 7)))
    with pytest.raises(ValueError, match="cos has shape"):
        face.apply_rotary(make((4, 6)), make((5, 6)), make((4, 6)))
    with pytest.raises(ValueError, match="base must be a number greater than 1"):
        face.rotary_embedding(4, 6, base=1.0)
    with pytest.raises(ValueError, match="offset must be at least 0"):
        face.rotary_embedding(4, 6, offset=-1)


# grouped-query attention ------------------------------------------------------------------------

GROUPS = [(4, 4), (4, 2), (4, 1), (6, 3)]


@pytest.mark.parametrize("h,h_kv", GROUPS)
@pytest.mark.parametrize("causal,rope_base", [(False, None), (True, 10000.0), (True, 50.0)])
def test_numpy_equals_a_head_by_head_loop(h, h_kv, causal, rope_base):
    rng = np.random.default_rng(3)
    X, p = rng.standard_normal((2, 6, 12)), gqa_params(rng, 12, h, h_kv, 4)
    out, weights = mn.grouped_query_attention(X, n_heads=h, n_kv_heads=h_kv, causal=causal, rope_base=rope_base, **p)
    assert weights.shape == (2, h, 6, 6)
    np.testing.assert_allclose(out, gqa_by_loop(X, p, h, h_kv, causal, rope_base), rtol=1e-10, atol=1e-12)


def test_as_many_kv_heads_as_query_heads_is_multihead_attention():
    rng = np.random.default_rng(4)
    X, p = rng.standard_normal((3, 5, 8)), gqa_params(rng, 8, 2, 2, 4, bias=True)
    mask = mn.padding_mask([5, 3, 1], 5)
    got = mn.grouped_query_attention(X, n_heads=2, n_kv_heads=2, mask=mask, **p)
    expected = mn.multihead_attention(X, n_heads=2, mask=mask, **p)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    mha = mt.MultiHeadAttention(8, 2, **F64)
    gqa = mt.GroupedQueryAttention(8, 2, 2, bias=True, **F64)
    gqa.load_state_dict(mha.state_dict())
    x = torch.as_tensor(X)
    assert torch.allclose(gqa(x, torch.as_tensor(mask), causal=True)[0],
                          mha(x, mask=torch.as_tensor(mask), causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)], ids=["no-batch", "B", "B1xB2"])
@pytest.mark.parametrize("h_kv,bias,rope_base", [(4, True, None), (2, False, 10000.0), (1, True, 500.0)])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding+causal"])
def test_torch_module_equals_numpy_on_both_paths(device, batch, h_kv, bias, rope_base, mask_kind):
    torch.manual_seed(0)
    module = mt.GroupedQueryAttention(16, 4, h_kv, bias=bias, rope_base=rope_base, **F64).to(device)
    X = np.random.default_rng(5).standard_normal((*batch, 5, 16))
    mask = None
    if mask_kind == "padding+causal":
        mask = np.ones((*batch, 1, 1, 5), bool)
        mask[..., -2:] = False
    causal = mask_kind != "none"
    expected, expected_w = mn.grouped_query_attention(X, mask=mask, causal=causal, **module.numpy_params())
    x = torch.as_tensor(X, device=device)
    m = None if mask is None else torch.as_tensor(mask, device=device)
    fast, none = module(x, m, causal=causal)
    explicit, weights = module(x, m, return_weights=True, causal=causal)
    assert none is None and weights.shape == (*batch, 4, 5, 5)
    assert_close_on(device, fast, expected, np.float64, "fused kernel")
    assert_close_on(device, explicit, expected, np.float64, "explicit")
    assert_close_on(device, weights, expected_w, np.float64, "weights")


def test_a_mask_and_causal_must_both_allow_a_key():
    rng = np.random.default_rng(6)
    X, p = rng.standard_normal((4, 8)), gqa_params(rng, 8, 2, 1, 4)
    mask = rng.random((4, 4)) < 0.7
    mask[:, 0] = True
    both = mn.grouped_query_attention(X, n_heads=2, n_kv_heads=1, mask=mask, causal=True, **p)[1]
    np.testing.assert_array_equal(both > 0, np.broadcast_to(mask & np.tril(np.ones((4, 4), bool)), both.shape))


def test_bad_group_sizes_and_widths_are_clear_errors():
    rng = np.random.default_rng(7)
    X, p = rng.standard_normal((4, 12)), gqa_params(rng, 12, 6, 2, 2)
    with pytest.raises(ValueError, match="n_heads=6 is not divisible by n_kv_heads=4"):
        mn.grouped_query_attention(X, n_heads=6, n_kv_heads=4, **p)
    with pytest.raises(ValueError, match="n_heads=6 is not divisible by n_kv_heads=4"):
        mt.GroupedQueryAttention(12, 6, 4)
    with pytest.raises(ValueError, match="W_k has shape .* need 6 columns"):
        mn.grouped_query_attention(X, n_heads=6, n_kv_heads=3, **p)
    with pytest.raises(ValueError, match="d_head=3 is odd"):
        mt.GroupedQueryAttention(12, 4, 2, rope_base=10000.0)
    with pytest.raises(ValueError, match="x has shape .* expects width 12"):
        mt.GroupedQueryAttention(12, 4, 2)(torch.zeros(3, 10))


@pytest.mark.parametrize("device", DEVICES)
def test_module_runs_on_any_device(device):
    torch.manual_seed(0)
    module = mt.GroupedQueryAttention(8, 4, 2, rope_base=10000.0, **F64)
    x = torch.randn(2, 5, 8, **F64)
    cache_cpu, cache_dev = mt.KVCache(), mt.KVCache()
    on_cpu = module(x, causal=True, return_weights=True, cache=cache_cpu)
    got = module.to(device)(x.to(device), causal=True, return_weights=True, cache=cache_dev)
    assert_matches_cpu(got, on_cpu, device)
    assert_matches_cpu(cache_dev.keys, cache_cpu.keys, device, "cached keys")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_follows_the_input(dtype):
    torch.manual_seed(0)
    module = mt.GroupedQueryAttention(16, 4, 2, rope_base=10000.0, **F64)
    x = torch.randn(2, 6, 16, **F64)
    expected = module(x, causal=True)[0]
    out, weights = module.to(dtype)(x.to(dtype), causal=True, return_weights=True)
    assert out.dtype == weights.dtype == dtype
    assert (out.double() - expected).abs().max() < (0.02 if dtype == torch.float16 else 0.1)


def test_float32_numpy_stays_float32_and_matches_float64():
    rng = np.random.default_rng(8)
    X, p = rng.standard_normal((5, 8)), gqa_params(rng, 8, 4, 2, 2)
    out64 = mn.grouped_query_attention(X, n_heads=4, n_kv_heads=2, rope_base=1e4, causal=True, **p)[0]
    p32 = {k: v.astype(np.float32) for k, v in p.items() if v is not None}
    out32 = mn.grouped_query_attention(X.astype(np.float32), n_heads=4, n_kv_heads=2, rope_base=1e4, causal=True,
                                       **p32)[0]
    assert out32.dtype == np.float32
    assert_close(out32, out64.astype(np.float32), np.float32)


def test_every_face_name_is_parallel():
    names = ["repeat_kv", "rotary_embedding", "rotate_half", "apply_rotary", "KVCache", "kv_cache_bytes",
             "causal_mask_after", "attend_with_cache"]
    assert all(n in mn.__all__ and n in mt.__all__ for n in names)
    for T_new, T_past in itertools.product([1, 3], [0, 2]):
        np.testing.assert_array_equal(mt.causal_mask_after(T_new, T_past).numpy(), mn.causal_mask_after(T_new, T_past))
    assert mn.causal_mask_after(2, 3).tolist() == [[True] * 4 + [False], [True] * 5]
