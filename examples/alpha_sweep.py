"""The paper's Figure 2 at laptop scale: accuracy vs the exponent alpha of
`L^-alpha * h(q.k / sqrt(d))` for each activation h, softmax as a line.

Trains the same small ViT for every (activation, alpha) pair, plus the
softmax baseline, on a tfds data set (default: the embedded `sklearn_digits`,
32x32 with 4x4 patches = 64 tokens, so that L matters), and writes

- `OUT/alpha_sweep.csv` — one row per run (appended as runs finish; rerunning
  the same command skips the rows already there, so a killed sweep resumes);
- `OUT/alpha_sweep.png` — one panel per setting, accuracy vs alpha, one line
  per activation, softmax dashed (the paper's layout).

Ablations behind flags: `--qk-norm both` adds runs without qk-layernorm
(Figure 3), `--gated both` adds the sigmoid-gated attention (Figure 4).

    KERAS_BACKEND=jax python examples/alpha_sweep.py                     # -> runs/alpha_sweep
    KERAS_BACKEND=jax python examples/alpha_sweep.py --out examples/results   # the committed run
    KERAS_BACKEND=jax python examples/alpha_sweep.py --qk-norm both --activations relu
"""

import argparse
import contextlib
import csv
import os
import time

ACTIVATIONS = ("relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid")
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
FIELDS = ("dataset", "tokens", "activation", "alpha", "qk_norm", "gated", "seed", "epochs",
          "accuracy", "loss", "final_train_loss", "seconds")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/alpha_sweep",
                   help="output folder (the committed run is examples/results)")
    p.add_argument("--dataset", default="sklearn_digits", help="any tfds image classification set")
    p.add_argument("--data-dir", default=None, help="tfds data_dir")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--patch", type=int, default=4, help="patch size (tokens = (size/patch)^2)")
    add_training_args(p, depth=4, heads=4, epochs=10)
    p.add_argument("--activations", default=",".join(ACTIVATIONS),
                   help="comma-separated subset of " + ",".join(ACTIVATIONS))
    p.add_argument("--alphas", default=",".join(str(a) for a in ALPHAS))
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--qk-norm", choices=("on", "off", "both"), default="on",
                   help="Figure 3 ablation: 'both' also trains without qk-layernorm")
    p.add_argument("--gated", choices=("on", "off", "both"), default="off",
                   help="Figure 4 ablation: 'both' also trains the gated attention")
    p.add_argument("--no-softmax", action="store_true", help="skip the softmax baseline")
    args = p.parse_args(argv)
    args.activations = _names(args.activations)
    args.alphas = [float(a) for a in args.alphas.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if any(a < 0 for a in args.alphas):
        p.error("--alphas must be >= 0")
    if args.image_size % args.patch:
        p.error(f"--image-size {args.image_size} is not divisible by --patch {args.patch}")
    return args


def add_training_args(p, depth, heads, epochs):
    """The model and optimisation flags the experiment scripts share."""
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=depth)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")


def _names(text):
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = sorted(set(names) - set(ACTIVATIONS))
    if unknown:
        raise SystemExit(f"unknown activation(s) {unknown}; valid: {', '.join(ACTIVATIONS)}")
    return names


def _switch(value):
    return {"on": [True], "off": [False], "both": [True, False]}[value]


def grid(args):
    """Every run of the sweep as a dict of its settings."""
    runs = []
    for seed in args.seeds:
        for qk_norm in _switch(args.qk_norm):
            for gated in _switch(args.gated):
                if not args.no_softmax:
                    runs.append(dict(activation="softmax", alpha=None, qk_norm=qk_norm,
                                     gated=gated, seed=seed))
                for act in args.activations:
                    for alpha in args.alphas:
                        runs.append(dict(activation=act, alpha=alpha, qk_norm=qk_norm,
                                         gated=gated, seed=seed))
    return runs


def _key(row):
    alpha = "" if row["alpha"] in (None, "") else f"{float(row['alpha']):g}"
    return (row["activation"], alpha, str(row["qk_norm"]), str(row["gated"]), str(row["seed"]))


@contextlib.contextmanager
def csv_appender(path, fields):
    """A `write(row)` that appends to the CSV at `path` (header on a new
    file) and flushes, so a killed run keeps every finished row."""
    new_file = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fields)
        if new_file:
            writer.writeheader()

        def write(row):
            writer.writerow(row)
            f.flush()

        yield write


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def load_arrays(args):
    """(x_train, y_train), (x_test, y_test), num_classes: the data set in memory,
    through the evaluation preprocessing (no augmentation: every run sees the
    same images, so the sweep compares attention only)."""
    import numpy as np

    import keras_reluvit as kr

    def arrays(split):
        d = kr.data.load(args.dataset, 256, image_size=args.image_size, data_dir=args.data_dir,
                         val_split=split)
        batches = list(d.val.as_numpy_iterator())
        return (np.concatenate([b[0] for b in batches]),
                np.concatenate([b[1] for b in batches])), d.num_classes

    default_train, _, default_val = kr.data.SPLITS.get(args.dataset, ("train", None, "validation"))
    train, num_classes = arrays(default_train)
    test, _ = arrays(default_val)
    return train, test, num_classes


