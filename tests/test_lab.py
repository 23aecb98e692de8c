"""`make lab` opens the chapters in JupyterLab, in a working copy a learner may change.

The real command is run: make copies the chapters into a folder of its own and starts
`jupyter lab` there (without a browser, on 127.0.0.1, with a token); the test fetches a
chapter through JupyterLab's contents API, as the browser would, then shuts it down.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import CHAPTERS, ROOT

BIN = Path(sys.executable).parent
FIRST = CHAPTERS[0].name


def make_lab(folder, *options, timeout=None):
    """`make lab` into `folder`, with LAB_OPTIONS for jupyter lab; the venv is taken as installed."""
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "lab", f"LAB={folder}",
               f"BIN={BIN}", f"LAB_OPTIONS={' '.join(options)}"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / ".runtime")})


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fetch(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def wait_for(url, process, seconds):
    """Poll `url` until it answers (status, body), the server dies, or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"`make lab` ended with {process.returncode}:\n{process.stdout.read()[-3000:]}")
        try:
            return fetch(url)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    pytest.fail(f"JupyterLab did not answer {url.split('?')[0]} within {seconds} s")


def stop(process):
    """Shut the server down as Ctrl-C would, and make sure nothing is left running."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)  # jupyter asks for confirmation after the first
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail("JupyterLab did not stop on Ctrl-C within 10 s")
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):  # nothing of make's process group is left running
        os.killpg(process.pid, 0)


def test_make_lab_serves_the_chapters_from_a_working_copy(tmp_path):
    folder, token, port = tmp_path / "lab", secrets.token_hex(16), free_port()
    started = time.monotonic()
    process = make_lab(folder, "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                       "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}")
    try:
        status, body = wait_for(f"http://127.0.0.1:{port}/api/contents/{FIRST}?token={token}", process, 40)
        model = json.loads(body)
        assert status == 200 and model["type"] == "notebook" and model["name"] == FIRST
        served = nbformat.from_dict(model["content"])
        assert served.cells[0].source == nbformat.read(CHAPTERS[0], as_version=4).cells[0].source
        with pytest.raises(urllib.error.HTTPError) as refused:  # the token is what keeps others out
            fetch(f"http://127.0.0.1:{port}/api/contents/{FIRST}")
        assert refused.value.code == 403
    finally:
        stop(process)
    print(f"make lab answered and stopped in {time.monotonic() - started:.1f} s")
    assert sorted(p.name for p in folder.glob("*.ipynb")) == [p.name for p in CHAPTERS]
    assert (folder / "figures").is_dir()


def test_make_lab_keeps_a_learners_edits_and_restores_a_deleted_chapter(tmp_path):
    folder = tmp_path / "lab"
    assert make_lab(folder, "--version").wait(timeout=60) == 0
    edited, deleted = folder / CHAPTERS[0].name, folder / CHAPTERS[1].name
    edited.write_text(edited.read_text().replace("Attention", "My attention", 1))
    deleted.unlink()
    process = make_lab(folder, "--version")
    assert process.wait(timeout=60) == 0, process.stdout.read()
    assert "My attention" in edited.read_text(), "make lab overwrote a learner's edit"
    assert deleted.read_bytes() == CHAPTERS[1].read_bytes(), "a deleted chapter is copied afresh"


def test_nbconvert_is_installed_with_the_course(tmp_path):
    """`jupyter nbconvert` works after setup: a chapter converted to a script compiles."""
    result = subprocess.run([str(BIN / "jupyter-nbconvert"), "--to", "script", str(CHAPTERS[0]),
                             "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    script = next(tmp_path.glob("*.py")).read_text()
    compile(script.replace("get_ipython()", "None"), "chapter", "exec")
    assert "import" in script and "softmax" in script


def test_the_lab_folder_is_ignored_by_git():
    result = subprocess.run(["git", "check-ignore", "-q", "lab/01_weighted_average.ipynb"], cwd=ROOT)
    assert result.returncode == 0, "lab/ must be in .gitignore: a learner's edits never dirty the clone"
