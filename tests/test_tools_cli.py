"""The tools never delete what they did not make.

`python -m tools.publishing.make_handout --help` once made a folder named `--help` and wrote the
handout into it, and `make_handout.py book` would have deleted the book first. Here:
every command of tools/ (`python -m tools.TRADE.NAME`) parses its arguments: `--help`
prints its usage, exits 0 and changes nothing, run from the repository (no file made,
changed or deleted there, `git status` as it was) and from an empty folder (still empty).
make_handout writes only into a new or empty folder, or one that an earlier run made
(its marker `.mha-handout`), and refuses any other folder, and any path inside the
repository but `_handout/`, with an error that names the folder, nothing deleted; the
same for nbgrader_source's `nbgrader/` and make_gradescope's zip. The `--help` runs go
in parallel (importing torch and nbformat takes a second or two each).
"""

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT

from tools.grading import make_gradescope
from tools.publishing import make_handout, nbgrader_source, output_folder

PYTHON = ROOT / ".venv" / "bin" / "python"
SANDBOX_ONLY = {"tools.grading.worker"}  # started inside the sandbox by tools/grading/sandbox.py, never by hand
MAINS = [p for p in sorted((ROOT / "tools").glob("*/*.py")) if '__name__ == "__main__"' in p.read_text()]
TOOLS = [name for name in (".".join(p.relative_to(ROOT).with_suffix("").parts) for p in MAINS)
         if name not in SANDBOX_ONLY]  # the commands, as `python -m` names them: tools.TRADE.NAME
# no __pycache__ written by these runs; the repository root on the path, for the runs from an empty folder
QUIET = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}


# Ignored folders that other tests, run at the same time, may make (caches, the book's build): a new
# one of them says nothing about the tools. What the tools write there is looked at in OUTPUTS.
MADE_BY_OTHER_TESTS = {".pytest_cache/", ".hypothesis/", "_build/", "lab/", ".cache/"}
OUTPUTS = [ROOT / "_build" / "gradescope", ROOT / "_build" / "pdf", ROOT / "_handout"]


def git_status():
    """Every change, untracked and ignored path of the repository, as git sees them (ignored folders whole,
    but those that other tests may make), and what the tools' own output folders hold."""
    lines = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    outputs = {str(p) for folder in OUTPUTS if folder.is_dir() for p in folder.rglob("*")}
    return {line for line in lines if not (line.startswith("!! ") and line[3:] in MADE_BY_OTHER_TESTS
                                           or line.endswith("__pycache__/"))} | outputs


def source(tool):
    return ROOT.joinpath(*tool.split(".")).with_suffix(".py")


