"""Shared helpers: seeded random inputs, weights and explicit tolerances."""

import numpy as np
import pytest
import torch

import mha.numpy as mn

# Tolerances per dtype: float32 sums of a few dozen products agree to ~1e-6.
TOLERANCE = {
    np.float32: dict(rtol=2e-5, atol=2e-6),
    np.float64: dict(rtol=1e-10, atol=1e-12),
}
TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}


def assert_close(actual, expected, dtype=np.float64, what=""):
    """Both arrays (or tensors) equal within the dtype's tolerance."""
    if isinstance(actual, torch.Tensor):
        actual = actual.detach().cpu().numpy()
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().cpu().numpy()
    np.testing.assert_allclose(actual, expected, err_msg=what, **TOLERANCE[dtype])


def random_attention_params(rng, d_model, dtype=np.float64, bias=True, d_in=None):
    """W_q ... b_o for mha.numpy.multihead_attention, scaled like a real init."""
    d_in = d_model if d_in is None else d_in
    params = {}
    for name, rows in (("q", d_in), ("k", d_in), ("v", d_in), ("o", d_model)):
        params[f"W_{name}"] = (rng.standard_normal((rows, d_model)) / np.sqrt(rows)).astype(dtype)
        params[f"b_{name}"] = (0.1 * rng.standard_normal(d_model)).astype(dtype) if bias else None
    return params


def heads_from_columns(params, n_heads):
    """The per-head (W_q_i, W_k_i, W_v_i) that are column blocks of the fused weights."""
    blocks = [np.split(params[f"W_{n}"], n_heads, axis=1) for n in "qkv"]
    return list(zip(*blocks))


def load_params(module, params):
    """Copy NumPy row-vector weights into a mha.torch.MultiHeadAttention."""
    with torch.no_grad():
        for n in "qkvo":
            layer = getattr(module, f"W_{n}")
            layer.weight.copy_(torch.as_tensor(params[f"W_{n}"]).T)
            if params.get(f"b_{n}") is not None:
                layer.bias.copy_(torch.as_tensor(params[f"b_{n}"]))
    return module


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


@pytest.fixture(autouse=True)
def seed_torch():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one thread is fastest and gives the same sums on every run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_mask(kind, batch, T_q, T_k, rng):
    """A boolean mask (True = may attend) of the given kind, or None."""
    if kind == "none":
        return None
    B = batch[0] if batch else 1
    lengths = rng.integers(1, T_k + 1, size=B)
    lengths[0] = T_k  # one full-length sequence
    padding = mn.padding_mask(lengths, T_k)  # (B, 1, 1, T_k)
    if not batch:
        padding = padding[0, 0]  # (1, T_k)
    causal = np.tril(np.ones((T_q, T_k), dtype=bool), k=T_k - T_q)
    if kind == "padding":
        return padding
    if kind == "causal":
        return causal
    if kind == "both":
        return padding & causal
    if kind == "empty_row":
        mask = np.ones((T_q, T_k), dtype=bool)
        mask[T_q // 2] = False  # one query may attend to nothing
        return mask & padding
    raise ValueError(kind)
