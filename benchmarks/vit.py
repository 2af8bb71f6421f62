"""ViT benchmark: ReLU/L vs softmax ViTs, side by side in one process.

    KERAS_BACKEND=jax python -m benchmarks.vit                 # one backend
    python -m benchmarks.vit --all --out benchmarks/results     # each backend

Inference (`model.predict_on_batch`, compiled where the backend compiles) and
one train step (`model.train_on_batch`, AdamW) of ViT-S/16 and ViT-S/8 at
224x224, fp32, batch `--batch` (default 32), medians of `--reps`. The ratio
is softmax time / relu time (> 1: ReLU/L faster).

`--keras-hub` adds, per variant, our softmax backbone against keras-hub's
`ViTBackbone` with the same dims, both as keras-hub builds it (class token,
learned position embedding, no qk-layernorm, exact GELU): ours is
`ViT(variant, attention="softmax", pool="tok", qk_norm=False,
mlp_activation="gelu", include_top=False)`. Ratio: keras-hub time / ours.
keras-hub is not a test dependency; install it beside the pinned stack with
`pip install --no-deps -r requirements/keras-hub.txt`.
"""

import argparse
import os
import subprocess
import sys

from benchmarks import common
from benchmarks.common import median_time


def keras_hub_rows(variants, batch, reps):
    """Our softmax backbone vs keras-hub's ViTBackbone, same dims, inference."""
    import keras
    import keras_hub
    import numpy as np

    import keras_reluvit as kr

    x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    rows = []
    for variant in variants:
        dims = kr.variants.parse_variant(variant)
        ours = kr.ViT(variant, attention="softmax", pool="tok", qk_norm=False,
                      mlp_activation="gelu", include_top=False)
        hub = keras_hub.models.ViTBackbone(
            image_shape=(224, 224, 3), patch_size=dims["patch_size"], num_layers=dims["depth"],
            num_heads=dims["num_heads"], hidden_dim=dims["width"], mlp_dim=dims["mlp_dim"])
        if ours.count_params() != hub.count_params():
            raise RuntimeError(f"{variant}: {ours.count_params()} vs keras-hub "
                               f"{hub.count_params()} parameters: not the same model")
        t_ours = median_time(lambda m=ours: m.predict_on_batch(x), reps)
        t_hub = median_time(lambda m=hub: m.predict_on_batch(x), reps)
        rows.append(dict(backend=keras.backend.backend(), variant=variant, mode="infer",
                         batch=batch, ours_s=round(t_ours, 3), keras_hub_s=round(t_hub, 3),
                         speedup=round(t_hub / t_ours, 3), params=ours.count_params()))
        del ours, hub
    return rows


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
            times[("infer", attention)] = median_time(lambda m=model: m.predict_on_batch(x), reps)
            if train:
                model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                              loss=keras.losses.CategoricalCrossentropy(from_logits=True))
                times[("train", attention)] = median_time(lambda m=model: m.train_on_batch(x, y),
                                                          reps)
            del model
        for mode in ("infer", "train") if train else ("infer",):
            r, s = times[(mode, "relu")], times[(mode, "softmax")]
            rows.append(dict(backend=keras.backend.backend(), variant=variant, mode=mode,
                             batch=batch, relu_s=round(r, 3), softmax_s=round(s, 3),
                             speedup=round(s / r, 3)))
    return rows


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="S/16,S/8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--keras-hub", action="store_true",
                   help="also our softmax backbone vs keras_hub.models.ViTBackbone")
    p.add_argument("--all", action="store_true")
    p.add_argument("--out")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.all:
        for backend in ("jax", "tensorflow", "torch"):
            cmd = [sys.executable, "-m", "benchmarks.vit", "--variants", args.variants,
                   "--batch", str(args.batch), "--reps", str(args.reps)]
            cmd += (["--no-train"] if args.no_train else []) + (["--out", args.out] if args.out else [])
            cmd += ["--keras-hub"] if args.keras_hub else []
            subprocess.run(cmd, env=dict(os.environ, KERAS_BACKEND=backend), check=True)
        return
    import keras

    rows = run(args.variants.split(","), args.batch, args.reps, not args.no_train)
    text = (f"## ViT, {keras.backend.backend()}\n\n| backend | model | mode | batch | relu s | softmax s "
            "| softmax / relu |\n|---|---|---|---|---|---|---|\n" + "\n".join(
                f"| {r['backend']} | {r['variant']} | {r['mode']} | {r['batch']} | {r['relu_s']} | "
                f"{r['softmax_s']} | {r['speedup']:.2f}x |" for r in rows) + "\n")
    hub_rows = []
    if args.keras_hub:
        hub_rows = keras_hub_rows(args.variants.split(","), args.batch, args.reps)
        text += ("\n| backend | model | batch | params | ours softmax s | keras-hub s "
                 "| keras-hub / ours |\n|---|---|---|---|---|---|---|\n" + "\n".join(
                     f"| {r['backend']} | {r['variant']} | {r['batch']} | {r['params']:,} | "
                     f"{r['ours_s']} | {r['keras_hub_s']} | {r['speedup']:.2f}x |"
                     for r in hub_rows) + "\n")
    print(text)
    if args.out:
        name = f"vit_{keras.backend.backend()}"
        common.write(args.out, name, text, dict(rows=rows, keras_hub=hub_rows))

if __name__ == "__main__":
    main()
