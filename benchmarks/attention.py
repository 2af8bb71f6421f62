"""Attention-op benchmark: our ReLU/L vs softmax, side by side in one process.

    KERAS_BACKEND=jax python -m benchmarks.attention            # one backend
    python -m benchmarks.attention --all --out benchmarks/results  # each backend

Columns (fp32, batch 8, 6 heads, head dim 64, medians of `--reps` runs):
our relu (`pointwise_attention`, through the dispatch point; under torch
inference that is the compiled `torch_fused` kernel, and the `torch_tiled`
eager path is shown beside it), our softmax
(`keras.ops.dot_product_attention`, what `PointwiseAttention("softmax")` and
`MultiHeadAttention` run), the backend's best softmax (torch
`scaled_dot_product_attention`, `jax.nn.dot_product_attention`, TF XLA
softmax attention) and the bare two matmuls of the same shapes (QK^T and AV:
the compute limit for exact attention), repetitions taken round-robin over
the cases. JAX and TF functions are compiled
(jit / XLA); torch runs eagerly. Ratios > 1 mean ours is faster.

`--long` adds batch-1 long sequences (L = 4096, 16384): dense vs chunked
time and peak memory (the resident set sampled every 0.5 ms during the
call, minus the resident set before it, in a fresh process per case). Dense runs only
where its L x L scores fit `--dense-max`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import common

B, H, D = 8, 6, 64


def _block(out):
    import keras

    if keras.backend.backend() == "jax":
        import jax

        jax.block_until_ready(out)


def functions(L, backward):
    """name -> zero-argument callable for the current backend."""
    import keras
    import numpy as np

    from keras_reluvit import pointwise_attention

    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(B, L, H, D)).astype("float32") for _ in range(3))
    scale = 1.0 / np.sqrt(D)

    def ours_relu(q, k, v):
        return pointwise_attention(q, k, v, activation="relu")

    def ours_softmax(q, k, v):
        return keras.ops.dot_product_attention(q, k, v, scale=scale)

    def matmuls(q, k, v):
        s = keras.ops.einsum("bthd,bshd->bhts", q, k)
        return keras.ops.einsum("bhts,bshd->bthd", s, v)

    if backend == "torch":
        import torch

        tq, tk, tv = (torch.tensor(x).permute(0, 2, 1, 3).contiguous() for x in (q, k, v))
        args = [torch.tensor(x) for x in (q, k, v)]

        def best_softmax(q, k, v):  # (B, H, L, D) layout, as SDPA wants it
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        def bare(q, k, v):
            return torch.matmul(torch.matmul(q, k.transpose(-1, -2)), v)

        def ours_tiled(q, k, v):  # the eager-ops path the fused kernel replaces:
            # torch_tiled for inference, autograd of the generic ops for training
            impl = "generic" if torch.is_grad_enabled() else "torch_tiled"
            return pointwise_attention(q, k, v, activation="relu", implementation=impl)

        cases = {"our relu": (ours_relu, args), "our relu, tiled eager ops": (ours_tiled, args),
                 "our softmax": (ours_softmax, args),
                 "best softmax (torch SDPA)": (best_softmax, [tq, tk, tv]),
                 "bare matmuls": (bare, [tq, tk, tv])}
        out = {}
        for name, (f, a) in cases.items():
            if backward:
                a = [x.clone().requires_grad_(True) for x in a]

                def run(f=f, a=a):
                    y = f(*a)
                    y.sum().backward()
                    return y
            else:
                def run(f=f, a=a):
                    with torch.no_grad():
                        return f(*a)
            out[name] = run
        return out

    if backend == "jax":
        import jax

        def best_softmax(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, scale=scale)

        cases = {"our relu": ours_relu, "our softmax": ours_softmax,
                 "best softmax (jax.nn.dot_product_attention)": best_softmax,
                 "bare matmuls": matmuls}
        args = [jax.numpy.asarray(x) for x in (q, k, v)]
        out = {}
        for name, f in cases.items():
            if backward:
                g = jax.jit(jax.grad(lambda a, b, c, f=f: f(a, b, c).sum(), argnums=(0, 1, 2)))
                out[name] = lambda g=g: g(*args)
            else:
                j = jax.jit(f)
                out[name] = lambda j=j: j(*args)
        return out

    import tensorflow as tf

    def best_softmax(q, k, v):
        s = tf.einsum("bthd,bshd->bhts", q * scale, k)
        return tf.einsum("bhts,bshd->bthd", tf.nn.softmax(s, axis=-1), v)

    cases = {"our relu": ours_relu, "our softmax": ours_softmax,
             "best softmax (TF XLA)": best_softmax, "bare matmuls": matmuls}
    args = [tf.constant(x) for x in (q, k, v)]
    out = {}
    for name, f in cases.items():
        if backward:
            def step(a, b, c, f=f):
                with tf.GradientTape() as tape:
                    tape.watch([a, b, c])
                    y = tf.reduce_sum(f(a, b, c))
                return tape.gradient(y, [a, b, c])
            g = tf.function(step, jit_compile=True)
            out[name] = lambda g=g: [x.numpy() for x in g(*args)]
        else:
            j = tf.function(f, jit_compile=True)
            out[name] = lambda j=j: j(*args).numpy()
    return out


def _interleaved(fns, reps):
    """Median seconds of each function, the repetitions taken round-robin
    (case A, B, C, A, B, C, ...) so that a slow spell of a shared machine
    falls on every case alike instead of on whichever ran then."""
    for f in fns.values():
        _block(f())  # compile / warm up
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            start = time.perf_counter()
            _block(f())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def op_table(lengths, reps):
    import keras

    rows = []
    for backward in (False, True):
        for L in lengths:
            fns = functions(L, backward)
            r = reps if L < 3000 else max(2, reps // 3)
            times = _interleaved(fns, r)
            rows.append(dict(backend=keras.backend.backend(), L=L,
                             mode="fwd+bwd" if backward else "fwd", times_ms={
                                 k: round(v * 1e3, 2) for k, v in times.items()}))
    return rows


def format_ops(rows):
    lines = ["| backend | mode | L | our relu ms | our softmax ms | best softmax ms | bare matmuls ms "
             "| relu vs best softmax | relu vs our softmax | relu / matmul throughput |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["times_ms"]
        best = next(v for k, v in t.items() if k.startswith("best"))
        lines.append(
            f"| {r['backend']} | {r['mode']} | {r['L']} | {t['our relu']} | {t['our softmax']} | "
            f"{best} | {t['bare matmuls']} | {best / t['our relu']:.2f}x | "
            f"{t['our softmax'] / t['our relu']:.2f}x | {100 * t['bare matmuls'] / t['our relu']:.0f} % |")
    tiled = [r for r in rows if "our relu, tiled eager ops" in r["times_ms"]]
    if tiled:
        lines += ["", "| backend | mode | L | fused relu ms | eager-ops relu ms (fwd: tiled, "
                  "fwd+bwd: generic autograd) | fused vs eager ops |",
                  "|---|---|---|---|---|---|"]
        for r in tiled:
            t = r["times_ms"]
            lines.append(f"| {r['backend']} | {r['mode']} | {r['L']} | {t['our relu']} | "
                         f"{t['our relu, tiled eager ops']} | "
                         f"{t['our relu, tiled eager ops'] / t['our relu']:.2f}x |")
    return "\n".join(lines)


_LONG = """
import json, sys, threading, time, numpy as np, keras
from keras_reluvit import pointwise_attention
L, chunk = int(sys.argv[1]), sys.argv[2]
chunk = None if chunk == "dense" else int(chunk)
rng = np.random.default_rng(0)
q, k, v = (keras.ops.convert_to_tensor(rng.normal(size=(1, L, 6, 64)).astype("float32")) for _ in range(3))
f = lambda: keras.ops.convert_to_numpy(pointwise_attention(q, k, v, chunk_size=chunk,
    implementation="chunked" if chunk else "generic"))
