"""`make quick`: re-run only what a change can affect, from content-hash stamps kept in .cache/quick/.

A unit is a test file, or a chapter (re-executed under every kernel, tests/kernel_passes.py). Each
unit's stamp is a hash of what it reads:

- a chapter: its notebook, the library (everything under src/), the run's configuration;
- a test file: itself, the library, tools/, benchmarks/, the suite's helpers, the configuration,
  and of the book what it reads: all of it (the site and its browser checks, the handout), one
  chapter (chapter NN's claims file), or only the notebooks' code and directives (the grading runs,
  the checks, the environments: a change to a chapter's prose does not change them).

A unit runs when its stamp differs from the one recorded after its last passing run (`make test`
records stamps too; CI never reads them: `make test` always runs everything). The hashes are taken
before the run, so an edit made while it runs is seen by the next one.

    python3 tests/quick.py run        # what `make quick` does: choose, run in one pytest session, record
    python3 tests/quick.py plan       # only say what would run, and why
    python3 tests/quick.py snapshot   # hash every unit now (before `make test`'s session)
    python3 tests/quick.py record RUN.json   # stamp the snapshot's units that passed in that run
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / ".cache" / "quick"
STAMPS, SNAPSHOT = FOLDER / "stamps.json", FOLDER / "snapshot.json"
TIMES = ROOT / ".cache" / "test-times" / "quick.json"
CONFIGURATION = ["pyproject.toml", "requirements.txt", "tests/nbval_sanitize.cfg", "tests/conftest.py",
                 "tests/kernel_passes.py"]
PROJECT = ["Makefile", "_config.yml", "_toc.yml", "README.md", "CONTRIBUTING.md", ".ci/run"]
MACHINERY = {"unit_order.py", "unit_times.py", "stage_times.py", "quick.py"}  # how the suite runs, not what it asserts
# Test files that read only the notebooks' code cells and directives (not their prose)
READS_BOOK_CODE = {"test_checks_ch14.py", "test_checks_ch15.py", "test_colab.py", "test_gradescope.py", "test_grading.py",
                   "test_grading_agreement.py", "test_grading_attacks.py", "test_grading_walls.py", "test_lab.py",
                   "test_nbgrader.py", "test_tools_cli.py"}
READS_BOOK_CODE_PATTERN = re.compile(r"test_(checks|grading|solutions)_.*\.py")


def files_under(*paths):
    """Every file under the paths (folders walked), sorted, caches and build outputs left out."""
    found = []
    for path in paths:
        full = ROOT / path
        if full.is_file():
            found.append(full)
        elif full.is_dir():
            found += [p for p in full.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                      and ".ipynb_checkpoints" not in p.parts and not p.name.endswith(".pyc")]
    return sorted(found)


def digest(files, notebook_view=None):
    """One hash over the files' paths and contents (notebooks through `notebook_view` when given)."""
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        data = path.read_bytes()
        if notebook_view and path.suffix == ".ipynb":
            data = notebook_view(data)
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def code_and_directives(data):
    """A notebook's code cells, and the directive lines of its prose (exercises, solutions): what grading reads."""
    cells = json.loads(data).get("cells", [])
    kept = []
    for cell in cells:
        source = "".join(cell.get("source", []))
        if cell.get("cell_type") == "code":
            kept.append(["code", source, cell.get("metadata", {})])
        else:
            kept.append(["prose", [line for line in source.splitlines() if line.lstrip().startswith(("```", ":"))]])
    return json.dumps(kept, sort_keys=True).encode()


def chapters():
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def book_inputs(test_file):
    """What of the book a test file reads: (files, notebook view), or None if it reads none."""
    source = (ROOT / test_file).read_text(errors="replace")
    name = Path(test_file).name
    claims = re.fullmatch(r"test_claims_ch(\d\d)(?:_\w+)?\.py", name)  # test_claims_ch14_models.py too
    if claims:
        return files_under(*[c for c in chapters() if Path(c).name.startswith(claims.group(1))]), None
    if not re.search(r"\bbook\b|CHAPTERS|toc_files|built_site|\.ipynb", source):
        return None
    if name in READS_BOOK_CODE or READS_BOOK_CODE_PATTERN.fullmatch(name):
        return files_under("book"), code_and_directives
    return files_under("book", "references.bib"), None


