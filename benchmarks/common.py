"""Shared by the benchmark scripts: where and how results are written."""

import json
import os
import platform
import statistics
import time


def machine():
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"


def write(out_dir, name, text, payload):
    """`name.md` (machine line + tables) and `name.json` under `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write(f"Machine: {machine()}\n\n{text}")
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(dict(machine=machine(), **payload), f, indent=1)


def median_time(fn, reps):
    """The median of `reps` timed calls of `fn`, after one untimed call."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
