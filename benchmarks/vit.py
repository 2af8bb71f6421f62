"""ViT benchmark: ReLU/L vs softmax ViTs, side by side in one process.

    KERAS_BACKEND=jax python -m benchmarks.vit                 # one backend
    python -m benchmarks.vit --all --out benchmarks/results     # each backend

Inference (`model.predict_on_batch`, compiled where the backend compiles) and
one train step (`model.train_on_batch`, AdamW) of ViT-S/16 and ViT-S/8 at
224x224, fp32, batch `--batch` (default 32), medians of `--reps`. The ratio
is softmax time / relu time (> 1: ReLU/L faster). keras-hub's ViTBackbone is
not compared yet (not installed in the test environment).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchmarks import common


def median_time(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(variants, batch, reps, train):
    import keras
    import numpy as np

    import keras_reluvit as kr

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    y = np.eye(1000, dtype="float32")[rng.integers(0, 1000, batch)]
    rows = []
    for variant in variants:
        times = {}
        for attention in ("relu", "softmax"):
            model = kr.ViT(variant, attention=attention, num_classes=1000)
            times[("infer", attention)] = median_time(lambda: model.predict_on_batch(x), reps)
            if train:
                model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                              loss=keras.losses.CategoricalCrossentropy(from_logits=True))
                times[("train", attention)] = median_time(lambda: model.train_on_batch(x, y), reps)
            del model
        for mode in ("infer", "train") if train else ("infer",):
            r, s = times[(mode, "relu")], times[(mode, "softmax")]
            rows.append(dict(backend=keras.backend.backend(), variant=variant, mode=mode,
                             batch=batch, relu_s=round(r, 3), softmax_s=round(s, 3),
                             speedup=round(s / r, 3)))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="S/16,S/8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--all", action="store_true")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.all:
        for backend in ("jax", "tensorflow", "torch"):
            cmd = [sys.executable, "-m", "benchmarks.vit", "--variants", args.variants,
                   "--batch", str(args.batch), "--reps", str(args.reps)]
            cmd += (["--no-train"] if args.no_train else []) + (["--out", args.out] if args.out else [])
            subprocess.run(cmd, env=dict(os.environ, KERAS_BACKEND=backend), check=True)
        return
    import keras

    rows = run(args.variants.split(","), args.batch, args.reps, not args.no_train)
    text = (f"## ViT, {keras.backend.backend()}\n\n| backend | model | mode | batch | relu s | softmax s "
            "| softmax / relu |\n|---|---|---|---|---|---|---|\n" + "\n".join(
                f"| {r['backend']} | {r['variant']} | {r['mode']} | {r['batch']} | {r['relu_s']} | "
                f"{r['softmax_s']} | {r['speedup']:.2f}x |" for r in rows) + "\n")
    print(text)
    if args.out:
        name = f"vit_{keras.backend.backend()}"
        common.write(args.out, name, text, dict(rows=rows))

if __name__ == "__main__":
    main()
