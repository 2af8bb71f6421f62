"""The two lanes of scripts/test.sh, balanced from the last measured durations.

The once lane runs `tests/once` and the backend-independent tests under
torch; the backend lane runs the three per-backend suites one after the
other. Files of `tests/once` move to the end of the backend lane (still run
once, under torch) while that lowers the longer lane's total, each time the
file that lowers it most,
by the seconds in `tests/durations.json` (a file it has no number for stays).

    python scripts/lanes.py second-lane      # the tests/once files to move
    python scripts/lanes.py totals           # each lane's seconds, as balanced
    python scripts/lanes.py update DIR       # tests/durations.json from a run's
                                             # KRV_DURATIONS_DIR=DIR bash scripts/test.sh

`update` keeps, per suite (once, jax, tensorflow, torch), each file's
seconds in its tests (setup + call + teardown; not collection or start-up).
"""

import glob
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURATIONS = os.path.join(ROOT, "tests", "durations.json")
BACKENDS = ("jax", "tensorflow", "torch")


def load(path=DURATIONS):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def balance(durations):
    """(the tests/once files moved to the backend lane, once-lane seconds,
    backend-lane seconds)."""
    once = dict(durations.get("once", {}))
    a = sum(once.values())
    b = sum(sum(durations.get(s, {}).values()) for s in BACKENDS)
    moved = []
    movable = {f: s for f, s in once.items() if f.startswith("tests/once/")
               and os.path.exists(os.path.join(ROOT, f))}
    while movable:  # each time the move that shortens the longer lane most
        path = min(movable, key=lambda f: (max(a - movable[f], b + movable[f]), f))
        seconds = movable.pop(path)
        if max(a - seconds, b + seconds) >= max(a, b):
            break
        a, b = a - seconds, b + seconds
        moved.append(path)
    return sorted(moved), a, b


def update(directory):
    """Merges a run's per-test files (durations-<suite>.json; the once
    lane's two parts both "once") into tests/durations.json, per suite and
    file; a suite the run did not have keeps its numbers."""
    found = load()
    merged = defaultdict(lambda: defaultdict(float))
    for path in sorted(glob.glob(os.path.join(directory, "durations-*.json"))):
        suite = os.path.basename(path)[len("durations-"):-len(".json")]
        suite = "once" if suite.startswith("once") else suite
        with open(path) as f:
            for nodeid, seconds in json.load(f).items():
                merged[suite][nodeid.split("::")[0]] += seconds
    for suite, per_file in merged.items():
        found[suite] = {k: round(v, 1) for k, v in sorted(per_file.items())}
    with open(DURATIONS, "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)
        f.write("\n")
    return found


def main(argv):
    command = argv[0] if argv else "totals"
    if command == "second-lane":
        print(" ".join(balance(load())[0]))
    elif command == "totals":
        moved, a, b = balance(load())
        print(f"once lane {a / 60:.1f} min, backend lane {b / 60:.1f} min "
              f"({len(moved)} files of tests/once moved: {', '.join(moved) or 'none'})")
    elif command == "update" and len(argv) == 2:
        found = update(argv[1])
        print(f"{DURATIONS}: " + ", ".join(f"{s} {sum(v.values()) / 60:.1f} min"
                                            for s, v in sorted(found.items())))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
