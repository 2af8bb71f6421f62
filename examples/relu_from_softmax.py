"""Softmax -> ReLU/L at laptop scale: is a converted softmax checkpoint a
better start than training ReLU/L from scratch with the same budget?

For each seed, on a tfds data set (default: the embedded `sklearn_digits`,
32x32 with 4x4 patches = 64 tokens):

1. `softmax_pretrain` — a softmax ViT trained `--pretrain-epochs`, saved as a
   preset (`model.save_to_preset`);
2. `relu_swapped` — that preset loaded with `kr.load_checkpoint(preset,
   attention="relu")`: the same weights under ReLU/L attention, evaluated
   with no training (how far the swap alone moves the model);
3. `relu_finetuned` — (2) fine-tuned `--finetune-epochs` with the
   `relu_from_softmax` recipe's shape (a tenth of the peak lr, short warmup);
4. `relu_scratch` — ReLU/L trained from scratch for pretrain + finetune
   epochs (the same total budget);
5. `softmax_scratch` — softmax for the same total budget (reference).

Writes `OUT/relu_from_softmax.csv` (a row per arm and seed, appended as runs
finish; a rerun skips rows already there) and `OUT/relu_from_softmax.png`.

    KERAS_BACKEND=jax python examples/relu_from_softmax.py --out runs/relu_from_softmax
"""

import argparse
import csv
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARMS = ("softmax_pretrain", "relu_swapped", "relu_finetuned", "relu_scratch", "softmax_scratch")
FIELDS = ("dataset", "tokens", "seed", "arm", "epochs", "accuracy", "loss", "seconds")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/relu_from_softmax", help="output folder")
    p.add_argument("--dataset", default="sklearn_digits")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--pretrain-epochs", type=int, default=10)
    p.add_argument("--finetune-epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3, help="from-scratch peak lr")
    p.add_argument("--finetune-lr", type=float, default=None,
                   help="fine-tune peak lr (default lr / 10, as the recipe)")
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.finetune_lr = args.finetune_lr or args.lr / 10
    return args


def fit(model, data, args, epochs, lr, warmup_epochs):
    import keras_reluvit as kr

    (x, y), (xt, yt), _ = data
    steps = len(x) // args.batch_size
    recipe = dict(kr.recipes.get("relu_from_softmax"), lr=lr, batch_size=args.batch_size,
                  wd=1e-4, warmup_steps=warmup_epochs * steps)
    kr.recipes.compile(model, recipe, steps, batch_size=args.batch_size, epochs=epochs)
    start = time.time()
    if epochs:
        model.fit(x, y, batch_size=args.batch_size, epochs=epochs, verbose=0)
    seconds = time.time() - start
    res = model.evaluate(xt, yt, batch_size=256, return_dict=True, verbose=0)
    return dict(accuracy=res["accuracy"], loss=res["loss"], seconds=seconds)


def run_seed(seed, args, data, done, write):
    import keras

    import keras_reluvit as kr

    num_classes = data[2]
    total = args.pretrain_epochs + args.finetune_epochs

    def model(attention):
        keras.utils.set_random_seed(seed)
        return kr.ViT("Ti/16", attention=attention, image_size=args.image_size,
                      patch_size=args.patch, width=args.width, depth=args.depth,
                      num_heads=args.heads, mlp_dim=2 * args.width, num_classes=num_classes)

    if not {"softmax_pretrain", "relu_swapped", "relu_finetuned"} <= done:
        soft = model("softmax")
        write("softmax_pretrain", args.pretrain_epochs,
              fit(soft, data, args, args.pretrain_epochs, args.lr, 1))
        with tempfile.TemporaryDirectory() as tmp:
            soft.save_to_preset(tmp)
            keras.utils.set_random_seed(seed)
            relu = kr.load_checkpoint(tmp, attention="relu")
        write("relu_swapped", args.pretrain_epochs, fit(relu, data, args, 0, args.lr, 0))
        keras.utils.set_random_seed(seed)
        write("relu_finetuned", total,
              fit(relu, data, args, args.finetune_epochs, args.finetune_lr, 0))
    if "relu_scratch" not in done:
        write("relu_scratch", total, fit(model("relu"), data, args, total, args.lr, 1))
    if "softmax_scratch" not in done:
        write("softmax_scratch", total, fit(model("softmax"), data, args, total, args.lr, 1))


def main(argv=None):
    from alpha_sweep import load_arrays
    from alpha_sweep import read_rows

    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "relu_from_softmax.csv")
    rows = read_rows(csv_path)
    data = load_arrays(args)
    tokens = (args.image_size // args.patch) ** 2
    new_file = not os.path.exists(csv_path)
    with open(csv_path, "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new_file:
            writer.writeheader()
        for seed in args.seeds:
            done = {r["arm"] for r in rows if r["seed"] == str(seed)}

            def write(arm, epochs, result, seed=seed):
                writer.writerow(dict(dataset=args.dataset, tokens=tokens, seed=seed, arm=arm,
                                     epochs=epochs, **result))
                f.flush()
                print(f"seed {seed} {arm:17s} {epochs:3d} epochs: accuracy "
                      f"{result['accuracy']:.4f} ({result['seconds']:.0f} s)", flush=True)

            run_seed(seed, args, data, done, write)
    rows = read_rows(csv_path)
    png = os.path.join(args.out, "relu_from_softmax.png")
    plot(rows, png)
    for arm, (mean, lo, hi, n) in summarize(rows).items():
        print(f"{arm:17s} {mean:.4f} (min {lo:.4f}, max {hi:.4f}, {n} seeds)")
    print(f"wrote {csv_path} and {png}")


def summarize(rows):
    import numpy as np

    out = {}
    for arm in ARMS:
        acc = [float(r["accuracy"]) for r in rows if r["arm"] == arm]
        if acc:
            out[arm] = (float(np.mean(acc)), min(acc), max(acc), len(acc))
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summarize(rows)
    arms = list(table)
    means = [table[a][0] for a in arms]
    err = [[table[a][0] - table[a][1] for a in arms], [table[a][2] - table[a][0] for a in arms]]
    epochs = {r["arm"]: r["epochs"] for r in rows}
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    colors = ["#777777", "#d9a441", "#c0392b", "#2e86c1", "#333333"]
    ax.bar(range(len(arms)), means, yerr=err, capsize=4, color=colors[: len(arms)])
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels([f"{a}\n({epochs[a]} ep)" for a in arms], fontsize=8)
    ax.set_ylim(max(0.0, min(table[a][1] for a in arms) - 0.05), 1.0)
    ax.set_ylabel(f"{rows[0]['dataset']} test accuracy")
    ax.set_title(f"softmax -> ReLU/L fine-tune vs ReLU/L from scratch "
                 f"({len({r['seed'] for r in rows})} seeds, min-max bars)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
