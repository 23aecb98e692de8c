"""The table that ends `make test` and `make quick`: where the time went.

    python3 tests/stage_times.py start             # the clock starts (the Makefile's first step)
    python3 tests/stage_times.py mark install      # the seconds since the last mark, as a stage
    python3 tests/stage_times.py table             # the table: stages, passes, environment tests, slowest units

Wall seconds for the stages; for what runs inside the pytest session (its two workers share
it), the seconds each part kept a worker busy, from the record of tests/unit_times.py. Every
closing note quotes the seconds an issue added from this same table. Standard library only:
it runs with the system's python3, before the course's environment exists.
"""

import json
import sys
import time
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / ".cache" / "test-times"
STAGES = FOLDER / "stages.json"
MAIN = FOLDER / "main.json"  # what tests/unit_times.py writes for the Makefile's pytest session
ENVIRONMENT_TESTS = {  # the tests that stand up a whole environment: a browser, a venv, a server, a sandbox
    "tests/test_site.py": "site in a browser (chromium, axe)", "tests/test_pdf.py": "PDF",
    "tests/test_offline_site.py": "offline site", "tests/test_colab.py": "Colab-like venv",
    "tests/test_nbgrader.py": "nbgrader venv", "tests/test_lab.py": "JupyterLab",
    "tests/test_handout.py": "handout", "tests/test_gradescope.py": "Gradescope",
    "tests/test_grading.py": "grading", "tests/test_grading_walls.py": "grader's walls",
}


def load(path, default):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def start():
    FOLDER.mkdir(parents=True, exist_ok=True)
    STAGES.write_text(json.dumps({"start": time.time(), "last": time.time(), "stages": []}))
    # the last run's main.json stays: tests/unit_order.py orders this run by it (rows() reads it only if newer)


def mark(name):
    record = load(STAGES, None)
    if record is None:  # no start: count from now on
        start()
        record = load(STAGES, None)
    now = time.time()
    record["stages"].append([name, round(now - record["last"], 1)])
    record["last"] = now
    STAGES.write_text(json.dumps(record))


def kernel_pass(unit):
    """The kernels of a chapter's unit ("this CPU's", "generic", "avx2"), or None for a test file."""
    if not unit.startswith("book/") and "@" not in unit:
        return None
    return unit.split("@", 1)[1] if "@" in unit else "this CPU's"


def rows():
    """(label, seconds) of the table, in order; a label starting with spaces is a part of the row above."""
    record = load(STAGES, {"stages": [], "start": 0})
    fresh = MAIN.exists() and MAIN.stat().st_mtime >= record.get("start", 0)
    session = load(MAIN, {}) if fresh else {}
    session = {"units": session.get("units", {}), "failed": session.get("failed", [])}
    units = session["units"]
    table = [(name, seconds) for name, seconds in record["stages"]]
    if units:
        passes = {}
        for unit, seconds in units.items():
            if kernel_pass(unit):
                passes[kernel_pass(unit)] = passes.get(kernel_pass(unit), 0.0) + seconds
        table.append(("  busy worker-seconds in the pytest session", sum(units.values())))
        table += [(f"    chapters (+ tests/test_heads.py), {name} kernels", s) for name, s in passes.items()]
        table += [(f"    {what}: {unit}", units[unit]) for unit, what in ENVIRONMENT_TESTS.items() if unit in units]
        table.append(("  its ten slowest units", None))
        slowest = sorted(units.items(), key=lambda kv: -kv[1])[:10]
        table += [(f"    {unit}" + ("  (FAILED)" if unit in session["failed"] else ""), s) for unit, s in slowest]
    if record["stages"]:
        table.append(("total (wall)", sum(s for _, s in record["stages"])))
    return table


def table():
    lines = ["", "Where the time went (seconds: wall for the stages; busy worker-seconds inside the session)"]
    for label, seconds in rows():
        lines.append(f"{label:<78}{'' if seconds is None else f'{seconds:8.0f}'}")
    print("\n".join(lines))


if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["start"]:
        start()
    elif command == ["mark"] and len(sys.argv) == 3:
        mark(sys.argv[2])
    elif command == ["table"]:
        table()
    else:
        sys.exit(f"usage: {sys.argv[0]} start | mark STAGE | table (given: {sys.argv[1:]})")
