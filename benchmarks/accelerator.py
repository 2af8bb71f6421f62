"""ReLU/L attention's fused kernels against the best softmax attention on one
GPU (or TPU), side by side in one run; prints a table and writes it to a file.

    python benchmarks/accelerator.py                       # JAX and torch, all parts
    python benchmarks/accelerator.py --backends jax --parts attention
    python benchmarks/accelerator.py --smoke               # tiny sizes on a CPU: checks the script

Parts (each backend in its own process, so that JAX's and torch's allocators
do not share the GPU):

- attention: fwd and fwd+bwd (differentiating a loss whose value is
  returned: every forward runs), bf16 at head dims 64 and 128 and L = 197,
  785, 1024, 3137, 4096 (ViT-B/16 at 224 px; S/8 or B/16 at 448 px; ...),
  768 channels (12 x 64 or 6 x 128 heads), batch sized to ~50k tokens per
  call; fp32 at one shape. JAX: ours (Pallas) vs XLA's softmax and
  `jax.nn.dot_product_attention(implementation="cudnn")` (bf16 on a GPU),
  JAX's own Pallas softmax kernel (`pallas/ops/gpu/attention.py`) as a
  same-engine control where its blocks divide L, and our generic ReLU/L
  path. torch: ours (Triton) vs SDPA's cuDNN, FLASH and EFFICIENT backends,
  each on its own (the table compares against the fastest per shape), and
  our generic path. Times: torch with CUDA events (`triton.testing.do_bench`,
  median), JAX as back-to-back calls with one sync (the device's time, no
  per-call launch gap); wall clock with a sync per call beside both.
  TFLOP/s with the backward counted as 2.5x the forward. Peak memory at the
  longest L (JAX: the compiled program's temp bytes; torch:
  `max_memory_allocated` above the inputs).
- check (first, always): the fused kernel against our generic path on this
  device -- outputs and dQ, dK, dV (and a learned log-scale's gradient) for
  relu / gelu / relu2, no mask, a key-padding mask and a general mask, head
  dims 64 and 80, float32 and bfloat16 -- as max |ours - generic| / max
  |generic|; a failed check makes the run exit non-zero (a benchmark of a
  wrong kernel is worthless).
- vit: training steps (AdamW, bf16 mixed precision), images/s, ReLU/L vs
  softmax, ViT-B/16 (224, batch 128) and ViT-S/8 (224, batch 64), on each
  backend (JAX: `jit_compile=True`; torch: eager, torch_fast's fused layers).

Ratios are ours / baseline in the same process; the table file also holds
the device, versions and the command. On a device machine without Keras
(the H200 image), run `benchmarks/accelerator.sh`, which installs carried
wheels first (docs/kernels.md, "Measuring on a GPU").
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTHS = (197, 785, 1024, 3137, 4096)
HEAD_DIMS = (64, 128)
TOKENS = 50_432  # 256 x 197: batch x L per call
MODEL_WIDTH = 768  # heads x head dim (ViT-B): 12 x 64 or 6 x 128
VITS = (("B/16", 224, 128), ("S/8", 224, 64))


def sizes(smoke):
    if smoke:
        return dict(lengths=(20, 64), head_dims=(16,), tokens=128, width=32,
                    fp32=((20, 16),), vits=(("Ti/16", 32, 4),), min_time=0.0, min_iters=1)
    return dict(lengths=LENGTHS, head_dims=HEAD_DIMS, tokens=TOKENS, width=MODEL_WIDTH,
                fp32=((785, 64),), vits=VITS, min_time=0.25, min_iters=5)


def cases(cfg):
    """(dtype, head dim, L): bfloat16 at every head dim and L, float32
    briefly (one shape: TF32 / IEEE matmuls are not where a GPU run lives)."""
    out = [("bfloat16", d, n) for d in cfg["head_dims"] for n in cfg["lengths"]]
    return out + [("float32", d, n) for n, d in cfg["fp32"]]


def flops(batch, heads, length, head_dim, mode):
    """Attention FLOPs: two L x L x d matmuls forward (2 flops per
    multiply-add); the backward counted as 2.5x the forward, as the
    FlashAttention papers and Triton's tutorial count (5 matmuls)."""
    forward = 4.0 * batch * heads * length * length * head_dim
    return forward * (1.0 if mode == "fwd" else 3.5)