def rss():  # current resident set, MiB
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20
f()
base, peak, done = rss(), [0.0], []
def sample():  # the import-time high-water mark hides the call's own peak
    while not done:
        peak[0] = max(peak[0], rss()); time.sleep(0.0005)
th = threading.Thread(target=sample); th.start()
start = time.perf_counter(); f(); t = time.perf_counter() - start
done.append(1); th.join()
print(json.dumps({"L": L, "path": "dense" if chunk is None else f"chunked {chunk}",
                  "seconds": round(t, 3), "peak_extra_mib": round(peak[0] - base, 1)}))
"""


def long_table(lengths, chunk, dense_max):
    import keras

    rows = []
    for L in lengths:
        for c in (["dense"] if L <= dense_max else []) + [str(chunk)]:
            env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
            proc = subprocess.run([sys.executable, "-c", _LONG, str(L), c], env=env,
                                  capture_output=True, text=True)
            if proc.returncode:
                rows.append({"L": L, "path": c, "error": proc.stderr.strip().splitlines()[-1]})
            else:
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="50,197,785,3137")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--long", action="store_true")
    p.add_argument("--long-only", action="store_true", help="only the long-sequence table")
    p.add_argument("--long-lengths", default="4096,16384")
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--dense-max", type=int, default=8192)
    p.add_argument("--all", action="store_true", help="run each backend in a subprocess")
    p.add_argument("--out", help="directory for results (markdown + json)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.all:
        for backend in ("jax", "tensorflow", "torch"):
            env = dict(os.environ, KERAS_BACKEND=backend)
            cmd = [sys.executable, "-m", "benchmarks.attention", "--lengths", args.lengths,
                   "--reps", str(args.reps)] + (["--long"] if args.long else []) + (
                ["--long-only"] if args.long_only else []) + (
                ["--out", args.out] if args.out else [])
            subprocess.run(cmd, env=env, check=True)
        return
    import keras

    rows, text = [], ""
    if not args.long_only:
        rows = op_table([int(x) for x in args.lengths.split(",")], args.reps)
        text = f"## attention op, {keras.backend.backend()}\n\n{format_ops(rows)}\n"
    long_rows = []
    if args.long or args.long_only:
        long_rows = long_table([int(x) for x in args.long_lengths.split(",")], args.chunk,
                               args.dense_max)
        text += "\n| L | path | seconds | peak extra MiB |\n|---|---|---|---|\n" + "\n".join(
            f"| {r['L']} | {r['path']} | {r.get('seconds', '-')} | "
            f"{r.get('peak_extra_mib', r.get('error', '-'))} |" for r in long_rows) + "\n"
    print(text)
    if args.out:
        name = f"attention{'_long' if args.long_only else ''}_{keras.backend.backend()}"
        common.write(args.out, name, text, dict(ops=rows, long=long_rows))

if __name__ == "__main__":
    main()