def run(tool, *arguments, cwd=ROOT):
    """`python -m tool ARGUMENTS` (tool: a module name, tools.TRADE.NAME)."""
    return subprocess.run([str(PYTHON), "-m", tool, *map(str, arguments)], cwd=cwd, env=QUIET,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def helped(tmp_path_factory):
    """Every tool run with --help, half of them from the repository and half from an empty folder, at
    once: ({tool's name: the run}, git status before, after, the empty folder)."""
    empty = tmp_path_factory.mktemp("cwd")
    before = git_status()
    with ThreadPoolExecutor(max_workers=8) as pool:
        runs = dict(zip(TOOLS, pool.map(
            lambda i: run(TOOLS[i], "--help", cwd=ROOT if i % 2 else empty), range(len(TOOLS)))))
    return runs, before, git_status(), empty


@pytest.mark.parametrize("tool", TOOLS)
def test_help_prints_usage_and_exits_0(helped, tool):
    done = helped[0][tool]
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: "), done.stdout[:500]


def test_help_changes_nothing(helped):
    _, before, after, empty = helped
    assert after <= before, f"new or changed in the repository: {sorted(after - before)}"
    assert not list(empty.iterdir()), f"written where the tools ran: {list(empty.iterdir())}"
    assert not (ROOT / "--help").exists()


def test_every_tool_parses_its_arguments():
    for tool in TOOLS:
        text = source(tool).read_text()
        assert "argparse" in text and '__name__ == "__main__"' in text, f"{tool} has no argument parser"


def test_make_handout_refuses_any_path_of_the_repository_but_its_own(monkeypatch):
    done = run("tools.publishing.make_handout", "book", "--no-html")
    assert done.returncode == 1 and "refuses to write into book" in done.stderr, done.stderr
    assert "inside the course repository" in done.stderr and "Nothing was deleted" in done.stderr
    monkeypatch.chdir(ROOT)
    for path in ["book", ".", "tools/grading", "_build", "src/mha/new_folder", "..", ROOT / "book" / ".."]:
        with pytest.raises(output_folder.FolderRefused, match="course repository"):
            make_handout.make_handout(path, build_html=False, repository=None)
    assert (ROOT / "book" / "intro.md").is_file() and (ROOT / "tools" / "grading" / "exports.py").is_file()
    assert not (ROOT / "src" / "mha" / "new_folder").exists()


def test_make_handout_refuses_a_folder_it_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("three years of work")
    done = run("tools.publishing.make_handout", mine, "--no-html")
    assert done.returncode == 1, done.stdout
    assert str(mine) in done.stderr and "holds no .mha-handout" in done.stderr, done.stderr
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == \
        "three years of work"
    (tmp_path / "a file").write_text("x")
    with pytest.raises(output_folder.FolderRefused, match="is not a folder"):
        make_handout.make_handout(tmp_path / "a file", build_html=False, repository=None)


def test_make_handout_writes_again_where_it_wrote_before(tmp_path):
    """A new folder, then the same folder again (the marker says it is the handout's); an empty one too."""
    target = tmp_path / "handout"
    done = run("tools.publishing.make_handout", target, "--no-html")
    assert done.returncode == 0, done.stderr[-2000:]
    (target / "key" / "stale.ipynb").write_text("{}")  # what the next run must clear
    assert make_handout.make_handout(target, build_html=False, repository=None) == target
    assert (target / ".mha-handout").is_file() and (target / "student" / "exercises.json").is_file()
    assert not (target / "key" / "stale.ipynb").exists()
    (tmp_path / "empty").mkdir()
    assert make_handout.make_handout(tmp_path / "empty", build_html=False, repository=None) == tmp_path / "empty"
    course = nbgrader_source.write_nbgrader_source(target)
    assert (course / ".mha-nbgrader").is_file() and nbgrader_source.write_nbgrader_source(target) == course


def test_nbgrader_source_refuses_a_course_it_did_not_make(tmp_path):
    (tmp_path / "nbgrader" / "source").mkdir(parents=True)
    (tmp_path / "nbgrader" / "gradebook.db").write_text("the grades of a term")
    with pytest.raises(output_folder.FolderRefused, match="holds no .mha-nbgrader"):
        nbgrader_source.write_nbgrader_source(tmp_path)
    assert (tmp_path / "nbgrader" / "gradebook.db").read_text() == "the grades of a term"
    assert (tmp_path / "nbgrader" / "source").is_dir()
    with pytest.raises(output_folder.FolderRefused, match="inside the course repository"):
        nbgrader_source.write_nbgrader_source(ROOT / "book")


def test_make_gradescope_needs_an_assignment_and_overwrites_only_its_own_zip(tmp_path):
    tool = "tools.grading.make_gradescope"
    done = run(tool, tmp_path / "autograder.zip")
    assert done.returncode == 2 and "--assignment" in done.stderr and not list(tmp_path.iterdir())
    done = run(tool, ROOT / "README.md", "--assignment", "5")
    assert done.returncode == 2 and "README.md does not end in .zip" in done.stderr, done.stderr
    (tmp_path / "notes.zip").write_text("not a zip")
    with pytest.raises(ValueError, match="not a .zip file made by this tool"):
        make_gradescope.make_autograder(tmp_path / "notes.zip", assignment="5")
    assert (tmp_path / "notes.zip").read_text() == "not a zip"
