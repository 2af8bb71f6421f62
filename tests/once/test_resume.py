"""Exact resume: a run killed by SIGKILL mid-epoch and rerun equals an
uninterrupted run (per-epoch losses and final weights, bit for bit on JAX),
because the rerun restores the backup *and* reads the data stream (shuffle
order, crops, flips, RandAugment ops, MixUp) of the epoch it resumes."""

import json
import signal
import subprocess
import sys

import numpy as np
from conftest import KILL_CALLBACK
from conftest import subprocess_env

CHILD = r"""
import json, os, signal, sys
import keras, numpy as np
from keras_reluvit import train as T

out, kill_at = sys.argv[1], json.loads(sys.argv[2])
cfg = T.build_config(recipe="digits", epochs=4, data_dir=sys.argv[3], batch_size=128)
cfg["model"].update(width=32, depth=1, num_heads=2, mlp_dim=64)
# Crops, flips, RandAugment (keyed by the same per-example draw; one op per
# image here: tracing each op's 11 branches costs ~10 s a run) and MixUp.
cfg["augment"].update(mixup=0.2, flip=True, randaug=(1, 10))
""" + KILL_CALLBACK + r"""
model, metrics = T.train(cfg, out, export=False, verbose=0,
                         extra_callbacks=[Kill()] if kill_at else [])
np.savez(os.path.join(out, "weights.npz"),
         *[keras.ops.convert_to_numpy(v) for v in model.weights])
"""


def run(out, kill_at, data_dir):
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(out), json.dumps(kill_at), str(data_dir)],
        env=subprocess_env("jax"), capture_output=True, text=True, timeout=600)


def test_run_killed_mid_epoch_resumes_exactly_on_jax(tmp_path):
    data = tmp_path / "data"
    full = run(tmp_path / "full", None, data)  # also prepares the data set
    assert full.returncode == 0, full.stderr[-3000:]

    killed = run(tmp_path / "resumed", [2, 3], data)  # 4th batch of the 3rd epoch
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    backup = json.loads((tmp_path / "resumed" / "backup" / "training_metadata.json").read_text())
    assert backup["epoch"] == 2
    assert not (tmp_path / "resumed" / "model.keras").exists()

    rerun = run(tmp_path / "resumed", None, data)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    def history(d):
        return json.loads((tmp_path / d / "metrics.json").read_text())["history"]

    full_h, resumed_h = history("full"), history("resumed")
    assert len(full_h["loss"]) == 4 and len(resumed_h["loss"]) == 2
    # Epochs 3 and 4 (and their validation) as in the uninterrupted run, bit for bit.
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_array_equal(resumed_h[key], full_h[key][2:], err_msg=key)
    a = np.load(tmp_path / "full" / "weights.npz")
    b = np.load(tmp_path / "resumed" / "weights.npz")
    assert len(a.files) == len(b.files) > 0
    for name in a.files:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)