def train_one(run, args, data, return_model=False):
    """Trains one run (a `grid` dict; `learned_scale=True` adds the learned
    per-head scale) and returns its test metrics (and the model)."""
    import keras

    import keras_reluvit as kr

    (x_train, y_train), (x_test, y_test), num_classes = data
    keras.utils.set_random_seed(run["seed"])
    attention = {"activation": run["activation"], "gated": run.get("gated", False)}
    if run["alpha"] is not None:
        attention["seq_len_exponent"] = run["alpha"]
    if run.get("learned_scale"):
        attention["learned_scale"] = True
    model = kr.ViT(variant="Ti/16", attention=attention, qk_norm=run["qk_norm"],
                   image_size=args.image_size, patch_size=args.patch, width=args.width,
                   depth=args.depth, num_heads=args.heads, mlp_dim=2 * args.width,
                   num_classes=num_classes)
    recipe = dict(kr.recipes.get("digits"), lr=args.lr)
    kr.recipes.compile(model, recipe, len(x_train) // args.batch_size,
                       batch_size=args.batch_size, epochs=args.epochs)
    start = time.time()
    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                        verbose=0)
    seconds = time.time() - start
    result = model.evaluate(x_test, y_test, batch_size=256, return_dict=True, verbose=0)
    metrics = dict(accuracy=result["accuracy"], loss=result["loss"],
                   final_train_loss=history.history["loss"][-1], seconds=seconds)
    return (metrics, model) if return_model else metrics


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "alpha_sweep.csv")
    done = {_key(r) for r in read_rows(csv_path)}
    data = load_arrays(args)
    tokens = (args.image_size // args.patch) ** 2
    runs = grid(args)
    todo = [r for r in runs if _key(r) not in done]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already in {csv_path}; {tokens} tokens")
    with csv_appender(csv_path, FIELDS) as write:
        for i, run in enumerate(todo):
            result = train_one(run, args, data)
            row = dict(run, dataset=args.dataset, tokens=tokens, epochs=args.epochs,
                       alpha="" if run["alpha"] is None else run["alpha"], **result)
            write(row)
            print(f"[{i + 1}/{len(todo)}] {run['activation']:8s} alpha={row['alpha']!s:5s} "
                  f"qk_norm={run['qk_norm']} gated={run['gated']} seed={run['seed']}: "
                  f"accuracy {result['accuracy']:.4f} ({result['seconds']:.0f} s)", flush=True)
    png = os.path.join(args.out, "alpha_sweep.png")
    plot(read_rows(csv_path), png)
    print(f"wrote {csv_path} and {png}")


def summarize(rows):
    """{(qk_norm, gated): {activation: {alpha: [accuracies]}}}, softmax under alpha None."""
    out = {}
    for r in rows:
        setting = (r["qk_norm"] == "True", r["gated"] == "True")
        alpha = None if r["alpha"] == "" else float(r["alpha"])
        out.setdefault(setting, {}).setdefault(r["activation"], {}).setdefault(
            alpha, []).append(float(r["accuracy"]))
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = summarize(rows)
    settings = sorted(table, reverse=True)
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2),
                             squeeze=False, sharey=True)
    dataset, tokens = rows[0]["dataset"], rows[0]["tokens"]
    for ax, setting in zip(axes[0], settings):
        curves = table[setting]
        for act in [a for a in ACTIVATIONS if a in curves]:
            alphas = sorted(curves[act])
            means = [np.mean(curves[act][a]) for a in alphas]
            ax.plot(alphas, means, "o-", label=act)
        if "softmax" in curves:
            acc = np.mean(curves["softmax"][None])
            ax.axhline(acc, color="black", linestyle="--", label="softmax")
        qk_norm, gated = setting
        ax.set_title(f"qk_norm={'on' if qk_norm else 'off'}, gate={'on' if gated else 'off'}")
        ax.set_xlabel("alpha (weights = L^-alpha h(.))")
        ax.grid(alpha=0.3)
    save_panels(fig, axes, f"{dataset} test accuracy ({tokens} tokens)", path)


def save_panels(fig, axes, ylabel, path, legend_size=8):
    """y label on the first panel, legend on the last, written to `path`."""
    import matplotlib.pyplot as plt

    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=legend_size, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
