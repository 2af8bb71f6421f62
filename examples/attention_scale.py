"""Why `L^-alpha`: the scale of pointwise attention as the token count grows,
measured without training (and, with `--trained`, on trained models).

For every activation h and alpha, and softmax, a freshly initialised
`PointwiseAttention` (ViT-S shape: width 384, 6 heads of 64) gets random
LayerNorm-scale tokens at L = 16 ... 4096, with qk-layernorm on and off, and
we record

- `row_sum`: the mean over queries and heads of `sum_j a_ij` (softmax: 1),
  on independent tokens;
- `rms_shared`: the attention output's RMS when the tokens share a common
  component (each token = a shared random vector + its own, cosine ~0.5
  between tokens, as in real ViT activations): the output follows the row
  sum times the mean value;
- `rms_iid`: the same for independent tokens (cosine 0): the values average
  out, so the output scales like `sqrt(sum_j a_ij^2)`, i.e. `L^(1/2-alpha)`.

`E_j[a_ij] = O(L^-alpha)` is the paper's argument: with alpha = 1 the row sum
and the shared-token output stay flat as L grows (as softmax's do), with
alpha = 0 they grow ~L for relu. The script writes

- `OUT/attention_scale.csv` — one row per (source, activation, alpha,
  qk_norm, L), plus the log-log slopes over L (`L = slope` rows);
- `OUT/attention_scale.png` — log-log curves for relu at alpha 0 / 0.5 / 1
  and softmax; with `--trained DIR` a third row measures the attention layers
  of the trained models in DIR (`examples/length_study.py --save-models`)
  the same way, layer by layer (through each block's first LayerNorm).

    KERAS_BACKEND=jax python examples/attention_scale.py --out runs/attention_scale
    KERAS_BACKEND=jax python examples/attention_scale.py --out examples/results \\
        --trained runs/length_study/models           # the committed run (after length_study)
"""

import argparse
import csv
import glob
import os

import numpy as np