def timed(fn, sync, min_time, min_iters):
    """Median milliseconds of `fn()` (a sync per call: launch overhead
    included) after two warm-up calls."""
    for _ in range(2):
        sync(fn())
    times = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        sync(fn())
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 200:
            break
    times.sort()
    return times[len(times) // 2]


def pipelined(fn, sync, min_time, min_iters):
    """Milliseconds per call of back-to-back calls with one sync at the end
    (the device's time when launches are queued ahead: what CUDA events
    measure), the median of 5 such runs after a warm-up."""
    sync(fn())
    n = max(min_iters, 1)
    t0 = time.perf_counter()
    out = None
    for _ in range(n):
        out = fn()
    sync(out)
    once = max((time.perf_counter() - t0) / n, 1e-6)
    n = max(n, min(1000, int(min_time / 5 / once)))  # ~min_time in all
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn()
        sync(out)
        runs.append((time.perf_counter() - t0) * 1e3 / n)
    runs.sort()
    return runs[2]


_DEADLINE = [float("inf")]


def out_of_time(row):
    """Past this part's share of the time budget: the row says so (and is
    emitted by the caller) instead of being measured."""
    if time.perf_counter() > _DEADLINE[0]:
        row["error"] = "skipped (time budget)"
        return True
    return False


def emit(**row):
    print("ROW " + json.dumps(row), flush=True)


def is_oom(error):
    text = str(error).lower()
    return "out of memory" in text or "resource_exhausted" in text or "oom" in text


# --- the kernel on this device against the generic path ---------------------------
# (activation, T, S, heads, head dim, mask, learned log-scale); smoke: smaller.
CHECKS = (("relu", 197, 197, 6, 64, None, False),
          ("gelu", 197, 197, 6, 64, "key", True),
          ("relu2", 50, 61, 3, 80, "general", False))
CHECK_TOLERANCE = {"float32": 2e-2, "bfloat16": 6e-2}  # TF32 / bf16 matmuls


def check_kernels(backend, smoke):
    """Rows of max |ours - generic| / max |generic| (output and each
    gradient) per case and dtype; the generic reference is float32 at the
    backend's highest matmul precision."""
    import keras
    import numpy as np

    from keras_reluvit import pointwise_attention

    ours = "pallas" if backend == "jax" else "triton"
    if backend == "jax":
        import jax

        def grads_of(fn, xs):  # value and gradient of sum(fn(*xs) * cot)
            out = fn(*xs)
            cot = jax.numpy.asarray(np.random.default_rng(1).normal(size=out.shape), "float32")
            g = jax.grad(lambda *a: jax.numpy.sum(fn(*a).astype("float32") * cot),
                         argnums=tuple(range(len(xs))))(*xs)
            return [np.asarray(out, "float32")] + [np.asarray(x, "float32") for x in g]

        def highest():
            return jax.default_matmul_precision("highest")
    else:
        import contextlib

        import torch

        def grads_of(fn, xs):
            xs = [x.detach().requires_grad_(True) for x in xs]
            out = fn(*xs)
            cot = torch.as_tensor(np.random.default_rng(1).normal(size=tuple(out.shape)),
                                  dtype=torch.float32, device=out.device)
            g = torch.autograd.grad((out.float() * cot).sum(), xs)
            return [out.detach().float().cpu().numpy()] + [x.float().cpu().numpy() for x in g]

        def highest():
            return contextlib.nullcontext()  # torch's float32 matmuls are IEEE unless TF32 is on

    for act, t, s, h, d, mask_kind, learned in CHECKS:
        if smoke:
            t, s, h, d = min(t, 21), min(s, 30), 2, min(d, 24)
        rng = np.random.default_rng(0)
        base = [rng.normal(size=(2, n, h, d)).astype("float32") for n in (t, s, s)]
        if learned:
            base.append(rng.normal(scale=0.3, size=(h,)).astype("float32"))
        mask = None
        if mask_kind == "key":
            mask = np.ones((2, 1, s), bool)
            mask[1, :, s // 2:] = False
        elif mask_kind == "general":
            mask = rng.random((2, t, s)) < 0.6
        for dtype in ("float32", "bfloat16"):
            row = dict(part="check", backend=backend, impl=f"{act} {mask_kind or 'no'} mask",
                       dtype=dtype, L=s, batch=2, mode=f"h {h}, d {d}")

            def run(impl, dt, xs):
                def fn(q, k, v, *ls):
                    cast = [keras.ops.cast(x, dt) for x in (q, k, v)]
                    out = pointwise_attention(*cast, activation=act, mask=mask,
                                              log_scale=ls[0] if ls else None,
                                              implementation=impl)
                    return keras.ops.cast(out, "float32")
                return grads_of(fn, xs)
            try:
                xs = [keras.ops.convert_to_tensor(x) for x in base]
                # Both sides see the same (dtype-rounded) inputs.
                xs = [keras.ops.cast(keras.ops.cast(x, dtype), "float32") for x in xs]
                got = run(ours, dtype, xs)
                with highest():
                    ref = run("generic", "float32", xs)
                names = ["out", "dq", "dk", "dv", "dlog_scale"][:len(got)]
                errs = {n: float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                        for n, a, b in zip(names, got, ref)}
                row["errors"] = errs
                row["ok"] = bool(all(np.isfinite(list(errs.values())))
                                 and max(errs.values()) <= CHECK_TOLERANCE[dtype])
            except Exception as error:  # noqa: BLE001 -- reported in the table
                row["error"] = type(error).__name__
                row["detail"] = str(error)[:300]
                row["ok"] = False
            emit(**row)


# --- JAX ---------------------------------------------------------------------------
def jax_attention(cfg, smoke):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention as pallas_softmax

    from keras_reluvit import kernels
    from keras_reluvit.kernels import pallas

    sync = jax.block_until_ready
    gpu = jax.default_backend() == "gpu" and not smoke
    for dtype, d, length in cases(cfg):
        heads = cfg["width"] // d
        b = max(1, cfg["tokens"] // length)
        shape = (b, length, heads, d)
        keys = jax.random.split(jax.random.PRNGKey(0), 4)
        q, k, v, cot = (jax.random.normal(kk, shape, dtype) for kk in keys)
        impls = {
            "relu/L pallas": lambda a, b_, c: pallas.attention(
                a, b_, c, "relu", 1.0 / length),
            "relu/L generic": lambda a, b_, c: kernels.generic(
                a, b_, c, jax.nn.relu, None, 1.0 / length)[0],
            "softmax xla": lambda a, b_, c: jax.nn.dot_product_attention(
                a, b_, c, implementation="xla"),
        }
        if gpu and dtype == "bfloat16":  # cuDNN's flash attention: GPUs, 16-bit
            impls["softmax cudnn"] = lambda a, b_, c: jax.nn.dot_product_attention(
                a, b_, c, implementation="cudnn")
        block = 16 if smoke else 128
        if (gpu or smoke) and dtype == "bfloat16" and length % block == 0:
            # The same-engine control: JAX's own Pallas softmax flash kernel
            # (interpreted in the smoke run). It takes only token counts
            # that its blocks divide (1024, 4096 here).
            sizes_ = pallas_softmax.BlockSizes(*(block,) * 2, *(max(16, block // 4),) * 4)
            impls["control pallas softmax"] = lambda a, b_, c: pallas_softmax.mha(
                a, b_, c, None, sm_scale=1.0 / d ** 0.5, interpret=smoke,
                block_sizes=sizes_)
        for mode in ("fwd", "fwd+bwd"):
            for impl, f in impls.items():
                if mode == "fwd":
                    fn = jax.jit(f)
                else:
                    # The loss is returned: XLA cannot drop the forward
                    # kernel as dead code (with `jax.grad` alone it would,
                    # while cuDNN's backward needs its forward's statistics).
                    def loss(a, b_, c, f=f):
                        return jnp.sum(f(a, b_, c).astype(jnp.float32) * cot)
                    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
                row = dict(part="attention", backend="jax", impl=impl, dtype=dtype, d=d,
                           heads=heads, L=length, batch=b, mode=mode)
                if out_of_time(row):
                    emit(**row)
                    continue
                try:
                    compiled = fn.lower(q, k, v).compile()
                    row["wall_ms"] = timed(lambda: compiled(q, k, v), sync, cfg["min_time"],
                                           cfg["min_iters"])
                    row["ms"] = pipelined(lambda: compiled(q, k, v), sync, cfg["min_time"],
                                          cfg["min_iters"])
                    row["tflops"] = flops(b, heads, length, d, mode) / (row["ms"] * 1e9)
                    if length == cfg["lengths"][-1]:
                        mem = compiled.memory_analysis()
                        row["temp_bytes"] = getattr(mem, "temp_size_in_bytes", None)
                except Exception as error:  # noqa: BLE001 -- reported in the table
                    row["error"] = "OOM" if is_oom(error) else type(error).__name__
                    row["detail"] = str(error)[:300]
                emit(**row)


def setup(backend, smoke):
    import keras_reluvit as kr

    if smoke:  # a CPU: the kernels in their interpreters
        kr.set_kernel("pallas" if backend == "jax" else "triton")


# --- torch -------------------------------------------------------------------------
def torch_attention(cfg, smoke):
    import torch
    import torch.nn.functional as F

    from keras_reluvit import kernels
    from keras_reluvit.kernels import triton as triton_kernel

    device = "cpu" if smoke else "cuda"

    def sync(x):
        if device == "cuda":
            torch.cuda.synchronize()
        return x

    def sdpa(backend_name):
        from torch.nn.attention import SDPBackend
        from torch.nn.attention import sdpa_kernel

        backend = getattr(SDPBackend, backend_name)

        def f(a, b_, c):
            args = (a.transpose(1, 2), b_.transpose(1, 2), c.transpose(1, 2))
            if device != "cuda":  # the smoke run: whichever CPU kernel SDPA picks
                return F.scaled_dot_product_attention(*args).transpose(1, 2)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(*args).transpose(1, 2)
        return f

    # Each of SDPA's fused backends on its own; the table compares against
    # the fastest of them per shape (a backend that refuses a shape or
    # dtype -- FLASH and float32 -- is marked unsupported, not an error).
    soft = ({"softmax sdpa": sdpa("MATH")} if device != "cuda" else
            {f"softmax sdpa {name.split('_')[0].lower()}": sdpa(name)
             for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")})
    for dtype, d, length in cases(cfg):
        heads = cfg["width"] // d
        b = max(1, cfg["tokens"] // length)
        shape = (b, length, heads, d)
        tdt = getattr(torch, dtype)
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, cot = (torch.randn(shape, generator=gen, device=device, dtype=tdt)
                        for _ in range(4))
        impls = {
            "relu/L triton": lambda a, b_, c: triton_kernel.attention(
                a, b_, c, "relu", 1.0 / length),
            "relu/L generic": lambda a, b_, c: kernels.generic(
                a, b_, c, torch.relu, None, 1.0 / length)[0],
            **soft,
        }
        for mode in ("fwd", "fwd+bwd"):
            for impl, f in impls.items():
                row = dict(part="attention", backend="torch", impl=impl, dtype=dtype, d=d,
                           heads=heads, L=length, batch=b, mode=mode)
                if out_of_time(row):
                    emit(**row)
                    continue
                xs = [x.detach().requires_grad_(mode != "fwd") for x in (q, k, v)]

                def step(f=f, xs=xs, mode=mode):
                    if mode == "fwd":
                        with torch.no_grad():
                            return f(*xs)
                    # The loss is formed from every output: the forward runs.
                    out = f(*xs)
                    return torch.autograd.grad((out * cot).sum(), xs)
                try:
                    if device == "cuda":
                        import triton.testing

                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                        # CUDA events around each call (Triton's do_bench).
                        row["ms"] = triton.testing.do_bench(step, warmup=25, rep=100,
                                                            return_mode="median")
                    row["wall_ms"] = timed(step, sync, cfg["min_time"], cfg["min_iters"])
                    row.setdefault("ms", row["wall_ms"])  # a CPU (smoke): no events
                    row["tflops"] = flops(b, heads, length, d, mode) / (row["ms"] * 1e9)
                    if device == "cuda" and length == cfg["lengths"][-1]:
                        row["temp_bytes"] = torch.cuda.max_memory_allocated() - base
                except Exception as error:  # noqa: BLE001 -- reported in the table
                    unsupported = impl.startswith("softmax sdpa ") and (
                        "No available kernel" in str(error) or "not supported" in str(error))
                    row["error"] = ("unsupported" if unsupported else
                                    "OOM" if is_oom(error) else type(error).__name__)
                    row["detail"] = str(error)[:300]
                emit(**row)
                del xs


# --- whole ViTs --------------------------------------------------------------------
def vit_steps(backend, cfg, smoke):
    import keras
    import numpy as np

    import keras_reluvit as kr

    if not smoke:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    for variant, image, batch in cfg["vits"]:
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (batch, image, image, 3)).astype("float32")
        y = keras.utils.to_categorical(rng.integers(0, 1000, batch), 1000)
        for attention in ("relu", "softmax"):
            row = dict(part="vit", backend=backend, impl=f"ViT-{variant} {attention}",
                       L=(image // int(variant.split("/")[1])) ** 2 + 1, batch=batch,
                       dtype="mixed_bfloat16" if not smoke else "float32", mode="train step")
            if out_of_time(row):
                emit(**row)
                continue
            try:
                keras.utils.set_random_seed(0)
                extra = dict(image_size=32, patch_size=16, width=32, depth=2, num_heads=2,
                             mlp_dim=64) if smoke else {}
                model = kr.ViT(variant, attention=attention, num_classes=1000, **extra)
                model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                              loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                              jit_compile=backend == "jax")
                ms = timed(lambda: model.train_on_batch(x, y), lambda r: r,
                           cfg["min_time"], max(3, cfg["min_iters"]) if not smoke else 1)
                row["ms"] = ms
                row["images_per_s"] = batch / ms * 1e3
            except Exception as error:  # noqa: BLE001 -- reported in the table
                row["error"] = "OOM" if is_oom(error) else type(error).__name__
                row["detail"] = str(error)[:300]
            emit(**row)
            model = None


def worker(backend, parts, smoke, budget=float("inf")):
    cfg = sizes(smoke)
    import keras

    assert keras.backend.backend() == backend, keras.backend.backend()
    info = dict(backend=backend, keras=keras.__version__)
    if backend == "jax":
        import jax

        info.update(jax=jax.__version__, device=str(jax.devices()[0].device_kind))
    else:
        import torch

        info.update(torch=torch.__version__, device=(torch.cuda.get_device_name()
                                                     if torch.cuda.is_available() else "cpu"))
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
        if not smoke and not torch.cuda.is_available():
            info["skipped"] = "no CUDA device (the Triton kernel is for CUDA tensors)"
            print("INFO " + json.dumps(info), flush=True)
            return
    print("INFO " + json.dumps(info), flush=True)
    setup(backend, smoke)
    start = time.perf_counter()  # the check's time comes out of the budget too
    check_kernels(backend, smoke)
    if "attention" in parts:  # 60 % of the budget when the ViTs follow
        share = 0.6 if "vit" in parts else 1.0
        _DEADLINE[0] = start + share * budget
        (jax_attention if backend == "jax" else torch_attention)(cfg, smoke)
    if "vit" in parts:
        _DEADLINE[0] = start + budget
        vit_steps(backend, cfg, smoke)


# --- the table ---------------------------------------------------------------------
def baseline_of(row, rows):
    """(the fastest production softmax row, the Pallas softmax control, our
    generic row) of the same backend / dtype / head dim / L / mode."""
    same = [r for r in rows if r["part"] == row["part"] and r["backend"] == row["backend"]
            and r["dtype"] == row["dtype"] and r.get("d") == row.get("d")
            and r["L"] == row["L"] and r["mode"] == row["mode"]]
    soft = [r for r in same if r["impl"].startswith("softmax")]
    timed_soft = [r for r in soft if "ms" in r]
    best = min(timed_soft, key=lambda r: r["ms"]) if timed_soft else (soft[0] if soft else None)
    control = next((r for r in same if r["impl"].startswith("control")), None)
    generic = next((r for r in same if r["impl"] == "relu/L generic"), None)
    return best, control, generic


def table(rows, infos, command, elapsed):
    lines = ["# Accelerator benchmark", "", f"command: `{command}`", f"wall time: {elapsed:.0f} s",
             ""]
    for info in infos:
        lines.append("- " + ", ".join(f"{k} {v}" for k, v in info.items()))
    checks = [r for r in rows if r["part"] == "check"]
    if checks:
        lines += ["", "## Kernel check on this device (ours vs our generic path: "
                  "max abs difference / max abs generic)", "",
                  "| backend | case | dtype | shape | out | dq | dk | dv | dlog_scale | ok |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in checks:
            e = r.get("errors", {})
            cells = [f"{e[n]:.1e}" if n in e else ("-" if "errors" in r else r.get("error", "-"))
                     for n in ("out", "dq", "dk", "dv", "dlog_scale")]
            lines.append(f"| {r['backend']} | {r['impl']} | {r['dtype']} | L {r['L']}, "
                         f"{r['mode']} | " + " | ".join(cells)
                         + f" | {'yes' if r['ok'] else '**NO**'} |")
    lines += ["", "## Attention (ms per call: torch CUDA events (do_bench), JAX back-to-back "
              "calls with one sync; wall = a sync per call. Ratio = baseline ms / ours ms, "
              "> 1: ours faster. TFLOP/s: backward counted as 2.5x the forward)", "",
              "| backend | dtype | d | mode | L | batch | ours ms | TFLOP/s | "
              "fastest softmax ms (impl) | vs softmax | control: pallas softmax ms | "
              "vs control | generic ms | vs generic | wall ms ours / softmax | "
              "peak temp MB ours / softmax / generic |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(r, key="ms"):
        if r is None:
            return "-"
        return r.get("error") or f"{r[key]:.3f}"

    def ratio(base, ours):
        if base is None or "ms" not in base or "ms" not in ours:
            return "-"
        return f"{base['ms'] / ours['ms']:.2f}x"

    def mb(r):
        if r is None or r.get("temp_bytes") is None:
            return "-"
        return f"{r['temp_bytes'] / 2**20:.0f}"

    for r in rows:
        if r["part"] != "attention" or r["impl"].split()[-1] not in ("pallas", "triton") \
                or not r["impl"].startswith("relu"):
            continue
        soft, control, gen = baseline_of(r, rows)
        mem = " / ".join(mb(x) for x in (r, soft, gen)) if r.get("temp_bytes") else "-"
        flop = f"{r['tflops']:.1f}" if "tflops" in r else "-"
        wall = f"{ms(r, 'wall_ms')} / {ms(soft, 'wall_ms')}" if "wall_ms" in r else "-"
        lines.append(f"| {r['backend']} | {r['dtype']} | {r.get('d', '-')} | {r['mode']} | "
                     f"{r['L']} | {r['batch']} | {ms(r)} | {flop} | "
                     f"{ms(soft)} ({soft['impl'] if soft else '-'}) | {ratio(soft, r)} | "
                     f"{ms(control)} | {ratio(control, r)} | {ms(gen)} | {ratio(gen, r)} | "
                     f"{wall} | {mem} |")
    vit = [r for r in rows if r["part"] == "vit"]
    if vit:
        lines += ["", "## Training steps (images/s)", "",
                  "| backend | model | tokens | batch | images/s | relu/softmax |",
                  "|---|---|---|---|---|---|"]
        for r in vit:
            if not r["impl"].endswith(" relu"):
                continue
            soft = next((s for s in vit if s["backend"] == r["backend"]
                         and s["impl"] == r["impl"].replace(" relu", " softmax")), None)
            ips = r.get("error") or f"{r['images_per_s']:.1f}"
            sips = (soft.get("error") or f"{soft['images_per_s']:.1f}") if soft else "-"
            rat = (f"{r['images_per_s'] / soft['images_per_s']:.2f}x"
                   if soft and "images_per_s" in r and "images_per_s" in soft else "-")
            lines.append(f"| {r['backend']} | {r['impl'][:-5]} | {r['L']} | {r['batch']} | "
                         f"{ips} vs {sips} | {rat} |")
    errors = [r for r in rows if r.get("error") and "budget" not in r["error"]
              and r["error"] != "unsupported"]
    skipped = [r for r in rows if "budget" in (r.get("error") or "")]
    if skipped:
        lines += ["", f"{len(skipped)} measurements skipped at the time budget (--budget)."]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {r['backend']} {r['impl']} {r['dtype']} L={r['L']} {r['mode']}: "
                  f"{r['error']}: {r.get('detail', '')}" for r in errors]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="jax,torch")
    parser.add_argument("--parts", default="attention,vit")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes; kernels interpreted on a CPU (checks the script)")
    parser.add_argument("--out", default=None, help="table file (default: "
                        "benchmarks/results/accelerator-<device>.md)")
    parser.add_argument("--budget", type=float, default=150,
                        help="seconds of measuring per backend (default 150: both backends "
                        "in < 6 min); rows past it are marked skipped")
    parser.add_argument("--timeout", type=float, default=280,
                        help="seconds per backend process before it is stopped")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for backend in args.backends.split(","):
        if backend not in ("jax", "torch"):
            parser.error(f"--backends takes jax and/or torch, not {backend!r}")
    for part in args.parts.split(","):
        if part not in ("attention", "vit"):
            parser.error(f"--parts takes attention and/or vit, not {part!r}")
    return args


def main(argv=None):
    args = parse_args(argv)
    parts = args.parts.split(",")
    if args.worker:
        worker(args.worker, parts, args.smoke, args.budget)
        return 0
    start = time.time()
    rows, infos = [], []
    for backend in args.backends.split(","):
        env = dict(os.environ, KERAS_BACKEND=backend, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                   TF_CPP_MIN_LOG_LEVEL="3")
        if args.smoke and backend == "torch":
            env["TRITON_INTERPRET"] = "1"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", backend,
               "--parts", args.parts, "--budget", str(args.budget)] + (
                   ["--smoke"] if args.smoke else [])
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=args.timeout, cwd=ROOT)
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = f"timed out after {args.timeout} s", "timeout"
        for line in out.splitlines():
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
            elif line.startswith("INFO "):
                infos.append(json.loads(line[5:]))
        if rc != 0:
            infos.append(dict(backend=backend, failed=rc, stderr=err.strip()[-500:]))
            print(err[-3000:], file=sys.stderr)
    command = "python benchmarks/accelerator.py " + " ".join(argv if argv is not None
                                                             else sys.argv[1:])
    text = table(rows, infos, command.strip(), time.time() - start)
    print(text)
    device = next((i.get("device") for i in infos if i.get("device")), platform.node())
    out = args.out or os.path.join(ROOT, "benchmarks", "results", "accelerator-"
                                   + "".join(c if c.isalnum() else "-" for c in device.lower())
                                   + ("-smoke" if args.smoke else "") + ".md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
        f.write("\n<!-- rows\n" + json.dumps(rows, indent=0) + "\n-->\n")
    print(f"wrote {out}")
    failed_checks = [r for r in rows if r["part"] == "check" and not r["ok"]]
    if failed_checks:
        print(f"{len(failed_checks)} kernel checks FAILED on this device", file=sys.stderr)
    return 0 if all("failed" not in i for i in infos) and not failed_checks else 1


if __name__ == "__main__":
    sys.exit(main())
