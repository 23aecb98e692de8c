"""The order in which the work units start: longest first, and no worker waiting on the other's build.

A work unit is what pytest-xdist's `--dist loadfile` gives one worker at a time: a test file, or a
chapter under one pass of kernels (`book/05_x.ipynb@generic`). `make test` passes
`--no-loadscope-reorder`, so xdist hands them out in the order made here.

The order is a list schedule of the two workers: each time a worker is free (in a simulation
driven by the units' measured seconds), it takes the longest unit that is ready. A unit that needs
a shared build (the site, built once per run by the first file that asks for it) is ready when
nobody has started that build yet (it will build it), or when the build should be done; a unit
that would only wait on the lock is passed over while other work remains.

The seconds come from the last local run ($MHA_TIMES of `make test` or `make quick`, kept in
.cache/test-times/) or, on a fresh clone, from tests/durations.json (a stored copy; refresh it
with `cp .cache/test-times/main.json tests/durations.json` when the suite changes a lot).
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURED = [ROOT / ".cache" / "test-times" / "main.json", ROOT / "tests" / "durations.json"]
WORKERS = 2
UNKNOWN_SECONDS = 10.0  # a unit never measured: a new test file
# Builds shared by several files of one run (tests/conftest.py's built_site, tests/handouts.py), and their seconds
SHARED_BUILDS = {
    "site": ({"tests/test_site.py", "tests/test_pdf.py", "tests/test_offline_site.py", "tests/test_book.py",
              "tests/test_adoption.py"}, 120.0),
    # tests/handouts.py's shared handout: its notebooks first (the grading tests need no more), its site after
    "handout": ({"tests/test_handout.py", "tests/test_grading.py", "tests/test_gradescope.py",
                 "tests/test_grading_attacks.py", "tests/test_grading_agreement.py",
                 "tests/test_grading_copies.py", "tests/test_handout_answers.py",
                 "tests/test_checks_routes_syntax.py"}, 60.0),
}


def unit_of(nodeid):
    """The work unit of a node id: the part before its first '::'."""
    return nodeid.split("::", 1)[0]


def measured_seconds():
    """{unit: seconds} from the freshest record there is, merged over the stored one."""
    seconds = {}
    for path in reversed(MEASURED):
        if path.exists():
            try:
                seconds.update(json.loads(path.read_text()).get("units", {}))
            except (json.JSONDecodeError, AttributeError):
                continue  # a record cut short by an interrupted run
    return seconds


def estimate(unit, seconds):
    """A unit's expected seconds: measured, or its chapter's own run for a pass never measured."""
    if unit in seconds:
        return seconds[unit]
    if "@" in unit and unit.split("@")[0] in seconds:
        return 1.5 * seconds[unit.split("@")[0]]
    return UNKNOWN_SECONDS


def build_of(unit):
    return next((name for name, (users, _) in SHARED_BUILDS.items() if unit in users), None)


def schedule(durations):
    """The units in the order two workers should take them (see the module's docstring)."""
    waiting = sorted(durations, key=lambda u: (-durations[u], u))
    free_at = [0.0] * WORKERS
    build_done = {}
    order = []
    while waiting:
        worker = min(range(WORKERS), key=free_at.__getitem__)
        now = free_at[worker]
        ready = [u for u in waiting if build_of(u) is None or build_done.get(build_of(u), now) <= now]
        unit = ready[0] if ready else waiting[0]
        build = build_of(unit)
        start = now if build is None else max(now, build_done.get(build, now))
        if build is not None and build not in build_done:
            build_done[build] = now + SHARED_BUILDS[build][1]
        free_at[worker] = start + durations[unit]
        waiting.remove(unit)
        order.append(unit)
    return order


def longest_first(items):
    """The items regrouped by unit, the units in `schedule` order, each unit's items in their own order."""
    by_unit = {}
    for item in items:
        by_unit.setdefault(unit_of(item.nodeid), []).append(item)
    seconds = measured_seconds()
    order = schedule({unit: estimate(unit, seconds) for unit in by_unit})
    return [item for unit in order for item in by_unit[unit]]
