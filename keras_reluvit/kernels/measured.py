"""The measured `auto` dispatch: a fused kernel is trusted only once measured.

Under `KERAS_RELUVIT_KERNEL=auto` a fused accelerator kernel (Pallas on a
TPU / CUDA GPU, Triton for CUDA tensors) is used for a call only after it
has, on random probe inputs of that call's own shapes, dtype, mask kind and
row factor:

1. **run** -- lowered, compiled and launched. An error is one warning naming
   it, and the calls take the *fallback*: the path the dispatch rule picks
   without the kernel (the `keras.ops` path, fused by XLA on JAX; generic or
   chunked on torch CUDA tensors);
2. **matched the fallback** -- outputs, and, when the call is being
   differentiated, the gradients of q, k, v and the row factor, within the
   dtype's rounding (`TOLERANCE`, relative to the largest value). A mismatch
   is one warning and the fallback;
3. **beaten the fallback's time** -- the median of repeated runs, forward, or
   forward + backward when the call is being differentiated (torch: autograd
   records it; JAX: traced under `jax.grad` / `value_and_grad`). Slower is
   the fallback, without a warning: `report()` says so.

A kernel may come in *variants* (`trusted`'s `variants`: name -> the
kernel's options) that differ only in how they compute: the CUDA kernels'
two backward passes -- fused, dQ added atomically, or deterministic, two
kernels -- when the call is differentiated. Each variant goes through 1 and
2; the fastest that passed is timed against the fallback and, when faster,
its options go with the calls (`Decision.variant`). A variant that fails
is left out, without a warning, unless all fail.

The decision is made once per signature (kernel, device, activation, shapes,
dtype, mask shape, row-factor kind, differentiated or not) and process --
under `jax.jit` when the function is traced, on concrete probe arrays (in
a thread of its own, outside the trace), so a traced function keeps it. With
`KERAS_RELUVIT_KERNEL_CACHE=<file>` decisions are also kept on disk, keyed
by the device, the library versions and the signature (as Triton's
autotuning cache and `torch.backends.cudnn.benchmark` do): a later process
reuses them without measuring. Probes bound the fallback's score memory
(`PROBE_SCORES`) by taking fewer batch elements than the call: the timing is
then of that batch. The forced switches (`pallas`, `triton`) skip all of it.

`report()` lists every decision of this process: what was chosen, why, the
two times and the probe's error.
"""

import dataclasses
import json
import os
import time
import warnings

import numpy as np

from keras_reluvit.kernels.switches import setting

CACHE_ENV = "KERAS_RELUVIT_KERNEL_CACHE"
# A probe keeps batch * heads * T * S (the fallback's score tensor) under this.
PROBE_SCORES = 1 << 27
# Largest |kernel - fallback| / max|fallback| accepted, per dtype.
TOLERANCE = {"float32": 5e-3, "bfloat16": 4e-2, "float16": 1e-2}
# Timing: repeat each path until this many seconds (at least MIN_REPS runs).
MIN_SECONDS = 0.05
MIN_REPS, MAX_REPS = 3, 100


@dataclasses.dataclass
class Decision:
    """One signature's decision: `path` is what its calls take (`kernel`
    or `fallback`), `reason` one of "faster", "slower", "error",
    "mismatch" (`detail` says more), the median times in ms and the probe's
    largest relative error; `source` "measured" or "disk"; `variant` the
    kernel variant chosen (None: the kernel's defaults, or the fallback)."""
    kernel: str
    fallback: str
    path: str
    reason: str
    detail: str
    kernel_ms: object
    fallback_ms: object
    max_error: object
    differentiated: bool
    probe_batch: int
    signature: str
    source: str = "measured"
    variant: object = None


class Report(list):
    """`report()`'s list of `Decision`s; prints as a table."""

    def __str__(self):
        if not self:
            return "No fused-kernel decision in this process (auto has not met an accelerator call)."
        lines = ["path        | kernel ms | fallback ms | error   | why      | signature"]
        for d in self:
            ms = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            err = "-" if d.max_error is None else f"{d.max_error:.1e}"
            path = d.path if d.variant is None else f"{d.path} ({d.variant})"
            lines.append(f"{path:<11} | {ms(d.kernel_ms):>9} | {ms(d.fallback_ms):>11} | "
                         f"{err:<7} | {d.reason:<8} | {d.signature}"
                         + (f"  ({d.detail})" if d.detail else ""))
        return "\n".join(lines)


