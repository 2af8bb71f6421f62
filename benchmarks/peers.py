"""Whole-model inference (and PyTorch training steps) against timm: our
ViTs (relu and softmax, each backend) and timm's softmax
`VisionTransformer` with the same dims, side by side in one run.

    source benchmarks/env-peers.sh      # torch 2.14.1 + torchvision + timm (~6 GB, once)
    python -m benchmarks.peers --out benchmarks/results

One worker process per implementation (timm, ours on torch / jax /
tensorflow) builds its models once; the coordinator then asks them in turn,
round after round (`--rounds`), to time `--iters` forward passes of one
model, so every implementation sees the same machine state in each round
and only one computes at a time. Reported per (model, image size): img/s
median over rounds with the min-max spread, and each implementation's
median as a ratio of timm's (> 1: faster than timm).

The models match timm's `vit_small_patch{16,8}_{224,384}` structure: class
token, learned position embedding, no qk-layernorm, exact GELU, 1000
classes (`ViT(variant, pool="tok", qk_norm=False, mlp_activation="gelu")`;
the parameter counts are checked equal). Ours: `relu` (ReLU/L) and
`softmax`. Inputs: `--batch` random images, fp32, intra-op threads
`--threads`; inference (`torch.no_grad` eager for timm and ours on torch,
the jitted predict function on JAX, `tf.function` on TensorFlow).

Training (`--mode train --impls timm,torch`): one forward + backward of the
cross-entropy against fixed labels per pass (gradients dropped before each;
no optimizer step, the same for both), both models in training mode
(dropout 0): timm's SDPA backward against ours (relu: the C++ kernels of
`keras_reluvit.kernels.torch_cpu`, softmax: SDPA).

    python -m benchmarks.peers --mode train --impls timm,torch --sizes 224 --out benchmarks/results/train

Serving (`--impls timm,savedmodel,savedmodel_xla,onnx`): the exported
artefacts themselves, written by `kr.export.saved_model` / `kr.export.onnx`
from the same model: the SavedModel's `serve_preprocessed` endpoint loaded
with `tf.saved_model.load` (plain, and wrapped in
`tf.function(jit_compile=True)`), and the ONNX model in an onnxruntime CPU
session with `--threads` intra-op threads.

    python -m benchmarks.peers --impls timm,savedmodel,savedmodel_xla,onnx --sizes 224 --out benchmarks/results/serving
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import common

TIMM = {"S/16": "vit_small_patch16_224", "S/8": "vit_small_patch8_224"}
NUM_CLASSES = 1000
BACKENDS = ("torch", "jax", "tensorflow")
# The exported artefacts (written from a TensorFlow-backend model): the
# SavedModel's `serve_preprocessed` under plain TF, the same function under
# `tf.function(jit_compile=True)`, and the ONNX model under onnxruntime.
SERVING = ("savedmodel", "savedmodel_xla", "onnx")
# The TensorFlow backend with `model.compile(jit_compile=True)`: Keras' "auto"
# leaves XLA off on CPU-only machines, so `predict` runs the unfused graph.
IMPLS = ("timm",) + BACKENDS + ("tensorflow_xla",) + SERVING


def _backend(impl):
    """The Keras backend an implementation's worker runs (None: timm)."""
    return None if impl == "timm" else impl if impl in BACKENDS else "tensorflow"


# ----------------------------------------------------------------- worker --