def helpers_of(test_file):
    """The suite's helper modules (tests/*.py, not test files) that a file imports, at any depth, and
    tests/conftest.py's: what the file runs of the suite besides itself. The suite's machinery
    (the order, the times, these stamps) changes no test's answer and is left out."""
    found, waiting = set(), [ROOT / test_file, ROOT / "tests" / "conftest.py"]
    while waiting:
        path = waiting.pop()
        text = path.read_text(errors="replace")
        for name in re.findall(r"^\s*(?:from|import)\s+(\w+)", text, flags=re.MULTILINE):
            helper = ROOT / "tests" / f"{name}.py"
            if helper.exists() and not name.startswith("test_") and helper not in found:
                found.add(helper)
                waiting.append(helper)
    return sorted(found | {ROOT / "tests" / "conftest.py"}) + [p for p in files_under("tests/data")]


def unit_hashes():
    """{unit: hash} for every chapter and every test file."""
    library = files_under("src")
    configuration = files_under(*CONFIGURATION)
    code = library + configuration + files_under("tools", "benchmarks", *PROJECT)
    hashes = {chapter: digest(files_under(chapter) + library + configuration) for chapter in chapters()}
    for test_file in sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")):
        book = book_inputs(test_file)
        own = digest(files_under(test_file) + code + [p for p in helpers_of(test_file) if p.name not in MACHINERY])
        hashes[test_file] = own if book is None else own + digest(*book)
    return hashes


def load(path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def snapshot():
    FOLDER.mkdir(parents=True, exist_ok=True)
    hashes = unit_hashes()
    SNAPSHOT.write_text(json.dumps(hashes, indent=1))
    return hashes


def record(run_file):
    """Stamp every unit of the snapshot that ran in `run_file` (tests/unit_times.py's record) with no failure."""
    hashes, run = load(SNAPSHOT), load(Path(run_file))
    ran, failed = set(run.get("units", {})), set(run.get("failed", []))
    if "collection" in failed or run.get("exitstatus") not in (0, 1):
        return 0  # an interrupted or broken session proves nothing
    stamps = load(STAMPS)
    stamped = 0
    for unit, value in hashes.items():
        parts = [u for u in ran if u == unit or u.startswith(unit + "@")]
        if parts and not any(u in failed for u in ran if u == unit or u.startswith(unit + "@")):
            stamps[unit] = value
            stamped += 1
        elif parts:
            stamps.pop(unit, None)
    STAMPS.write_text(json.dumps(stamps, indent=1, sort_keys=True))
    return stamped


def plan(hashes):
    stamps = load(STAMPS)
    return [unit for unit in hashes if stamps.get(unit) != hashes[unit]]


def run():
    started = time.time()
    hashes = snapshot()
    units = plan(hashes)
    if not units:
        print("make quick: nothing changed since each unit last passed; nothing to run")
        return 0
    print(f"make quick: {len(units)} of {len(hashes)} units changed since they last passed:\n  " + "\n  ".join(units))
    if not any(unit.startswith("tests/") for unit in units):
        units.append("tests/conftest.py")  # collected as a file of no tests, it loads the suite's hooks (kernel passes, times)
    env = {**os.environ, "MHA_DEVICE": "cpu", "PYTHONHASHSEED": "0", "MHA_KERNEL_PASSES": "all", "MHA_TIMES": str(TIMES)}
    command = [str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-n", "2", "--dist", "loadfile",
               "--no-loadscope-reorder", "--nbval", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", *units]
    status = subprocess.run(command, cwd=ROOT, env=env).returncode
    stamped = record(TIMES)
    print(f"make quick: {time.time() - started:.0f} s; {stamped} units stamped as passing")
    return status


if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["run"]:
        sys.exit(run())
    elif command == ["plan"]:
        units = plan(unit_hashes())
        print("\n".join(units) if units else "nothing to run")
    elif command == ["snapshot"]:
        snapshot()
    elif command == ["record"] and len(sys.argv) == 3:
        print(f"{record(sys.argv[2])} units stamped as passing")
    else:
        sys.exit(f"usage: {sys.argv[0]} run | plan | snapshot | record RUN.json (given: {sys.argv[1:]})")