_decisions = {}  # signature -> Decision


def report():
    """What `auto` chose for each fused-kernel signature of this process, and why."""
    return Report(_decisions.values())


def clear():
    """Forgets this process's decisions (the next calls measure again;
    functions already traced by `jax.jit` keep theirs)."""
    _decisions.clear()


# --- the two backends' few operations ---------------------------------------------
class _Jax:
    differentiating_tracers = ("JVPTracer", "LinearizeTracer")

    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp

    def device(self, like):
        device = self.jax.devices()[0]
        return f"{device.platform}:{getattr(device, 'device_kind', '')}"

    def versions(self):
        import jaxlib

        return f"jax {self.jax.__version__} jaxlib {jaxlib.__version__}"

    def differentiated(self, call):
        return type(call.query).__name__ in self.differentiating_tracers

    def array(self, x, dtype, like):
        return self.jnp.asarray(x, dtype=dtype)

    def numpy(self, x):
        return np.asarray(x.astype(self.jnp.float32) if x.dtype != bool else x, np.float64)

    def isolated(self, fn):
        """`fn()` outside any trace: JAX's trace state is per thread, so a
        fresh thread runs concrete probes even while `jax.jit` / `jax.grad`
        trace the caller (`ensure_compile_time_eval` would also evaluate the
        Pallas kernel's own body, which must be traced)."""
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(fn).result()

    def program(self, run, names, training):
        """A compiled function of the probe dict (and cotangent): the output,
        and the gradients of `names` when training."""
        jax = self.jax
        if not training:
            return jax.jit(lambda a, ct: (run(a), ()))

        def both(a, ct):
            diff = {n: a[n] for n in names}
            out, vjp = jax.vjp(lambda x: run({**a, **x}), diff)
            grads = vjp(ct)[0]
            return out, tuple(grads[n] for n in names)

        return jax.jit(both)

    def sync(self, result):
        self.jax.block_until_ready(result)


class _Torch:
    def __init__(self):
        import torch

        self.torch = torch

    def device(self, like):
        dev = like.device
        if dev.type == "cuda":
            return f"cuda:{self.torch.cuda.get_device_name(dev)}"
        return str(dev.type)

    def versions(self):
        try:
            import triton
            extra = f" triton {triton.__version__}"
        except ImportError:
            extra = ""
        return f"torch {self.torch.__version__}{extra}"

    def differentiated(self, call):
        return bool(call.recording)

    def array(self, x, dtype, like):
        torch = self.torch
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=like.device, dtype=dtype)

    def numpy(self, x):
        return x.detach().float().cpu().numpy().astype(np.float64) if x.dtype != self.torch.bool \
            else x.cpu().numpy()

    def isolated(self, fn):
        return fn()

    def program(self, run, names, training):
        torch = self.torch

        def call(a, ct):
            if not training:
                with torch.no_grad():
                    return run(a), ()
            with torch.enable_grad():
                a = {n: (x.detach().requires_grad_(True) if n in names else x)
                     for n, x in a.items()}
                out = run(a)
                return out, torch.autograd.grad(out, [a[n] for n in names], ct)

        return call

    def sync(self, result):
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()


_OPS = {}


def _ops(backend):
    """The backend's operations (made once: `trusted` runs on every call)."""
    if backend not in _OPS:
        _OPS[backend] = (_Jax if backend == "jax" else _Torch)()
    return _OPS[backend]


# --- the probe ------------------------------------------------------------------
def _dtype_name(x):
    return str(getattr(x, "dtype", "float32")).replace("torch.", "")


def _shape(x):
    return tuple(int(n) for n in x.shape)


def _factor_kind(factor):
    if factor is None or isinstance(factor, float):
        return factor if factor is None else float(f"{factor:.6g}")
    return ("array", _shape(factor), _dtype_name(factor))


