"""The main job (`bash scripts/main.sh`) measured: accuracy and time, into
the results file the README and docs/training.md quote.

    python -m benchmarks.main_job --out benchmarks/results/main_job.json   # JAX, ~3-4 min
    KERAS_BACKEND=torch python -m benchmarks.main_job --out ...            # another backend

Runs `keras-reluvit train --quiet` (the main job's command) into a
temporary run directory and records its final held-out accuracy and loss,
the seconds `model.fit` took and the whole command's wall time, with the
backend, the number of CPU cores and the date.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time


def parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="a JSON file to write (default: print only)")
    return p


def measure():
    env = dict(os.environ, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"))
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "default")
        start = time.time()
        subprocess.run([sys.executable, "-m", "keras_reluvit.cli", "train", "--output", output,
                        "--quiet"], env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.time() - start
        with open(os.path.join(output, "metrics.json")) as f:
            metrics = json.load(f)
    return dict(command="bash scripts/main.sh", backend=env["KERAS_BACKEND"],
                accuracy=round(metrics["final"]["accuracy"], 4),
                loss=round(metrics["final"]["loss"], 4),
                train_seconds=round(metrics["train_seconds"], 1), wall_seconds=round(wall, 1),
                cpu_cores=os.cpu_count(), date=datetime.date.today().isoformat())


def main(argv=None):
    args = parser().parse_args(argv)
    result = measure()
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
