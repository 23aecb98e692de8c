"""The grader's parts, one at a time: what crosses the wire, the student edition of the
library, the sandbox's walls and limits. (tests/test_grading_attacks.py grades whole
notebooks.)"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.special

from conftest import ROOT

from mha.checks.ch11 import ToyLanguageModel
from mha.checks.registry import CHECKS
from tools.grading import cases, sandbox, student_edition, wire

VALUES = [np.float64(3.5), np.float32(2.0), np.int32(7), np.bool_(True), 3, 2.5, float("nan"), -float("inf"),
          True, None, "text", 10**20, np.zeros((0, 3), np.float32), np.arange(6).reshape(2, 3)[:, ::2],
          (1, [2.0, {"k": np.ones((2, 2), np.float32)}]), np.array(5.0)]


def same(a, b):
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_every_kind_of_answer_crosses_with_its_type_dtype_and_shape(value):
    assert same(value, wire.untag(wire.tag(value)))


@pytest.mark.parametrize("value", [np.array([object()]), np.array(["a"]), lambda x: x, object(), {1: 2},
                                   np.array([1 + 2j])], ids=["object array", "strings", "function", "object",
                                                             "int keys", "complex"])
def test_what_is_not_plain_data_cannot_be_sent(value):
    with pytest.raises(TypeError, match="cannot be sent"):
        wire.tag(value)


@pytest.mark.parametrize("data", [
    {"t": "array", "dtype": "|O", "shape": [1], "data": ""},
    {"t": "array", "dtype": "<f8", "shape": [3], "data": "AAAA"},
    {"t": "pickle", "v": "gASV"},
    {"t": "py", "v": [1, 2]}], ids=["object dtype", "wrong length", "unknown kind", "list as plain value"])
def test_a_forged_reply_is_refused(data):
    with pytest.raises((TypeError, ValueError)):
        wire.untag(data)


def test_a_model_given_as_data_computes_what_the_checks_model_computes():
    model = ToyLanguageModel(np.random.default_rng(0), 9)
    rebuilt = wire.untag(wire.tag(cases.to_wire(model)))
    tokens = np.random.default_rng(1).integers(0, 40, size=(3, 7))
    assert np.array_equal(rebuilt(tokens), model(tokens))
    back = wire.untag(wire.tag(cases.to_wire((model, 2))), rebuild=cases.toy_model)
    assert back[0] == model and back[1] == 2


def test_the_student_edition_switches_off_the_exercise_and_keeps_the_rest(tmp_path):
    student_edition.build(tmp_path, ("softmax", "log_softmax"))
    program = """
import numpy as np
import mha.numpy as mnp
from mha.checks import check_softmax, CheckFailed
check_softmax(None)
for name in ("softmax", "log_softmax"):
    try:
        getattr(mnp, name)(np.ones(3))
        print("WORKS", name)
    except RuntimeError as error:
        assert "switched off" in str(error)
