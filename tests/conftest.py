"""Shared helpers: seeded random inputs, weights, explicit tolerances and the devices to test on."""

import copy
import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import kernel_passes
import mha.numpy as mn
import unit_order
import unit_times

ROOT = Path(__file__).resolve().parent.parent

# The chapters' stored outputs were made on the CPU: nbval's kernels and the tests compute
# there even on a machine with a GPU (mha.torch.default_device() reads it; the Makefile sets
# it too). tests/test_devices.py checks the choice on the real device, when there is one.
os.environ.setdefault("MHA_DEVICE", "cpu")
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))  # the chapter notebooks, in order


def toc_files():
    """The book's pages in the order of _toc.yml, without suffix: intro, notation, chapters, ..."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]

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
    return mn.heads_from_fused(params["W_q"], params["W_k"], params["W_v"], n_heads)


def load_params(module, params):
    """Copy NumPy row-vector weights into a mha.torch.MultiHeadAttention."""
    with torch.no_grad():
        for n in "qkvo":
            layer = getattr(module, f"W_{n}")
            layer.weight.copy_(torch.as_tensor(params[f"W_{n}"]).T)
            if params.get(f"b_{n}") is not None:
                layer.bias.copy_(torch.as_tensor(params[f"b_{n}"]))
    return module


def random_decoder_params(rng, d, d_ff):
    """Every parameter of mha.numpy.decoder_block, random, for width d and hidden width d_ff."""
    params = {f"{part}_{kind}_{n}": (rng.standard_normal((d, d)) / np.sqrt(d) if kind == "W"
                                     else 0.3 * rng.standard_normal(d))
              for part in ("self", "cross") for kind in ("W", "b") for n in "qkvo"}
    for i in (1, 2, 3):
        params[f"gamma_{i}"], params[f"beta_{i}"] = 1 + 0.3 * rng.standard_normal(d), 0.3 * rng.standard_normal(d)
    params["W_1"], params["b_1"] = rng.standard_normal((d, d_ff)) / np.sqrt(d), 0.3 * rng.standard_normal(d_ff)
    params["W_2"], params["b_2"] = rng.standard_normal((d_ff, d)) / np.sqrt(d_ff), 0.3 * rng.standard_normal(d)
    return params


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


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (mha.experiments.smollm2) with transformers' load of the same file: loaded
    once per test process, for every test that needs the real model (about 20 s)."""
    from mha.experiments.smollm2 import load_smollm2
    return load_smollm2(reference=True)


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


# Devices --------------------------------------------------------------------------------

NO_CUDA = "no CUDA GPU on this machine"
CUDA = pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))
# Where device-agnostic code is proven. `meta` has shapes but no numbers: a tensor made on a
# fixed device fails there. `cuda` (when there is a GPU) must also give the CPU's numbers.
DEVICES = ["meta", CUDA]
# For the equivalence tests, which compare numbers: the CPU always, the GPU when there is one.
CPU_AND_CUDA = ["cpu", CUDA]

# A result from a GPU against the CPU or NumPy: other kernels, other summation orders.
# float32 with TF32 off (see full_float32_on_gpus) agrees to a few units in the 6th digit.
DEVICE_TOLERANCE = {
    np.float32: dict(rtol=2e-5, atol=1e-5),
    np.float64: dict(rtol=1e-10, atol=1e-12),
}
NUMPY_DTYPE = {torch_dtype: numpy_dtype for numpy_dtype, torch_dtype in TORCH_DTYPE.items()}


@pytest.fixture(scope="session", autouse=True)
def full_float32_on_gpus():
    """float32 matrix products on a GPU in float32, not TF32 (10 bits of mantissa)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def on_device(item, device):
    """A copy of a module or tensor on `device`, the original left where it is; None stays None."""
    if item is None:
        return None
    if isinstance(item, torch.nn.Module):
        return copy.deepcopy(item).to(device)
    return item.to(device)


def as_numpy(x):
    """A tensor (on any device but `meta`) or an array, as a NumPy array."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def assert_close_on(device, actual, expected, dtype=np.float64, what=""):
    """assert_close for a result computed on `device`: off the CPU, with DEVICE_TOLERANCE."""
    tolerance = TOLERANCE if device == "cpu" else DEVICE_TOLERANCE
    np.testing.assert_allclose(as_numpy(actual), as_numpy(expected), err_msg=what, **tolerance[dtype])


def assert_matches_cpu(got, on_cpu, device, what="result"):
    """`got`, computed on `device`, against the same computation on the CPU.

    Tensors, or tuples and lists of them (nested). Always: the device, shape and dtype.
    Off `meta`, which holds no numbers, the numbers too (booleans exactly).
    """
    if isinstance(on_cpu, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(on_cpu), what
        for i, (a, b) in enumerate(zip(got, on_cpu)):
            assert_matches_cpu(a, b, device, f"{what}[{i}]")
        return
    assert got.device.type == device, f"{what} is on {got.device}, expected {device}"
    assert got.shape == on_cpu.shape, f"{what}: shape {tuple(got.shape)} != {tuple(on_cpu.shape)}"
    assert got.dtype == on_cpu.dtype, f"{what}: dtype {got.dtype} != {on_cpu.dtype}"
    if device == "meta":
        return
    if on_cpu.dtype == torch.bool:
        assert torch.equal(got.cpu(), on_cpu), what
    else:
        assert_close_on(device, got, on_cpu, NUMPY_DTYPE[on_cpu.dtype], what)


# The book, built once per test run ------------------------------------------------------

def build_site_once(folder):
    """Build the book into `folder` unless a process of this run already did: (html, returncode, log).

    The pytest-xdist workers of one run share the folder (named by the run's id) and
    take turns through a lock, so the book is built once, however many files need it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log, code = folder / "build.log", folder / "returncode"
        if not code.exists():
            jupyter_book = Path(sys.executable).with_name("jupyter-book")
            result = subprocess.run(
                [str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(folder)],
                capture_output=True, text=True, timeout=900)
            log.write_text(result.stdout[-5000:] + "\n" + result.stderr[-3000:])
            code.write_text(str(result.returncode))
    return folder / "_build" / "html", int(code.read_text()), log.read_text()


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The book built with `jupyter-book build -W -n --keep-going`: (html folder, returncode, log).

    The folder is $MHA_SITE_FOLDER when set (CI publishes the build that it tested from
    there: .github/workflows/publish.yml; give it a folder with no earlier build), else a
    fresh temporary one per run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if os.environ.get("MHA_SITE_FOLDER"):
        folder = Path(os.environ["MHA_SITE_FOLDER"]).resolve()
    else:
        folder = Path(tempfile.gettempdir()) / f"mha-site-{run}" if run else tmp_path_factory.mktemp("site")
    return build_site_once(folder)


# The run itself ---------------------------------------------------------------------------
# Every chapter under other CPUs' kernels ($MHA_KERNEL_PASSES: tests/kernel_passes.py), the work units
# longest first (tests/unit_order.py), and their seconds written to $MHA_TIMES (tests/unit_times.py).

def pytest_configure(config):
    unit_times.register(config)


def pytest_collection_modifyitems(session, config, items):
    items.extend(kernel_passes.add_kernel_passes(session, items))
    items[:] = unit_order.longest_first(items)
