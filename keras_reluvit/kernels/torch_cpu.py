"""The PyTorch CPU paths of pointwise attention: `torch_tiled` (eager tiles)
and a fused C++ kernel (the dispatch's `torch_fused`: inference, and
training through `trainable_attention`, a C++ backward that recomputes the
scores per tile). (Its 0.1 name `keras_reluvit.torch_fused` is gone in 0.2.)

`torch_tiled`: PyTorch eager, no mask / dropout / weights returned: loops
over (batch * heads, query) tiles so that each score tile stays in cache,
applies the activation in place, and writes into a preallocated output when
no gradient is recorded. XLA fuses the generic path on JAX and TF; eager
PyTorch does not, hence this path.

Eager PyTorch runs `bmm -> relu -> bmm` as three passes over a T x S score
tensor, with BLAS threads that fight the caller's; torch's own softmax SDPA
is a fused C++ loop. This is the same structure for pointwise attention: a
`parallel_for` over (batch, head, query tile); per tile and block of keys,
one BLAS call for the scores `q k^T / sqrt(d)` into a cache-sized buffer,
the activation in place, one BLAS call adding `w v` scaled by `L^-alpha`
straight into the output. Key blocks are combined by that plain sum: no
softmax, no running max, no rescaling. It reads the `(B, T, H,
D)` projections in place (strided BLAS, any token stride: the q / k / v views
of one fused qkv GEMM output too), so there are no transposes or copies
either; the backward likewise.

The C++ source is `keras_reluvit/kernels/csrc/pointwise_attention.cpp` (package
data). Built once with `torch.utils.cpp_extension.load_inline` the first time the
dispatch point chooses this path (never for calls that take another path),
with OpenMP so that `at::parallel_for` really runs on every core (a C++
compiler and ninja are needed; ~1 minute; one line on stderr says so and
where it caches: `$TORCH_EXTENSIONS_DIR`, default
`~/.cache/torch_extensions/<python>_cpu/`), against the MKL BLAS of PyTorch's
x86 CPU builds. Where it cannot be built the dispatch point uses the
`torch_tiled` path instead (a warning says why); `KERAS_RELUVIT_TORCH_FUSED=0`
turns it off. CPU float32 tensors only: CUDA tensors never reach it.

**Build locks.** torch < 2.14 guards a build with a `lock` file and waits,
forever, while it exists, so a build killed half-way used to hang every later one.
We record the building process in `keras_reluvit.owner` next to it: a lock
whose owner is gone (or an unowned lock older than 10 minutes) is removed
with a warning and the build goes on; a lock held by a live process makes
this process use the tiled path (with a warning) instead of waiting.
torch >= 2.14 holds an OS-level advisory lock instead (the file stays, the
kernel releases it when its holder dies): nothing to do there.
"""

import math
import os
import sys
import threading
import time
import warnings

from keras_reluvit.kernels.keras_ops import apply_factor
from keras_reluvit.kernels.switches import setting

NAME = "keras_reluvit_fused_v9"
STALE_UNOWNED_SECONDS = 600

# Activations the kernel computes in its loop (code passed to C++).
ACTIVATIONS = {"relu": 0, "relu2": 1, "relu6": 2, "identity": 3}
TILE_K = 512  # keys per block: K and V blocks of 512 x 64 floats (128 KiB each)


def tile_rows(num_queries):
    """Query rows per tile (as torch's CPU flash attention splits queries)."""
    return 256 if num_queries >= 768 else 128


SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc",
                      "pointwise_attention.cpp")


def source():
    """The kernel's C++ source (package data: keras_reluvit/kernels/csrc/)."""
    with open(SOURCE) as f:
        return f.read()


_lock = threading.Lock()
_state = {}


