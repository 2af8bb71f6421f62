"""A pytest plugin (`-p tests.helpers.durations`, as scripts/test.sh runs
every suite): each test's seconds (setup + call + teardown) kept, the
per-file totals printed at the end of the run, and with
`KRV_DURATIONS_OUT=path.json` every test's seconds written there
(`scripts/lanes.py` merges a CI run's files into `tests/durations.json`,
from which it balances the two lanes of the next runs)."""

import json
import os
from collections import defaultdict

_SECONDS = defaultdict(float)


def pytest_runtest_logreport(report):
    _SECONDS[report.nodeid] += report.duration


def file_of(nodeid):
    return nodeid.split("::")[0]


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    per_file = defaultdict(float)
    for nodeid, seconds in _SECONDS.items():
        per_file[file_of(nodeid)] += seconds
    total = sum(per_file.values())
    terminalreporter.write_sep("=", f"seconds per file ({len(per_file)} files, {total:.0f} s "
                               "in tests)")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    out = os.environ.get("KRV_DURATIONS_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(dict(sorted(_SECONDS.items())), f, indent=0)