print("gelu", mnp.gelu(np.float32([0.5, -1.0])).dtype, float(mnp.gelu(np.array(1.3))))
import mha.numpy.attention as attention, inspect
print("source kept out:", "exp" not in inspect.getsource(attention.softmax))
"""
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert "WORKS" not in ran.stdout and "graded by the grader" in ran.stdout
    assert "gelu float32" in ran.stdout and "source kept out: True" in ran.stdout
    gelu = float(ran.stdout.split("gelu float32 ")[1].split()[0])
    assert gelu == pytest.approx(1.3 * 0.5 * (1 + scipy.special.erf(1.3 / np.sqrt(2))), rel=1e-15)


@pytest.mark.parametrize("name", list(CHECKS))
def test_every_check_switches_off_its_own_function_and_allows_no_torch(name):
    check = CHECKS[name]
    assert name in check.absent() and set(check.absent()) <= set(__import__("mha.numpy").numpy.__all__)
    assert "torch" in sandbox.hidden_packages(check.packages)
    assert ("scipy" in sandbox.hidden_packages(check.packages)) == ("scipy" not in check.packages)


needs_bubblewrap = pytest.mark.skipif(sandbox.ISOLATION != "bubblewrap", reason="bubblewrap is not installed")


@needs_bubblewrap
def test_the_worker_sees_neither_the_project_nor_the_network_and_writes_only_its_folder(tmp_path):
    worker = sandbox.Worker(tmp_path / "w", ("softmax",), (), sandbox.Limits(), covered=[ROOT])
    try:
        errors = dict(worker.run([
            f"open({str(ROOT / 'README.md')!r})",
            "import socket; socket.create_connection(('pypi.org', 443), timeout=2)",
            "open('/etc/mha-was-here', 'w')",
            "import torch",
            "open('written.txt', 'w').write('ok')",
        ], 30))
    finally:
        worker.close()
    assert "FileNotFoundError" in errors[0]
    assert errors[1].startswith(("gaierror", "OSError", "ConnectionRefusedError"))
    assert "Read-only file system" in errors[2]
    assert "not available" in errors[3]
    assert 4 not in errors


def test_a_worker_past_its_time_or_memory_is_stopped(tmp_path):
    limits = sandbox.Limits(cell_seconds=2, notebook_seconds=10, memory_bytes=2**30)
    worker = sandbox.Worker(tmp_path / "w", (), (), limits, covered=[ROOT])
    try:
        worker.run(["import numpy as np\ndef spin():\n    while True:\n        try:\n            pass\n"
                    "        except BaseException:\n            pass\ndef big():\n    return np.ones(2**28)"], 30)
        reply, _ = worker.call("big", (), {}, 10)
        assert reply["status"] == "raised" and reply["message"].startswith("MemoryError")
        with pytest.raises(sandbox.LimitReached, match="ran past 2 s"):
            worker.call("spin", (), {}, 2)
        assert worker.process.poll() is not None, "the worker was killed"
    finally:
        worker.close()


def test_without_bubblewrap_the_worker_still_goes_without_torch_and_the_exercise(tmp_path, monkeypatch):
    """The fallback: no sandbox, but its own folder, an emptied environment, and the locks at import."""
    monkeypatch.setattr(sandbox, "ISOLATION", "folder and path only")
    if os.geteuid() == 0 and sandbox.closed_to_others(Path(sys.executable).resolve()):
        with pytest.raises(sandbox.Refused, match="cannot run .* closed to other users"):
            sandbox.Worker(tmp_path / "w", ("softmax",), (), sandbox.Limits(), covered=[ROOT])
        return  # as root the worker is a user of its own, which cannot reach this Python: refused, not run as root
    worker = sandbox.Worker(tmp_path / "w", ("softmax",), (), sandbox.Limits(), covered=[ROOT])
    try:
        assert worker.process.args[0] == sys.executable, "no bubblewrap in the command"
        errors = dict(worker.run(["import torch", "import scipy.special",
                                  "import mha.numpy as mnp\nmnp.softmax([1.0])",
                                  "import os\nassert 'MHA_GRADING_SECRET' not in os.environ\nx = mnp.gelu(1.0)"], 30))
    finally:
        worker.close()
    assert "not available" in errors[0] and "not available" in errors[1]
    assert "switched off" in errors[2]
    assert 3 not in errors


def test_float64_answers_to_float32_inputs_pass_unless_the_text_promises_float32():
    """A float64 input must be answered in float64 everywhere; float32 must stay float32 only where the
    exercise's text says so (RoPE: "float32 stays float32"), so a right softmax that computes in float64 passes."""
    import contextlib
    import io

    import mha.checks as checks

    def softmax_in_float64(x, axis=-1):  # through the log-sum-exp, as the text asks
        x = np.asarray(x, dtype=np.float64)
        top = x.max(axis=axis, keepdims=True)
        return np.exp(x - (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))))

    def softmax_in_float32(x, axis=-1):
        return softmax_in_float64(x, axis).astype(np.float32)

    def rotary_in_float64(x, cos, sin):
        x = np.asarray(x, dtype=np.float64)
        half = x.shape[-1] // 2
        turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + turned * sin

    with contextlib.redirect_stdout(io.StringIO()):
        checks.check_softmax(softmax_in_float64, seed=0)
    with pytest.raises(checks.CheckFailed, match="expected dtype float64, got float32"):
        checks.check_softmax(softmax_in_float32, seed=0)
    with pytest.raises(checks.CheckFailed, match="expected dtype float32, got float64"):
        checks.check_apply_rotary(rotary_in_float64, seed=0)
    assert {n for n, c in CHECKS.items() if c.float32_promised} == {
        "sinusoidal_positions", "apply_rotary", "attend_with_cache", "dequantize_q4_1", "absorbed_latent_decode",
        "sink_softmax", "route_tokens", "linear_attention_step", "gated_delta_update", "gated_delta_chunk"}
