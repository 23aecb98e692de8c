"""Grade student notebooks with the automatic checks.

    .venv/bin/python tools/grade.py submissions/*.ipynb

Runs each notebook top to bottom in a fresh kernel, going on after errors, and
reports every check cell: passed, failed (with the first line of the check's
message), or not written (the stub is still there). Exit code 0 when every
check of every notebook passed, 1 otherwise.
"""

import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK_CALL = re.compile(r"^\s*(check_\w+)\(", re.M)


def check_results(notebook):
    """[(check name, status, detail)] for each check cell of an executed notebook."""
    results = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for name in CHECK_CALL.findall(cell.source):
            results.append((name, *status_of(cell, name)))
    return results


def status_of(cell, name):
    for output in cell.outputs:
        if output.output_type == "error":
            if output.ename == "NotImplementedError":
                return "not written", ""
            return "failed", f"{output.ename}: {output.evalue.splitlines()[0] if output.evalue else ''}"
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    if f"{name}: all" in text and "passed" in text:
        return "passed", ""
    return "not run", "an earlier cell failed, or the check printed nothing"


def grade(path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(Path(path).parent)}})
    client.execute()
    return check_results(notebook)


def main(paths):
    if not paths:
        sys.exit("usage: grade.py NOTEBOOK [NOTEBOOK ...]")
    all_passed = True
    for path in paths:
        results = grade(path)
        passed = sum(status == "passed" for _, status, _ in results)
        print(f"{path}: {passed} of {len(results)} checks passed")
        for name, status, detail in results:
            print(f"  {status:<12} {name}  {detail}".rstrip())
        all_passed &= passed == len(results)
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
