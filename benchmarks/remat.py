"""Activation memory of a training step with and without `remat`, ViT-B/16
and ViT-L/16 at 224 px, side by side in one process per backend.

- JAX: the residuals the gradient keeps from the forward pass for the
  backward pass (`jax.ad_checkpoint.print_saved_residuals`, the weights and
  the input left out), for `remat=None`, `"dots_saveable"` and `"full"`.
  (XLA:CPU's compiled `memory_analysis()` reports the same temporary bytes
  with and without remat -- 203 MiB for a 2-block S/16 at batch 8 either
  way -- so it cannot show what an accelerator saves; the residuals are
  what remat changes.)
- PyTorch: the bytes of the tensors autograd saves for the backward pass
  (`torch.autograd.graph.saved_tensors_hooks`, summed over one forward; the
  parameters left out), for `remat=None` and `"full"` (no policies).

Each row also gives the ratio against `remat=None` of the same model, and the
step's time ratio where measured (`--time`). Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.remat --out benchmarks/results
    KERAS_BACKEND=torch python -m benchmarks.remat --out benchmarks/results
"""

import argparse
import os

import keras

from benchmarks.common import median_time

MODELS = ("B/16", "L/16")


def build(variant, remat):
    import keras_reluvit as kr

    return kr.ViT(variant, num_classes=1000, image_size=224, remat=remat)


SIZES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1,
         "pred": 1, "bool": 1, "s64": 8, "u64": 8, "int32": 4, "uint32": 4, "float32": 4,
         "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1}


def jax_bytes(model, batch):
    """Bytes of the residuals the gradient saves (weights and input left out)."""
    import contextlib
    import io
    import math
    import re

    import jax
    from jax.ad_checkpoint import print_saved_residuals

    x = jax.ShapeDtypeStruct((batch, 224, 224, 3), "float32")
    values = [v.value for v in model.trainable_variables]

    def loss(values, x):
        with keras.StatelessScope(state_mapping=list(zip(model.trainable_variables, values))):
            return keras.ops.mean(keras.ops.square(model(x, training=True)))

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_saved_residuals(loss, values, x)
    total = 0
    for line in text.getvalue().splitlines():
        m = re.match(r"(\w+)\[([\d,]*)\]", line)
        if m and "from the argument" not in line:
            shape = [int(d) for d in m.group(2).split(",") if d]
            total += SIZES[m.group(1)] * math.prod(shape)
    return total


def torch_bytes(model, batch):
    """Bytes autograd saves for the backward pass during one forward."""
    import torch

    saved = []

    def pack(t):
        if not (t.is_leaf and t.requires_grad):  # a parameter is no activation
            saved.append(t.numel() * t.element_size())
        return t

    x = torch.zeros((batch, 224, 224, 3))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x, training=True)
    total = sum(saved)
    y.float().square().mean().backward()
    return total


def parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--time", action="store_true", help="PyTorch: also time forward and "
                   "backward (slow on a CPU)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    backend = keras.backend.backend()
    policies = {"jax": [None, "dots_saveable", "full"], "torch": [None, "full"]}.get(backend)
    if policies is None:
        raise SystemExit("JAX or PyTorch (KERAS_BACKEND); TensorFlow has no memory report "
                         "for a CPU step.")
    rows = []
    for variant in args.models.split(","):
        base = None
        for remat in policies:
            keras.utils.set_random_seed(0)
            model = build(variant, remat)
            seconds = None
            if backend == "jax":
                nbytes = jax_bytes(model, args.batch)
            else:
                nbytes = torch_bytes(model, args.batch)
                if args.time:
                    seconds = median_time(lambda m=model: torch_bytes(m, args.batch), args.reps)
            base = base or (nbytes, seconds)
            rows.append(dict(model=variant, remat=str(remat), bytes=nbytes,
                             ratio=nbytes / base[0], seconds=seconds,
                             time_ratio=(seconds / base[1]) if seconds and base[1] else None))
            print(rows[-1], flush=True)
            del model
    what = {"jax": "the gradient's saved residuals", "torch": "bytes saved for the backward "
            "pass"}[backend]
    lines = [f"Activation memory, batch {args.batch}, 224 px, {backend} ({what}):", "",
             "| model | remat | MiB | vs remat=None | step time vs None |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        t = f"{r['time_ratio']:.2f}x" if r["time_ratio"] else "-"
        lines.append(f"| ViT-{r['model']} | {r['remat']} | {r['bytes'] / 2**20:.0f} | "
                     f"{r['ratio']:.2f}x | {t} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from benchmarks.common import write

        write(args.out, f"remat_{backend}", text, dict(batch=args.batch, rows=rows))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
