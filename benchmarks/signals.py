"""What a SIGTERM costs at each moment of a `keras-reluvit train` run, per
backend: seconds from the signal to the exit, the exit status, the steps
trained and not saved, what the output folder holds, and whether the rerun
(the same command) ends the run.

Each moment runs the main job's digits recipe (tiny model, 2 epochs) in a
child process; the child marks the moment in a file and the parent sends
SIGTERM as soon as it sees it (the signal comes from outside, as a spot
machine's does). `imports` signals 1 s after the start of the real
`keras-reluvit train` console script.

    python -m benchmarks.signals --out benchmarks/results      # every backend
    python -m benchmarks.signals --backends jax --out /tmp
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MOMENTS = ("imports", "data", "mid-epoch", "last validation", "artefacts")
ARGS = ["--epochs", "2", "--batch-size", "256", "--quiet", "--no-export"]


def child(moment, marker, output, data_dir):
    """Runs the CLI with a hook that writes `marker` (the optimizer steps
    done) at `moment`, then waits there for the parent's signal."""
    import keras

    from keras_reluvit import cli
    from keras_reluvit.training import run as T

    def mark(steps):
        with open(marker + ".tmp", "w") as f:
            f.write(str(steps))
        os.replace(marker + ".tmp", marker)
        time.sleep(0.5)  # the signal arrives within this moment

    class Hook(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if moment == "mid-epoch" and self.epoch == 0 and batch == 2:
                mark(int(self.model.optimizer.iterations))

        def on_test_begin(self, logs=None):
            if moment == "last validation" and self.epoch == 1:
                mark(int(self.model.optimizer.iterations))

    train = T.train

    def hooked(config, out, **kwargs):
        return train(config, out, extra_callbacks=[Hook()], **kwargs)

    T.train = hooked
    if moment == "data":
        load = T.kr_data.load

        def loaded(*a, **k):
            d = load(*a, **k)
            mark(0)
            return d

        T.kr_data.load = loaded
    if moment == "artefacts":
        plot = T.plot_curves

        def plotting(*a):
            mark(-1)
            return plot(*a)

        T.plot_curves = plotting
    model = ["--output", output, "--data-dir", data_dir] + ARGS
    sys.exit(cli.main(["train"] + model))


def run_moment(backend, moment, root, data_dir):
    output = os.path.join(root, f"{backend}-{moment.replace(' ', '-')}")
    marker = output + ".marker"
    env = dict(os.environ, KERAS_BACKEND=backend)
    if moment == "imports":
        cmd = [shutil.which("keras-reluvit") or "keras-reluvit", "train", "--output", output,
               "--data-dir", data_dir] + ARGS
    else:
        cmd = [sys.executable, "-m", "benchmarks.signals", "--child", moment, marker, output,
               data_dir]
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    if moment == "imports":
        time.sleep(1.0)
        steps_at_signal = 0
    else:
        while not os.path.exists(marker) and proc.poll() is None:
            time.sleep(0.01)
        steps_at_signal = int(open(marker).read()) if os.path.exists(marker) else None
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    exited = time.time()
    stopped = [line for line in out.splitlines() if "stopped by" in line]
    from keras_reluvit.training.backup import StepBackup

    record = StepBackup(os.path.join(output, "backup")).latest(quiet=True)
    saved = record["step"] if record else 0
    held = sorted(n for n in os.listdir(output) if not n.startswith(".")) if os.path.isdir(
        output) else []
    rerun = subprocess.run(cmd if moment == "imports" else cmd[:4] + ["none"] + cmd[5:],
                           env=env, capture_output=True, text=True, timeout=900)
    metrics = os.path.join(output, "metrics.json")
    finished = rerun.returncode == 0 and os.path.exists(metrics)
    steps = json.load(open(metrics))["optimizer_steps"] if finished else None
    return dict(backend=backend, moment=moment, seconds=round(exited - sent, 2),
                started=round(sent - start, 1), exit=proc.returncode,
                said=stopped[0].split("stopped by", 1)[1][:90] if stopped else "",
                steps_at_signal=steps_at_signal, saved_step=saved,
                lost=(None if steps_at_signal is None or steps_at_signal < 0
                      else steps_at_signal - saved), held=held, rerun_exit=rerun.returncode,
                run_steps=steps)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", nargs="+", default=["jax", "tensorflow", "torch"])
    p.add_argument("--moments", nargs="+", default=list(MOMENTS), choices=MOMENTS)
    p.add_argument("--out", help="folder for signals.json and signals.md")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        moment = None if args.child[0] == "none" else args.child[0]
        return child(moment, *args.child[1:])
    root = tempfile.mkdtemp(prefix="krv-signals-")
    data_dir = os.path.join(root, "tfds")
    rows = []
    for backend in args.backends:
        for moment in args.moments:
            row = run_moment(backend, moment, root, data_dir)
            print(json.dumps(row), flush=True)
            rows.append(row)
    shutil.rmtree(root, ignore_errors=True)
    if args.out:
        write(rows, args.out)


def write(rows, out, note=""):
    """signals.json and signals.md in `out` (`note`: a line under the table)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "signals.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = [f"Machine: {os.uname().machine}, {os.cpu_count()} cores. Command: python -m "
             "benchmarks.signals --out benchmarks/results", "",
             "SIGTERM from outside at each moment of `keras-reluvit train` (digits, tiny "
             "model, 2 epochs of 5 steps, " + " ".join(ARGS) + "); then the same command "
             "again.", "",
             "| backend | moment | signal to exit (s) | exit | steps at the signal | "
             "steps saved | lost | the line | rerun: exit, steps of the run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        at = "-" if r["steps_at_signal"] in (None, -1) else r["steps_at_signal"]
        lines.append(f"| {r['backend']} | {r['moment']} | {r['seconds']} | {r['exit']} | "
                     f"{at} | {r['saved_step']} | {'-' if r['lost'] is None else r['lost']}"
                     f" | stopped by{r['said']} | {r['rerun_exit']}, {r['run_steps']} |")
    with open(os.path.join(out, "signals.md"), "w") as f:
        f.write("\n".join(lines + ([""] + [note] if note else [])) + "\n")


if __name__ == "__main__":
    main()
