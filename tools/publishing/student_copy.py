"""The students' copy of the course: a repository and a website that lead to no solution.

The public book shows every solution (collapsed), its notebooks hold them, and
its repository, Colab and Binder buttons open those notebooks. The copy that
tools/publishing/make_handout.py writes to `_handout/student/` instead has:

- a `_config.yml` with no repository, edit or issue button, and launch buttons
  (Colab, Binder) only when handout.yml names a student repository, pointing
  there; without one, no launch button at all;
- chapters whose Colab install cell installs the library from that student
  repository, or no such cell without one;
- a short page for students in place of the instructors' page;
- a website that works offline: MathJax served from the site itself, and no
  thebe (book/_ext/offline_site.py);
- what a repository needs to be launched (pyproject.toml, requirements.txt,
  runtime.txt, a README.md), so that the instructor can publish the folder as is.

The student repository is read in one place, `student_repository()`.
"""

import shutil
from pathlib import Path

import yaml

from tools.publishing import colab_cell

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "handout.yml"
COPIED_FILES = ["_toc.yml", "pyproject.toml", "requirements.txt", "runtime.txt"]
NO_LAUNCH_BUTTONS = {"binderhub_url": "", "jupyterhub_url": "", "colab_url": "", "deepnote_url": "", "thebe": False}
NO_REPOSITORY_BUTTONS = {"use_repository_button": False, "use_edit_page_button": False, "use_issues_button": False}
STUDENT_PAGE = """\
# For instructors

This is the students' edition of the course. Its exercises come without
solutions: each *Implement* exercise is a function for you to write, followed by
the check that tests it. Your instructor has the worked solutions, and grades
the exercises.
"""
STUDENT_README = """\
# Multi-Head Attention, Built Step by Step: the students' edition

The chapters are the notebooks in `book/`. Each ends with exercises; each
*Implement* exercise is a function to write, followed by a check that tests it.

Set up once, with Python 3.11: `python -m venv .venv && .venv/bin/python -m pip
install -r requirements.txt`. Then open the chapters in JupyterLab with
`.venv/bin/jupyter lab book/`, or build the website with
`.venv/bin/jupyter-book build .`. Or, with no install at all, open a chapter in
Colab (https://colab.research.google.com): its first cell installs the course
library there.
"""


def student_repository(settings=SETTINGS):
    """(url, branch) of the students' copy that handout.yml names, or None."""
    named = (yaml.safe_load(Path(settings).read_text()) or {}).get("student_repository") or {}
    url = (named.get("url") or "").strip().rstrip("/")
    if not url:
        return None
    public, _ = colab_cell.repository()
    if url.lower() == public.lower():
        raise SystemExit("handout.yml: student_repository names the public course repository, "
                         "whose notebooks hold the solutions; name the students' copy instead")
    return url, named.get("branch") or "main"


def site_config(repository):
    """The book's _config.yml for the student website, given the student repository (or None)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["html"].update(NO_REPOSITORY_BUTTONS)
    # A site that works sent as a zip: MathJax from the site itself, no thebe (book/_ext/offline_site.py).
    config["sphinx"]["config"]["mha_offline_site"] = True
    if repository:
        url, branch = repository
        config["repository"] = {"url": url, "branch": branch, "path_to_book": ""}
    else:
        config["repository"] = {"url": "", "branch": "", "path_to_book": ""}
        config["launch_buttons"] = dict(NO_LAUNCH_BUTTONS)
    return config


def write_student_copy(destination, repository):
    """The book's sources without notebooks, the library, and the files above, in `destination`."""
    for name in COPIED_FILES:
        shutil.copy(ROOT / name, destination / name)
    header = "# Written by tools/publishing/make_handout.py from the course's _config.yml and handout.yml.\n"
    config = yaml.safe_dump(site_config(repository), sort_keys=False, allow_unicode=True)
    (destination / "_config.yml").write_text(header + config)
    (destination / "README.md").write_text(STUDENT_README)
    shutil.copytree(ROOT / "book", destination / "book", ignore=shutil.ignore_patterns("*.ipynb", ".*"))
    (destination / "book" / "instructors.md").write_text(STUDENT_PAGE)
    shutil.copytree(ROOT / "src", destination / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))


def set_install_cell(notebook, destination, repository):
    """The chapter's Colab install cell: from the student repository, or none without one."""
    if repository:
        source = colab_cell.cell_source(destination / "_config.yml", colab_cell.colab_packages(notebook),
                                        colab_cell.colab_requirements(notebook))
        colab_cell.apply(notebook, source)
    else:
        notebook.cells = [c for c in notebook.cells if not colab_cell.is_install_cell(c)]
    return notebook



if __name__ == "__main__":  # a module, not a command: `--help` says so, and nothing runs
    import argparse
    SAID = "A module of tools/publishing/make_handout.py, which imports it: it has no command of its own."
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=SAID).parse_args()
    print(f"tools/publishing/student_copy.py: {SAID}")
