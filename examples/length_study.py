"""Does `L^-alpha` matter more as the token count grows? The paper's central
claim at laptop scale, with seeds.

Trains the same small ViT on the embedded `sklearn_digits` at two token
counts (32 px and 64 px with 4x4 patches: 64 and 256 tokens), for ReLU
attention at each alpha, softmax, and ReLU/L with a learned per-head scale
(`relu_learned`), with and without qk-layernorm, over several seeds, and
writes

- `OUT/length_study.csv` — one row per run, appended as runs finish
  (rerunning the same command skips the rows already there, so a killed study
  resumes). For `relu_learned` it logs the effective weight scale the model
  learned, `exp(s_h) * L^-1` averaged over heads and layers, next to `1/L`;
- `OUT/length_study.png` — test accuracy vs alpha per token count, mean over
  seeds with min-max error bars; softmax and `relu_learned` as markers at the
  right; one panel per qk-norm setting.

Runs go seed by seed (every setting of seed 0, then seed 1, ...) so a study
stopped early still has whole seeds.

    KERAS_BACKEND=jax python examples/length_study.py                    # -> runs/length_study
    # the committed run: written to runs/ (with the models), CSV + PNG copied to examples/results
    KERAS_BACKEND=jax python examples/length_study.py --out runs/length_study --save-models
"""

import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alpha_sweep  # noqa: E402  (the same model, data and training as the alpha sweep)

FIELDS = ("dataset", "tokens", "image_size", "activation", "alpha", "qk_norm", "learned_scale",
          "seed", "epochs", "accuracy", "loss", "final_train_loss", "effective_scale",
          "inverse_tokens", "seconds")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/length_study",
                   help="output folder (the committed run is examples/results)")
    p.add_argument("--dataset", default="sklearn_digits")
    p.add_argument("--data-dir", default=None, help="tfds data_dir")
    p.add_argument("--image-sizes", default="32,64",
                   help="comma-separated image sizes (tokens = (size/patch)^2)")
    p.add_argument("--patch", type=int, default=4)
    alpha_sweep.add_training_args(p, depth=2, heads=2, epochs=8)
    p.add_argument("--alphas", default="0,0.5,1")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--qk-norm", choices=("on", "off", "both"), default="both")
    p.add_argument("--learned", choices=("on", "off", "both"), default="on",
                   help="relu_learned runs with qk-norm on, off or both ('off': none)")
    p.add_argument("--no-softmax", action="store_true", help="skip the softmax baseline")
    p.add_argument("--save-models", action="store_true",
                   help="also save each trained model as OUT/models/<run>.keras (for "
                        "examples/attention_scale.py --trained OUT/models)")
    args = p.parse_args(argv)
    try:
        args.image_sizes = [int(s) for s in args.image_sizes.split(",")]
        args.alphas = [float(a) for a in args.alphas.split(",")]
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as e:
        p.error(f"--image-sizes, --alphas and --seeds take comma-separated numbers ({e})")
    if any(a < 0 for a in args.alphas):
        p.error("--alphas must be >= 0")
    bad = [s for s in args.image_sizes if s % args.patch]
    if bad:
        p.error(f"--image-sizes {bad} not divisible by --patch {args.patch}")
    return args


def grid(args):
    """Every run as a dict, seed-major."""
    switch = {"on": [True], "off": [False], "both": [True, False]}
    learned_qk = {"on": [True], "off": [], "both": [True, False]}[args.learned]
    runs = []
    for seed in args.seeds:
        for size in args.image_sizes:
            for qk_norm in switch[args.qk_norm]:
                base = dict(image_size=size, qk_norm=qk_norm, seed=seed, learned_scale=False)
                if not args.no_softmax:
                    runs.append(dict(base, activation="softmax", alpha=None))
                runs += [dict(base, activation="relu", alpha=a) for a in args.alphas]
            runs += [dict(image_size=size, qk_norm=q, seed=seed, learned_scale=True,
                          activation="relu", alpha=1.0) for q in learned_qk]
    return runs


def key(row):
    alpha = "" if row["alpha"] in (None, "") else f"{float(row['alpha']):g}"
    return (str(row["image_size"]), row["activation"], alpha, str(row["qk_norm"]),
            str(row["learned_scale"]), str(row["seed"]))


def run_name(row):
    """e.g. `t256_relu_a0.5_qk1_s0`, `t64_relu_learned_a1_qk1_s2`."""
    name = "relu_learned" if str(row["learned_scale"]) == "True" else row["activation"]
    alpha = "" if row["alpha"] in (None, "") else f"_a{float(row['alpha']):g}"
    qk = int(str(row["qk_norm"]) == "True")
    return f"t{row['tokens']}_{name}{alpha}_qk{qk}_s{row['seed']}"