ACTIVATIONS = ("relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid")
FIELDS = ("source", "activation", "alpha", "qk_norm", "tokens", "row_sum", "rms_shared",
          "rms_iid")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/attention_scale")
    p.add_argument("--tokens", default="16,64,256,1024,4096", help="comma-separated L")
    p.add_argument("--alphas", default="0,0.5,1")
    p.add_argument("--activations", default=",".join(ACTIVATIONS))
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--trained", default=None,
                   help="folder of trained .keras ViTs to measure too (length_study --save-models)")
    p.add_argument("--trained-glob", default="*_s0.keras",
                   help="which models of --trained (default: seed 0)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
        args.alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError as e:
        p.error(f"--tokens and --alphas take comma-separated numbers ({e})")
    args.activations = [a.strip() for a in args.activations.split(",") if a.strip()]
    unknown = sorted(set(args.activations) - set(ACTIVATIONS))
    if unknown:
        p.error(f"unknown activation(s) {unknown}; valid: {', '.join(ACTIVATIONS)}")
    if min(args.tokens) < 2 or args.width % args.heads:
        p.error("--tokens must be >= 2 and --width divisible by --heads")
    return args


def tokens(seed, length, width, shared, batch=1):
    """Unit-RMS tokens, `batch` independent draws; `shared` mixes in a common
    vector per draw (cosine ~0.5 between tokens), the same vector at every L
    so that only L changes along a curve."""
    x = np.random.default_rng([seed, length]).standard_normal((batch, length, width))
    if shared:
        common = np.random.default_rng([seed, 0]).standard_normal((batch, 1, width))
        x = (x + common) / np.sqrt(2.0)
    return x.astype("float32")


def measure(layer, length, width, seed, pre=None):
    """(row_sum, rms_shared, rms_iid) of `layer` at `length` tokens; the row
    sum on independent tokens (a shared component adds a random offset to
    every score of a head, which the mean over many heads would average)."""
    import keras

    out = {}
    for shared in (True, False):
        x = tokens(seed, length, width, shared)
        if pre is not None:
            x = pre(x)
        y, w = layer(x, x, return_attention_scores=True)
        y, w = keras.ops.convert_to_numpy(y), keras.ops.convert_to_numpy(w)
        out[shared] = (float(np.mean(w.sum(-1))), float(np.sqrt(np.mean(y ** 2))))
    return out[False][0], out[True][1], out[False][1]


def slope(ls, values):
    """Least-squares slope of log|value| against log L."""
    v = np.abs(np.asarray(values, dtype="float64"))
    if np.any(v == 0):
        return float("nan")
    return float(np.polyfit(np.log(ls), np.log(v), 1)[0])


def fresh_rows(args):
    import keras

    import keras_reluvit as kr

    settings = [("softmax", None)] + [(a, alpha) for a in args.activations for alpha in args.alphas]
    rows = []
    for qk_norm in (True, False):
        for act, alpha in settings:
            keras.utils.set_random_seed(args.seed)
            layer = kr.PointwiseAttention(
                num_heads=args.heads, key_dim=args.width // args.heads, activation=act,
                seq_len_exponent=1.0 if alpha is None else alpha, qk_norm=qk_norm)
            for length in args.tokens:
                row_sum, rms_shared, rms_iid = measure(layer, length, args.width, args.seed)
                rows.append(dict(source="init", activation=act, alpha="" if alpha is None else alpha,
                                 qk_norm=qk_norm, tokens=length, row_sum=row_sum,
                                 rms_shared=rms_shared, rms_iid=rms_iid))
            print(f"init qk_norm={qk_norm!s:5s} {act:8s} alpha={alpha}: row sum "
                  f"{rows[-len(args.tokens)]['row_sum']:.3g} -> {rows[-1]['row_sum']:.3g}",
                  flush=True)
    return rows


def trained_rows(args):
    """Each trained model's attention layers, through their block's norm1."""
    import keras

    import keras_reluvit  # noqa: F401  (registers the classes load_model needs)

    rows = []
    paths = sorted(glob.glob(os.path.join(args.trained, args.trained_glob)))
    if not paths:
        raise SystemExit(f"no {args.trained_glob} in {args.trained}")
    for path in paths:
        model = keras.saving.load_model(path, compile=False)
        name = os.path.basename(path)[: -len(".keras")]
        for i, block in enumerate(model.blocks):
            attn, width = block.attn, model.get_config()["width"]
            alpha = "" if attn.activation == "softmax" else attn.seq_len_exponent
            for length in args.tokens:
                row_sum, rms_shared, rms_iid = measure(attn, length, width, args.seed,
                                                       pre=block.norm1)
                rows.append(dict(source=f"{name}/block{i}", activation=attn.activation,
                                 alpha=alpha, qk_norm=bool(attn.qk_norm), tokens=length,
                                 row_sum=row_sum, rms_shared=rms_shared, rms_iid=rms_iid))
        print(f"trained {name}: measured {len(model.blocks)} blocks", flush=True)
    return rows


def with_slopes(rows):
    """Appends one `tokens = "slope"` row per curve."""
    curves = {}
    for r in rows:
        curves.setdefault((r["source"], r["activation"], str(r["alpha"]), str(r["qk_norm"])),
                          []).append(r)
    out = list(rows)
    for group in curves.values():
        ls = [r["tokens"] for r in group]
        out.append(dict(group[0], tokens="slope",
                        **{k: slope(ls, [r[k] for r in group])
                           for k in ("row_sum", "rms_shared", "rms_iid")}))
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["tokens"] != "slope"]
    trained = sorted({r["source"].split("/")[0] for r in rows if r["source"] != "init"})
    panels = [("init", True), ("init", False)] + ([("trained", None)] if trained else [])
    keys = ("row_sum", "rms_shared", "rms_iid")
    titles = {"row_sum": "mean row sum  sum_j a_ij", "rms_shared": "output RMS, shared tokens",
              "rms_iid": "output RMS, independent tokens"}
    fig, axes = plt.subplots(len(panels), 3, figsize=(14, 3.6 * len(panels)), squeeze=False)
    colors = {0.0: "tab:red", 0.5: "tab:orange", 1.0: "tab:green"}
    for row_axes, (source, qk_norm) in zip(axes, panels):
        if source == "init":
            curves = [(f"relu, alpha={a:g}", dict(color=colors.get(a)),
                       [r for r in rows if r["source"] == "init" and r["activation"] == "relu"
                        and r["alpha"] != "" and float(r["alpha"]) == a
                        and str(r["qk_norm"]) == str(qk_norm)])
                      for a in sorted({float(r["alpha"]) for r in rows
                                       if r["activation"] == "relu" and r["alpha"] != ""})]
            curves.append(("softmax", dict(color="black", fmt="o--"),
                           [r for r in rows if r["source"] == "init"
                            and r["activation"] == "softmax" and str(r["qk_norm"]) == str(qk_norm)]))
            label = f"at init, qk-norm {'on' if qk_norm else 'off'}"
        else:
            curves = []
            for name in trained:
                group = [r for r in rows if r["source"].startswith(name + "/")]
                blocks = sorted({r["source"] for r in group})
                # average over blocks (log-mean) for a readable panel
                by_l = {}
                for r in group:
                    by_l.setdefault(int(r["tokens"]), []).append(r)
                merged = [dict(tokens=n, **{k: float(np.exp(np.mean(np.log(np.abs(
                    [float(x[k]) for x in rs]) + 1e-30)))) for k in keys})
                    for n, rs in sorted(by_l.items())]
                curves.append((f"{name} ({len(blocks)} blocks)", {}, merged))
            label = "trained (length_study models, geometric mean over blocks)"
        for ax, k in zip(row_axes, keys):
            for name, style, group in curves:
                if group:
                    ls = [int(r["tokens"]) for r in group]
                    style = dict(style)
                    ax.loglog(ls, [abs(float(r[k])) for r in group], style.pop("fmt", "o-"),
                              label=name, markersize=3, **style)
            ax.set_title(f"{titles[k]}\n{label}", fontsize=9)
            ax.set_xlabel("tokens L")
            ax.grid(alpha=0.3, which="both")
        row_axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = fresh_rows(args)
    if args.trained:
        rows += trained_rows(args)
    rows = with_slopes(rows)
    csv_path = os.path.join(args.out, "attention_scale.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    png = os.path.join(args.out, "attention_scale.png")
    plot(rows, png)
    print("log-log slopes over L (row sum, RMS shared, RMS independent):")
    for r in rows:
        if r["tokens"] == "slope" and (r["source"] != "init" or r["activation"] in ("relu",
                                                                                    "softmax")):
            print(f"  {r['source']:38s} {r['activation']:8s} alpha={r['alpha']!s:4s} "
                  f"qk_norm={r['qk_norm']!s:5s} {r['row_sum']:+.2f} {r['rms_shared']:+.2f} "
                  f"{r['rms_iid']:+.2f}")
    print(f"wrote {csv_path} and {png}")


if __name__ == "__main__":
    main()