def signature(kernel, call, device, differentiated, variants=()):
    """The key of a decision, as a readable string (with the names of the
    variants measured, when more than one)."""
    mask = None if call.kernel_mask is None else _shape(call.kernel_mask)
    among = f" variants[{','.join(variants)}]" if len(variants) > 1 else ""
    return (f"{kernel} {device} {call.name} q{_shape(call.query)} k{_shape(call.key)} "
            f"v{_shape(call.value)} {_dtype_name(call.query)} mask{mask} "
            f"factor{_factor_kind(call.factor)} {'fwd+bwd' if differentiated else 'fwd'}{among}")


def _probe_batch(call):
    b, t, nh = _shape(call.query)[:3]
    s = _shape(call.key)[1]
    return max(1, min(b, PROBE_SCORES // max(1, nh * t * s)))


def _probe(call, ops, batch, training):
    """Random inputs of the call's shapes (the batch cut to `batch`), as a
    dict; the names to differentiate; a cotangent."""
    rng = np.random.default_rng(0)
    dtype = _dtype_name(call.query)
    like = call.query

    def cut(shape):
        return (batch,) + shape[1:] if shape and shape[0] != 1 else shape

    arrays, names = {}, ["query", "key", "value"]
    for n in names:
        shape = cut(_shape(getattr(call, n)))
        arrays[n] = ops.array(rng.standard_normal(shape).astype(np.float32), dtype, like)
    if call.kernel_mask is not None:
        rows = cut(_shape(call.kernel_mask))
        mask = rng.random(rows) < 0.8
        t, s = _shape(call.query)[1], _shape(call.key)[1]
        arrays["kernel_mask"] = ops.array(mask, "bool", like)
        arrays["mask"] = ops.array(np.broadcast_to(mask, (rows[0], t, s)).copy(), "bool", like)
    if call.factor is not None and not isinstance(call.factor, float):
        shape = cut(_shape(call.factor))
        values = rng.uniform(0.5, 1.5, shape) / _shape(call.key)[1]
        arrays["factor"] = ops.array(values.astype(np.float32), _dtype_name(call.factor), like)
        names.append("factor")
    out_shape = _shape(call.query)[:3] + (_shape(call.value)[-1],)
    ct = ops.array(rng.standard_normal(cut(out_shape)).astype(np.float32), dtype, like)
    return arrays, (names if training else []), ct


def _seconds(program, args, ops):
    times, total = [], 0.0
    while len(times) < MIN_REPS or (total < MIN_SECONDS and len(times) < MAX_REPS):
        start = time.perf_counter()
        ops.sync(program(*args))
        times.append(time.perf_counter() - start)
        total += times[-1]
    return float(np.median(times))


def _max_error(got, want, ops):
    worst = 0.0
    for g, w in zip(got, want):
        g, w = ops.numpy(g), ops.numpy(w)
        if g.shape != w.shape or not np.all(np.isfinite(g)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(g - w), initial=0.0)
                                 / max(float(np.max(np.abs(w), initial=0.0)), 1e-6)))
    return worst


# --- the disk cache ------------------------------------------------------------------
def _disk_key(ops, sig):
    import keras

    from keras_reluvit._version import __version__

    return f"keras-reluvit {__version__} keras {keras.__version__} {ops.versions()} | {sig}"


