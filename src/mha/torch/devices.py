"""Where the chapters compute: `default_device()`.

Nothing else in `mha.torch` names a device (every tensor is made on the device of
its input). A chapter that shows speed or memory asks this module once, so that a
learner with an NVIDIA card or an Apple silicon Mac sees their own hardware; a
chapter whose stored outputs come from training stays on the CPU (README: "GPUs and
Apple silicon" says why).
"""

import os

import torch

DEVICE_VARIABLE = "MHA_DEVICE"
KNOWN_TYPES = ("cpu", "cuda", "mps")


def mps_is_available():
    """Whether Apple's Metal backend can run here (False on builds without it)."""
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def is_available(device):
    """Whether a torch.device of type cpu, cuda or mps can be used on this machine."""
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    if device.type == "mps":
        return mps_is_available()
    return device.type == "cpu"


def parse_device(text):
    """The torch.device that MHA_DEVICE names: cpu, cuda, cuda:N or mps."""
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in KNOWN_TYPES:
        raise ValueError(f"{DEVICE_VARIABLE} must name a device of type cpu, cuda (or cuda:N) or mps, "
                         f"got {text!r}")
    return device


def default_device():
    """The device a chapter should compute on: a torch.device.

    $MHA_DEVICE when set (cpu, cuda, cuda:N or mps; the tests and nbval set cpu), else
    the first of CUDA, Apple's MPS and the CPU that this machine has. A device named in
    MHA_DEVICE that this machine lacks is an error, not a quiet fall back to the CPU.
    """
    wanted = os.environ.get(DEVICE_VARIABLE, "").strip()
    if wanted:
        device = parse_device(wanted)
        if not is_available(device):
            raise ValueError(f"{DEVICE_VARIABLE}={wanted!r}, but this machine has no such device "
                             f"(CUDA available: {torch.cuda.is_available()}, MPS available: {mps_is_available()})")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if mps_is_available():
        return torch.device("mps")
    return torch.device("cpu")


def synchronize(device):
    """Wait until the work queued on `device` is done (before reading a clock); nothing on the CPU.

    A GPU call returns as soon as its work is queued, so a timing that skips this measures
    only the queueing."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