def effective_scale(model, tokens):
    """Mean over layers and heads of the learned `exp(s_h) * L^-alpha`."""
    import keras
    import numpy as np

    values = []
    for block in model.blocks:
        attn = block.attn
        s = np.exp(keras.ops.convert_to_numpy(attn.log_scale))
        values.append(s * float(tokens) ** -attn.seq_len_exponent)
    return float(np.mean(values))


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "length_study.csv")
    rows = alpha_sweep.read_rows(csv_path)
    if rows and tuple(rows[0]) != FIELDS:
        raise SystemExit(f"{csv_path} has columns {tuple(rows[0])}, not this script's; "
                         "use another --out")
    done = {key(r) for r in rows}
    runs = grid(args)
    todo = [r for r in runs if key(r) not in done]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already in {csv_path}", flush=True)
    data = {}
    with alpha_sweep.csv_appender(csv_path, FIELDS) as write:
        for i, run in enumerate(todo):
            size = run["image_size"]
            sized = copy.copy(args)
            sized.image_size = size
            if size not in data:
                data[size] = alpha_sweep.load_arrays(sized)
            tokens = (size // args.patch) ** 2
            result, model = alpha_sweep.train_one(run, sized, data[size], return_model=True)
            row = dict(run, dataset=args.dataset, tokens=tokens, epochs=args.epochs,
                       alpha="" if run["alpha"] is None else run["alpha"],
                       effective_scale=effective_scale(model, tokens) if run["learned_scale"]
                       else "", inverse_tokens=1.0 / tokens, **result)
            write(row)
            name = "relu_learned" if run["learned_scale"] else run["activation"]
            if args.save_models:
                os.makedirs(os.path.join(args.out, "models"), exist_ok=True)
                model.save(os.path.join(args.out, "models", run_name(row) + ".keras"))
            print(f"[{i + 1}/{len(todo)}] {tokens:4d} tokens {name:12s} alpha={row['alpha']!s:4s} "
                  f"qk_norm={run['qk_norm']!s:5s} seed={run['seed']}: accuracy "
                  f"{result['accuracy']:.4f} ({result['seconds']:.0f} s)", flush=True)
    png = os.path.join(args.out, "length_study.png")
    rows = alpha_sweep.read_rows(csv_path)
    plot(rows, png)
    print(table(rows))
    print(f"wrote {csv_path} and {png}")


def table(rows):
    """Markdown: test accuracy mean (min-max, n seeds) per setting and token count."""
    import numpy as np

    data = summarize(rows)
    tokens = sorted({t for per_qk in data.values() for t in per_qk})
    lines = ["| qk-norm | attention | " + " | ".join(f"{t} tokens" for t in tokens) + " |",
             "|---|---|" + "---|" * len(tokens)]
    for qk_norm in sorted(data, reverse=True):
        names = sorted({(n, a) for t in data[qk_norm] for n, by_alpha in data[qk_norm][t].items()
                        for a in by_alpha}, key=lambda x: (x[0] != "relu", x[0], x[1] or 0))
        for name, alpha in names:
            cells = []
            for t in tokens:
                accs = data[qk_norm].get(t, {}).get(name, {}).get(alpha)
                cells.append(f"{100 * np.mean(accs):.1f} ({100 * min(accs):.1f}-"
                             f"{100 * max(accs):.1f}, n={len(accs)})" if accs else "-")
            label = name if alpha is None or name != "relu" else f"relu, alpha={alpha:g}"
            lines.append(f"| {'on' if qk_norm else 'off'} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarize(rows):
    """{qk_norm: {tokens: {name: {alpha: [accuracies]}}}} with name relu,
    softmax or relu_learned."""
    out = {}
    for r in rows:
        name = "relu_learned" if r["learned_scale"] == "True" else r["activation"]
        alpha = None if r["alpha"] == "" else float(r["alpha"])
        out.setdefault(r["qk_norm"] == "True", {}).setdefault(int(r["tokens"]), {}).setdefault(
            name, {}).setdefault(alpha, []).append(float(r["accuracy"]))
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = summarize(rows)
    settings = sorted(table, reverse=True)
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.3), squeeze=False,
                             sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def bar(ax, x, accs, **kw):
        m = np.mean(accs)
        ax.errorbar([x], [m], yerr=[[m - min(accs)], [max(accs) - m]], capsize=4, **kw)

    for ax, qk_norm in zip(axes[0], settings):
        xs = []
        for c, tokens in zip(colors, sorted(table[qk_norm])):
            curves = table[qk_norm][tokens]
            relu = curves.get("relu", {})
            alphas = sorted(relu)
            xs = alphas
            means = [np.mean(relu[a]) for a in alphas]
            low = [m - min(relu[a]) for m, a in zip(means, alphas)]
            high = [max(relu[a]) - m for m, a in zip(means, alphas)]
            n = max((len(v) for v in relu.values()), default=0)
            ax.errorbar(alphas, means, yerr=[low, high], fmt="o-", color=c, capsize=4,
                        label=f"relu, {tokens} tokens (n={n} seeds)")
            if "softmax" in curves:
                bar(ax, 1.18, curves["softmax"][None], fmt="s", color=c,
                    label=f"softmax, {tokens} tokens")
            if "relu_learned" in curves:
                bar(ax, 1.30, curves["relu_learned"][1.0], fmt="^", color=c,
                    label=f"relu_learned, {tokens} tokens")
        ax.set_xticks(list(xs) + [1.18, 1.30])
        ax.set_xticklabels([f"{a:g}" for a in xs] + ["soft-\nmax", "learned\nscale"])
        ax.set_title(f"qk-layernorm {'on' if qk_norm else 'off'}")
        ax.set_xlabel("alpha (weights = L^-alpha relu(.)); mean, min-max over seeds")
        ax.grid(alpha=0.3)
    alpha_sweep.save_panels(fig, axes, f"{rows[0]['dataset']} test accuracy", path, legend_size=7)


if __name__ == "__main__":
    main()