def _read_cache(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        warnings.warn(f"{CACHE_ENV}={path} could not be read ({error}); measuring again.",
                      stacklevel=4)
        return {}


def _write_cache(path, key, decision):
    try:
        entries = _read_cache(path)
        entries[key] = dataclasses.asdict(decision)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as error:
        warnings.warn(f"{CACHE_ENV}={path} could not be written ({error}).", stacklevel=4)


# --- the decision ----------------------------------------------------------------------
def trusted(kernel, fallback, call, paths, variants=None):
    """The options with which `call` takes the fused `kernel` (a dict, {}
    for its defaults), or None: the `fallback` path. Measured once per
    signature as the module says. `paths` is the dispatch's table of paths
    (name -> function of a `Call`); `variants` (name -> options), measured
    against each other when the call is differentiated."""
    ops = _ops(call.backend)
    training = ops.differentiated(call)
    variants = variants if training and variants else {None: {}}
    sig = signature(kernel, call, ops.device(call.query), training,
                    [name for name in variants if name is not None])
    decision = _decisions.get(sig)
    cache = setting("kernel_cache")
    if decision is None and cache:
        stored = _read_cache(cache).get(_disk_key(ops, sig))
        if (stored is not None and stored.get("fallback") == fallback
                and (stored.get("path") != kernel or stored.get("variant") in variants)):
            decision = _decisions[sig] = Decision(**{**stored, "source": "disk"})
    if decision is None:
        decision = ops.isolated(
            lambda: _measure(kernel, fallback, call, paths, ops, training, sig, variants))
        _decisions[sig] = decision
        if decision.reason in ("error", "mismatch"):
            warnings.warn(
                f"The fused {kernel} kernel is not used for {sig}: {decision.detail}. These "
                f"calls take the {fallback} path (KERAS_RELUVIT_KERNEL={kernel} forces the "
                "kernel; keras_reluvit.kernels.report() lists every decision).", stacklevel=4)
        if cache:
            _write_cache(cache, _disk_key(ops, sig), decision)
    return dict(variants[decision.variant]) if decision.path == kernel else None


def _measure(kernel, fallback, call, paths, ops, training, sig, variants):
    batch = _probe_batch(call)
    arrays, names, ct = _probe(call, ops, batch, training)
    record = dict(kernel=kernel, fallback=fallback, differentiated=training, probe_batch=batch,
                  signature=sig)

    def runner(path, options=None):
        def run(a):
            probe = dataclasses.replace(
                call, query=a["query"], key=a["key"], value=a["value"],
                mask=a.get("mask"), kernel_mask=a.get("kernel_mask"),
                factor=a.get("factor", call.factor), sp=None, recording=training,
                kernel=kernel if path == kernel else None, options=options)
            return paths[path](probe)[0]

        return ops.program(run, names, training)

    def done(path, reason, detail, kernel_ms=None, fallback_ms=None, error=None, variant=None):
        return Decision(path=path, reason=reason, detail=detail, kernel_ms=kernel_ms,
                        fallback_ms=fallback_ms, max_error=error, variant=variant, **record)

    reference = runner(fallback)
    want = reference(arrays, ct)
    ops.sync(want)
    tolerance = TOLERANCE.get(_dtype_name(call.query), 1e-2)
    passed, failed = [], []  # (variant, program, error); (variant, reason, detail, error)
    for variant, options in variants.items():
        fused = runner(kernel, options)
        try:
            got = fused(arrays, ct)
            ops.sync(got)
        except Exception as error:  # noqa: BLE001 -- any failure of the kernel means: not this kernel
            text = " ".join(str(error).split())
            failed.append((variant, "error", f"{type(error).__name__}: {text[:300]}", None))
            continue
        error = _max_error([got[0], *got[1]], [want[0], *want[1]], ops)
        if not error <= tolerance:
            failed.append((variant, "mismatch", f"its probe differs from the {fallback} path by "
                           f"{error:.2e} (relative; tolerance {tolerance:.0e})", error))
            continue
        passed.append((variant, fused, error))
    named = lambda variant, text: text if variant is None else f"{variant}: {text}"  # noqa: E731
    if not passed:
        _, reason, _, error = failed[0]
        return done(fallback, reason, "; ".join(named(v, d) for v, _, d, _ in failed), error=error)
    fallback_s = _seconds(reference, (arrays, ct), ops)
    times = [(_seconds(fused, (arrays, ct), ops), variant, error) for variant, fused, error in passed]
    fallback_s = min(fallback_s, _seconds(reference, (arrays, ct), ops))  # warm-up drift
    kernel_s, variant, error = min(times, key=lambda x: x[0])
    notes = [f"{v} {1e3 * t:.3f} ms" for t, v, _ in times if v is not None]
    notes += [named(v, f"{r}, {d}") for v, r, d, _ in failed]
    faster = kernel_s < fallback_s
    return done(kernel if faster else fallback, "faster" if faster else "slower",
                "; ".join(notes), kernel_s * 1e3, fallback_s * 1e3, error,
                variant if faster else None)
