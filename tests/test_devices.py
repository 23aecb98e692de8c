"""`mha.torch.default_device()`: CUDA, then Apple's MPS, then the CPU, unless MHA_DEVICE says.

The choice is tested with the machine's answers faked (`torch.cuda.is_available`,
`torch.backends.mps.is_available`), and, where this machine has a GPU, on the device
itself: the chapters' code then runs there and agrees with the CPU.
"""

import os
from types import SimpleNamespace

import pytest
import torch

import mha.torch as mt
from mha.torch import devices


@pytest.fixture
def machine(monkeypatch):
    """Fake what the machine has: machine(cuda=..., mps=..., gpus=...); MHA_DEVICE is unset."""
    monkeypatch.delenv("MHA_DEVICE", raising=False)

    def fake(cuda=False, mps=False, gpus=1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus if cuda else 0)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return fake


@pytest.mark.parametrize("cuda,mps,expected", [(True, True, "cuda"), (True, False, "cuda"),
                                               (False, True, "mps"), (False, False, "cpu")])
def test_the_first_of_cuda_mps_and_cpu_that_the_machine_has(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    assert mt.default_device() == torch.device(expected)


def test_a_torch_built_without_mps_falls_to_the_cpu(machine, monkeypatch):
    machine(cuda=False)
    monkeypatch.setattr(torch, "backends", SimpleNamespace())  # no torch.backends.mps at all
    assert mt.default_device() == torch.device("cpu")


@pytest.mark.parametrize("named", ["cpu", "cuda", "cuda:1", "mps", " cpu "])
def test_mha_device_overrides_the_choice(machine, monkeypatch, named):
    machine(cuda=True, mps=True, gpus=2)
    monkeypatch.setenv("MHA_DEVICE", named)
    assert mt.default_device() == torch.device(named.strip())


@pytest.mark.parametrize("named,has", [("cuda", {}), ("cuda:1", {"cuda": True, "gpus": 1}), ("mps", {"cuda": True})])
def test_a_named_device_the_machine_lacks_is_an_error_not_a_quiet_cpu(machine, monkeypatch, named, has):
    machine(**has)
    monkeypatch.setenv("MHA_DEVICE", named)
    with pytest.raises(ValueError, match=rf"MHA_DEVICE='{named}', but this machine has no such device"):
        mt.default_device()


@pytest.mark.parametrize("named", ["gpu", "tpu", "meta", "cuda:x", "2"])
def test_a_device_that_is_not_cpu_cuda_or_mps_is_refused_by_name(machine, monkeypatch, named):
    machine(cuda=True, mps=True)
    monkeypatch.setenv("MHA_DEVICE", named)
    with pytest.raises(ValueError, match=rf"cpu, cuda \(or cuda:N\) or mps, got '{named}'"):
        mt.default_device()


def test_synchronize_waits_on_the_device_it_is_given(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(("cuda", str(device))))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waited.append(("mps", None)))
    mt.synchronize("cpu")
    mt.synchronize(torch.device("cuda:0"))
    mt.synchronize("mps")
    assert waited == [("cuda", "cuda:0"), ("mps", None)]


def test_the_tests_and_the_chapters_compute_on_the_cpu():
    """nbval's kernels inherit this process's environment (tests/conftest.py, the Makefile)."""
    assert os.environ["MHA_DEVICE"] == "cpu"
    assert mt.default_device() == torch.device("cpu")


def real_accelerator():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if devices.mps_is_available():
        return torch.device("mps")
    return None


@pytest.mark.skipif(real_accelerator() is None, reason="this machine has no CUDA or MPS device")
def test_on_the_machines_own_accelerator_the_choice_is_it_and_the_layers_agree(monkeypatch):
    accelerator = real_accelerator()
    monkeypatch.delenv("MHA_DEVICE")
    device = mt.default_device()
    assert device.type == accelerator.type
    torch.manual_seed(0)
    layer = mt.MultiHeadAttention(64, 4).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        on_cpu, on_device = layer(x, causal=True), layer.to(device)(x.to(device), causal=True)
    mt.synchronize(device)
    assert on_device.device.type == accelerator.type
    assert torch.allclose(on_device.cpu(), on_cpu, atol=1e-4, rtol=1e-4)  # TF32 / other kernels round differently