def build_directory():
    """Where torch builds and caches the extension (`TORCH_EXTENSIONS_DIR`)."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(NAME, False)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _owner(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_lock(directory):
    """Clears a stale torch build lock in `directory`; returns False (after a
    warning) when a live process holds it, True when building may go on."""
    import torch.utils.cpp_extension as cpp

    if hasattr(cpp, "FileLock"):
        # torch >= 2.14 holds an OS-level advisory lock: the file stays after
        # every build, the kernel releases it when its holder dies.
        return True
    lock = os.path.join(directory, "lock")
    owner_file = os.path.join(directory, "keras_reluvit.owner")
    if not os.path.exists(lock):
        return True
    pid = _owner(owner_file)
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return True  # released meanwhile
    if pid == os.getpid() or (pid is not None and not _alive(pid)) or (
            pid is None and age > STALE_UNOWNED_SECONDS):
        for f in (lock, owner_file):
            try:
                os.remove(f)
            except FileNotFoundError:
                pass
        who = f"process {pid}, which is gone" if pid is not None else f"{age:.0f} s ago"
        warnings.warn(f"keras_reluvit: removed a stale PyTorch build lock {lock} (left by {who}, "
                      "a build killed half-way); building again.")
        return True
    warnings.warn(f"keras_reluvit: the fused PyTorch CPU kernel is being built by "
                  f"{'process ' + str(pid) if pid else 'another process'} (lock {lock}); this "
                  "process uses the tiled path instead of waiting.")
    return False


def load():
    """The compiled extension module, or None where it cannot be built or
    is switched off (`configure(torch_fused=False)`,
    `KERAS_RELUVIT_TORCH_FUSED=0`)."""
    if not setting("torch_fused"):
        return None
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            module = None
            try:
                module = _build()
            except Exception as e:  # no compiler, no MKL symbols, ...
                warnings.warn(f"keras_reluvit: the fused PyTorch CPU attention kernel "
                              f"could not be built ({type(e).__name__}: {e}); using the "
                              "tiled path.")
            _state["module"] = module
    return _state["module"]


def _build():
    from torch.utils.cpp_extension import load_inline

    directory = build_directory()
    if not check_lock(directory):
        return None
    if not any(f.endswith(".so") for f in os.listdir(directory)):
        print(f"keras_reluvit: building the fused PyTorch CPU attention kernel once (~1 min) in "
              f"{directory} (KERAS_RELUVIT_TORCH_FUSED=0 skips it)", file=sys.stderr, flush=True)
    owner_file = os.path.join(directory, "keras_reluvit.owner")
    with open(owner_file, "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        return load_inline(NAME, cpp_sources=source(), functions=["pointwise_attention",
                                                                "pointwise_attention_backward"],
                           extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                           verbose=False)
    finally:
        if _owner(owner_file) == os.getpid():
            os.remove(owner_file)


def eligible(query, activation_name):
    """Whether the fused kernel could compute this call (activation, CPU,
    float32); builds nothing."""
    if activation_name not in ACTIVATIONS:
        return False
    return query.device.type == "cpu" and str(query.dtype) == "torch.float32"


def usable(query, activation_name):
    """Whether the fused kernel can compute this call (builds it if needed)."""
    return eligible(query, activation_name) and load() is not None


def _rows(x):
    """`x` itself where the kernel can read it in place (each `D`-vector
    contiguous, vectors at least `D` apart: e.g. the q / k / v views of one
    qkv GEMM output), else a contiguous copy."""
    if x.dim() == 4 and (x.stride(3) == 1 or x.shape[3] == 1) and (
            x.shape[1] == 1 or x.stride(1) >= x.shape[3]):
        return x
    return x.contiguous()


def _module():
    module = load()
    if module is None:
        raise RuntimeError("the fused PyTorch kernel is not available on this machine.")
    return module


def attention(query, key, value, activation_name, out_scale=1.0, tile_q=None, tile_k=TILE_K):
    """`out_scale * sum_j h(q_i . k_j / sqrt(d)) v_j`; `(B, T, H, D)` in and out."""
    module = _module()
    for t in (query, key, value):
        if t.device.type != "cpu":
            raise ValueError(f"the fused kernel runs on the CPU; got a {t.device} tensor.")
    tile_q = tile_q or tile_rows(query.shape[1])
    return module.pointwise_attention(_rows(query), _rows(key), _rows(value),
                                      ACTIVATIONS[activation_name], float(out_scale), int(tile_q),
                                      int(tile_k))


# ------------------------------------------------------------- training --

# Backward tiles: query rows (None: `tile_rows(T)`, as the forward) x keys per
# block; the scores and dS buffers (2 x 256 x 512 floats = 1 MiB at most) and a
# K and V block stay in cache. Measured on a 2-core CPU at L = 197 / 785 / 3137:
# 128 or 256 rows within 2 % of each other, 64 rows 5-9 % slower.
BACKWARD_TILES = (None, TILE_K)


def attention_backward(query, key, value, grad, activation_name, out_scale=1.0, tiles=None):
    """Gradients `(dQ, dK, dV)` of `attention(...)` for the output gradient
    `grad`, all `(B, T, H, D)`: the C++ kernel recomputes the scores per
    (query tile, key block) and computes, with `W = Q K^T / sqrt(d)`,
    `dV = c h(W)^T dO`, `dS = c (dO V^T) * h'(W)`, `dQ = dS K / sqrt(d)`,
    `dK = dS^T Q / sqrt(d)` (`c = out_scale`) as five BLAS calls per block;
    one (batch, head) pair per parallel task."""
    module = _module()
    tile_q, tile_k = tiles or BACKWARD_TILES
    tile_q = tile_q or tile_rows(query.shape[1])
    return tuple(module.pointwise_attention_backward(
        _rows(query), _rows(key), _rows(value), _rows(grad),
        ACTIVATIONS[activation_name], float(out_scale), int(tile_q), int(tile_k)))


def _autograd_function():
    import torch

    class PointwiseAttentionFunction(torch.autograd.Function):
        """Forward: the fused kernel (no T x S tensor kept); backward:
        `attention_backward` (scores recomputed per tile)."""

        @staticmethod
        def forward(ctx, query, key, value, name, out_scale):
            ctx.save_for_backward(query, key, value)
            ctx.name, ctx.out_scale = name, out_scale
            return attention(query, key, value, name, out_scale)

        @staticmethod
        def backward(ctx, grad):
            q, k, v = ctx.saved_tensors
            dq, dk, dv = attention_backward(q, k, v, grad, ctx.name, ctx.out_scale)
            return dq, dk, dv, None, None

    return PointwiseAttentionFunction


_FUNCTION = []


def trainable_attention(query, key, value, activation_name, out_scale=1.0):
    """`attention(...)` that autograd can differentiate (training)."""
    if not _FUNCTION:
        _FUNCTION.append(_autograd_function())
    return _FUNCTION[0].apply(query, key, value, activation_name, float(out_scale))


# --- torch_tiled: PyTorch eager tiles, no compiled kernel ------------------------
_INPLACE = {"relu": "relu_", "sigmoid": "sigmoid_"}
# Score elements per tile of the torch path (~512 KiB of float32: L2-sized).
TILE_ELEMENTS = 2**17


def torch_tiled(query, key, value, activation_name, h, factor, tile_bh=None, tile_q=None):
    """PyTorch eager tiles; `(B, T, H, D)` in and out."""
    import torch

    b, t, nh, d = query.shape
    s, dv = key.shape[1], value.shape[-1]
    if tile_bh is None:
        tile_bh = max(1, TILE_ELEMENTS // (t * s))
    if tile_q is None:
        tile_q = t if tile_bh > 1 else min(t, max(64, TILE_ELEMENTS // s))
    q = (query * (1.0 / math.sqrt(d))).permute(0, 2, 1, 3).reshape(b * nh, t, d)
    kt = key.permute(0, 2, 3, 1).reshape(b * nh, d, s)
    v = value.permute(0, 2, 1, 3).reshape(b * nh, s, dv)
    tile_q = tile_q or t
    inplace = _INPLACE.get(activation_name)
    record = torch.is_grad_enabled() and any(x.requires_grad for x in (q, kt, v))
    out = None if record else torch.empty((b * nh, t, dv), dtype=q.dtype, device=q.device)
    pieces = []
    for j in range(0, b * nh, tile_bh):
        kj, vj = kt[j : j + tile_bh], v[j : j + tile_bh]
        row = []
        for i in range(0, t, tile_q):
            w = torch.bmm(q[j : j + tile_bh, i : i + tile_q], kj)
            w = getattr(w, inplace)() if inplace else h(w)
            if record:
                row.append(torch.bmm(w, vj))
            else:
                torch.bmm(w, vj, out=out[j : j + tile_bh, i : i + tile_q])
        if record:
            pieces.append(torch.cat(row, dim=1) if len(row) > 1 else row[0])
    if record:
        out = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]
    out = out.reshape(b, nh, t, dv).permute(0, 2, 1, 3)
    return apply_factor(out, factor)