def _threads(backend, n):
    if backend in ("torch", "timm"):
        import torch

        torch.set_num_threads(n)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _serving(impl, model, x, threads):
    import tempfile

    import keras_reluvit as kr

    tmp = tempfile.mkdtemp(prefix="peers-")
    if impl == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(kr.export.onnx(model, os.path.join(tmp, "model.onnx")),
                                       options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda: session.run(None, {name: x})
    import tensorflow as tf

    loaded = tf.saved_model.load(kr.export.saved_model(model, os.path.join(tmp, "saved_model")))
    fn = loaded.serve_preprocessed
    if impl == "savedmodel_xla":
        fn = tf.function(fn, jit_compile=True)
    xt = tf.constant(x)
    return lambda keep=loaded: fn(xt)  # `keep`: the loaded object owns the variables


def _train_step(forward, params, batch):
    """fwd + bwd of the cross-entropy against fixed labels (PyTorch); the
    gradients are dropped before each step (no optimizer: the same for both)."""
    import torch

    labels = torch.arange(batch) % NUM_CLASSES

    def run():
        for p in params:
            p.grad = None
        logits = forward()
        torch.nn.functional.cross_entropy(logits, labels).backward()
        return logits

    return run


def _build(impl, variant, size, attention, batch, threads=2, mode="infer"):
    """A zero-argument function running one forward pass (`mode="train"`:
    one forward + backward), and the params."""
    import numpy as np

    x = np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype("float32")
    if impl == "timm":
        import timm
        import torch

        model = timm.create_model(TIMM[variant], pretrained=False, img_size=size,
                                  num_classes=NUM_CLASSES)
        xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
        params = sum(p.numel() for p in model.parameters())
        if mode == "train":
            return _train_step(lambda: model.train()(xt), list(model.parameters()), batch), params

        def run():
            with torch.no_grad():
                return model.eval()(xt)

        return run, params
    import keras_reluvit as kr

    model = kr.ViT(variant, attention=attention, pool="tok", qk_norm=False,
                   mlp_activation="gelu", image_size=size, num_classes=NUM_CLASSES)
    if impl in SERVING:
        return _serving(impl, model, x, threads), model.count_params()
    if impl == "torch":
        import torch

        xt = torch.from_numpy(x)
        if mode == "train":
            return _train_step(lambda: model(xt, training=True),
                               [v.value for v in model.trainable_variables],
                               batch), model.count_params()

        def run():
            with torch.no_grad():
                return model(xt, training=False)
    else:
        if impl == "tensorflow_xla":
            model.compile(jit_compile=True)

        def run():
            return model.predict_on_batch(x)

    return run, model.count_params()


def worker(impl, threads):
    """Reads one JSON command per line on stdin, answers one JSON line."""
    if _backend(impl):
        os.environ["KERAS_BACKEND"] = _backend(impl)
    _threads(_backend(impl) or "timm", threads)
    models = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "build":
            run, params = _build(impl, cmd["variant"], cmd["size"], cmd["attention"],
                                 cmd["batch"], threads, cmd["mode"])
            run()  # compile / warm up
            models[cmd["key"]] = run
            answer = {"params": params}
        else:
            run = models[cmd["key"]]
            start = time.perf_counter()
            for _ in range(cmd["iters"]):
                run()
            answer = {"seconds": (time.perf_counter() - start) / cmd["iters"]}
        print(json.dumps(answer), flush=True)


# ------------------------------------------------------------ coordinator --


class Worker:
    def __init__(self, impl, threads):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        if _backend(impl):
            env["KERAS_BACKEND"] = _backend(impl)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.peers", "--worker", impl, "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker died on {cmd}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(args):
    workers = {impl: Worker(impl, args.threads) for impl in args.impls}
    entries = []  # (key, impl, variant, size, attention)
    try:
        for variant in args.variants:
            for size in args.sizes:
                params = {}
                for impl in args.impls:
                    for attention in (("softmax",) if impl == "timm" else args.attentions):
                        key = f"{impl}/{variant}/{size}/{attention}"
                        params[key] = workers[impl].ask(op="build", key=key, variant=variant,
                                                        size=size, attention=attention,
                                                        batch=args.batch,
                                                        mode=args.mode)["params"]
                        entries.append((key, impl, variant, size, attention))
                if len(set(params.values())) != 1:
                    raise RuntimeError(f"not the same model: parameter counts {params}")
        times = {e[0]: [] for e in entries}
        for r in range(args.rounds):
            for key, impl, *_ in entries:
                times[key].append(workers[impl].ask(op="time", key=key, iters=args.iters)["seconds"])
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for w in workers.values():
            w.close()
    rows = []
    for key, impl, variant, size, attention in entries:
        ips = [args.batch / t for t in times[key]]
        rows.append(dict(impl=impl, variant=variant, size=size, attention=attention,
                         tokens=(size // int(variant.split("/")[1])) ** 2 + 1,
                         median=statistics.median(ips), min=min(ips), max=max(ips)))
    for row in rows:
        base = next(r for r in rows if r["impl"] == "timm" and r["variant"] == row["variant"]
                    and r["size"] == row["size"])
        row["vs_timm"] = row["median"] / base["median"]
    return rows


def table(rows, args):
    what = ("inference" if args.mode == "infer"
            else "training step (forward + backward of the cross-entropy)")
    head = (f"## Whole-model {what} vs timm (fp32, batch {args.batch}, {args.threads} threads, "
            f"img/s: median of {args.rounds} rounds x {args.iters} passes [min-max])\n\n"
            "| model | px | tokens | implementation | attention | img/s | vs timm |\n"
            "|---|---|---|---|---|---|---|\n")
    names = {"timm": "timm (PyTorch eager, SDPA)", "torch": "ours, torch", "jax": "ours, jax",
             "tensorflow": "ours, tensorflow",
             "tensorflow_xla": "ours, tensorflow (jit_compile=True)",
             "savedmodel": "ours, SavedModel (TF)",
             "savedmodel_xla": "ours, SavedModel (TF, jit_compile)",
             "onnx": "ours, ONNX (onnxruntime)"}
    return head + "\n".join(
        f"| {r['variant']} | {r['size']} | {r['tokens']} | {names[r['impl']]} | {r['attention']} | "
        f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}] | {r['vs_timm']:.2f}x |"
        for r in rows) + "\n"


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="S/16,S/8")
    p.add_argument("--sizes", default="224,384")
    p.add_argument("--impls", default=",".join(("timm",) + BACKENDS),
                   help=f"subset of {','.join(IMPLS)} (the last three: the exported artefacts)")
    p.add_argument("--attentions", default="relu,softmax", help="ours: relu, softmax")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=2, help="forward passes timed per round")
    p.add_argument("--mode", choices=("infer", "train"), default="infer",
                   help="train: forward + backward of a cross-entropy (timm and torch only)")
    p.add_argument("--out", help="write peers.md / peers.json there")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.worker:
        return worker(args.worker, args.threads)
    args.variants = args.variants.split(",")
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.impls = args.impls.split(",")
    args.attentions = args.attentions.split(",")
    bad = sorted(set(args.impls) - set(IMPLS)) + sorted(set(args.variants) - set(TIMM))
    if bad or "timm" not in args.impls:
        parser().error(f"unknown {bad}; --impls must include timm (the baseline)")
    if args.mode == "train" and set(args.impls) - {"timm", "torch"}:
        parser().error("--mode train compares PyTorch training steps: --impls timm,torch")
    rows = measure(args)
    text = table(rows, args)
    print(text)
    if args.out:
        common.write(args.out, "peers", text, dict(rows=rows, args={
            k: v for k, v in vars(args).items() if k != "worker"}))


if __name__ == "__main__":
    main()
