"""Where the time of a pytest run goes: seconds and failures per work unit, written to $MHA_TIMES.

A work unit is a test file, or a chapter under one pass of kernels (tests/kernel_passes.py). The
controller of a pytest-xdist run (or a run without xdist) adds up the duration of every report,
setup and teardown included (a module's fixtures count in its first and last test), and writes

    {"wall": seconds, "exitstatus": n, "units": {unit: seconds}, "failed": [unit, ...]}

for the table that ends `make test` (tests/stage_times.py), for the order of the next run
(tests/unit_order.py) and for `make quick`'s stamps (tests/quick.py).
"""

import json
import os
import time
from collections import defaultdict
from pathlib import Path


class UnitTimes:
    """A pytest plugin: register it on the controller only (xdist's workers forward their reports)."""

    def __init__(self, path):
        self.path = Path(path)
        self.seconds = defaultdict(float)
        self.failed = set()
        self.start = time.time()

    def pytest_runtest_logreport(self, report):
        unit = report.nodeid.split("::", 1)[0]
        self.seconds[unit] += report.duration
        if report.failed:
            self.failed.add(unit)

    def pytest_collectreport(self, report):
        if report.failed:
            self.failed.add(report.nodeid.split("::", 1)[0] or "collection")

    def pytest_sessionfinish(self, session, exitstatus):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"wall": round(time.time() - self.start, 1), "exitstatus": int(exitstatus),
                  "units": {unit: round(s, 2) for unit, s in sorted(self.seconds.items())},
                  "failed": sorted(self.failed)}
        self.path.write_text(json.dumps(record, indent=1) + "\n")


def register(config):
    """Time this run into $MHA_TIMES, when it is set, from the controller."""
    if os.environ.get("MHA_TIMES") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(UnitTimes(os.environ["MHA_TIMES"]), "mha-unit-times")
