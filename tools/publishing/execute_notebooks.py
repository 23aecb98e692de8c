"""Re-execute the book's notebooks in place and store their fresh outputs.

    make notebooks                                   # every chapter
    .venv/bin/python -m tools.publishing.execute_notebooks book/01_weighted_average.ipynb

Runs with PYTHONHASHSEED=0 (set by the Makefile) so that stored outputs are the
ones nbval will see. Prints how long each notebook took.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def execute(path):
    import nbformat
    from nbclient import NotebookClient
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:  # no timestamps in the stored notebooks: quieter diffs
        cell.metadata.pop("execution", None)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nbformat.write(notebook, path)
    return seconds


def main(argv):
    parser = argparse.ArgumentParser(description="Re-execute the book's notebooks in place and store their "
                                     "fresh outputs.")
    parser.add_argument("notebooks", nargs="*", type=Path, help="the notebooks (default: every one in book/)")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"{path} is not a notebook (.ipynb file)")
    paths = [path.resolve() for path in args.notebooks] or sorted((ROOT / "book").glob("*.ipynb"))
    if not paths:
        sys.exit("no notebooks found in book/")
    for path in paths:
        print(f"{path.relative_to(ROOT)}: {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
