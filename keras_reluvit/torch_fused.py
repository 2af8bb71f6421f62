"""A fused CPU kernel of pointwise attention for PyTorch (inference, and
training through `trainable_attention`: a tiled backward that recomputes the
scores).

Eager PyTorch runs `bmm -> relu -> bmm` as three passes over a T x S score
tensor, with BLAS threads that fight the caller's; torch's own softmax SDPA
is a fused C++ loop. This is the same structure for pointwise attention: a
`parallel_for` over (batch, head, query tile); per tile and block of keys,
one BLAS call for the scores `q k^T / sqrt(d)` into a cache-sized buffer,
the activation in place, one BLAS call adding `w v` scaled by `L^-alpha`
straight into the output. Key blocks are combined by that plain sum: no
softmax, no running max, no rescaling. It reads the `(B, T, H,
D)` projections in place (strided BLAS), so there are no transposes either.

Built once with `torch.utils.cpp_extension.load_inline` the first time the
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

import os
import sys
import threading
import time
import warnings

NAME = "keras_reluvit_fused_v3"
STALE_UNOWNED_SECONDS = 600

# Activations the kernel computes in its loop (code passed to C++).
ACTIVATIONS = {"relu": 0, "relu2": 1, "relu6": 2, "identity": 3}
TILE_K = 512  # keys per block: K and V blocks of 512 x 64 floats (128 KiB each)


def tile_rows(num_queries):
    """Query rows per tile (as torch's CPU flash attention splits queries)."""
    return 256 if num_queries >= 768 else 128

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*,
                       const float*, const float*, const int*, const float*, const int*,
                       const float*, float*, const int*);
extern "C" int MKL_Set_Num_Threads_Local(int);

// out[b, t, h] = out_scale * sum_s act(q[b, t, h] . k[b, s, h] / sqrt(d)) v[b, s, h]
torch::Tensor pointwise_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                  int64_t act, double out_scale, int64_t tile_q,
                                  int64_t tile_k) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
              v.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "contiguous only");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t S = k.size(1), dv = v.size(3);
  auto out = torch::empty({B, T, H, dv}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t tiles = (T + tile_q - 1) / tile_q;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float oscale = static_cast<float>(out_scale);
  at::parallel_for(0, B * H * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(tile_q * tile_k);
    const int saved = MKL_Set_Num_Threads_Local(1);  // this worker's BLAS: one thread
    const int id = d, idv = dv, lq = H * d, lv = H * dv;
    const float zero = 0.0f, one = 1.0f;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bh = i / tiles, b = bh / H, h = bh % H, start = (i % tiles) * tile_q;
      const int rows = static_cast<int>(std::min(tile_q, T - start));
      const float* qi = qp + ((b * T + start) * H + h) * d;
      float* oi = op + ((b * T + start) * H + h) * dv;
      float* wp = w.data();
      // Key blocks: partial outputs are simply summed into the output (no running
      // max, no rescaling), so each block of K and V stays in cache.
      for (int64_t k0 = 0; k0 < S; k0 += tile_k) {
        const int cols = static_cast<int>(std::min(tile_k, S - k0));
        const float* kb = kp + ((b * S + k0) * H + h) * d;
        const float* vb = vp + ((b * S + k0) * H + h) * dv;
        // Column-major BLAS on row-major data: W^T (cols x rows) = K (d x cols)^T Q^T (d x rows).
        sgemm_("T", "N", &cols, &rows, &id, &scale, kb, &lq, qi, &lq, &zero, wp, &cols);
        const int64_t n = static_cast<int64_t>(rows) * cols;
        if (act == 0) {
          for (int64_t j = 0; j < n; ++j) wp[j] = wp[j] > 0.0f ? wp[j] : 0.0f;
        } else if (act == 1) {
          for (int64_t j = 0; j < n; ++j) wp[j] = wp[j] > 0.0f ? wp[j] * wp[j] : 0.0f;
        } else if (act == 2) {
          for (int64_t j = 0; j < n; ++j) wp[j] = std::min(std::max(wp[j], 0.0f), 6.0f);
        }
        // O^T (dv x rows) (+)= out_scale * V^T (dv x cols) W^T (cols x rows).
        sgemm_("N", "N", &idv, &rows, &cols, &oscale, vb, &lv, wp, &cols,
               k0 == 0 ? &zero : &one, oi, &lv);
      }
    }
    MKL_Set_Num_Threads_Local(saved);
  });
  return out;
}
"""

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
    """The compiled extension module, or None where it cannot be built."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            module = None
            if os.environ.get("KERAS_RELUVIT_TORCH_FUSED", "1") != "0":
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
        return load_inline(NAME, cpp_sources=_SOURCE, functions=["pointwise_attention"],
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


def attention(query, key, value, activation_name, out_scale=1.0, tile_q=None, tile_k=TILE_K):
    """`out_scale * sum_j h(q_i . k_j / sqrt(d)) v_j`; `(B, T, H, D)` in and out."""
    module = load()
    if module is None:
        raise RuntimeError("the fused PyTorch kernel is not available on this machine.")
    for t in (query, key, value):
        if t.device.type != "cpu":
            raise ValueError(f"the fused kernel runs on the CPU; got a {t.device} tensor.")
    tile_q = tile_q or tile_rows(query.shape[1])
    return module.pointwise_attention(query.contiguous(), key.contiguous(), value.contiguous(),
                                      ACTIVATIONS[activation_name], float(out_scale), int(tile_q),
                                      int(tile_k))


# ------------------------------------------------------------- training --

# Score elements per backward tile (batch x head pairs x queries): 1 Mi floats
# (4 MiB; measured best of 2^16 ... 2^22 at L = 785 on a 2-core CPU).
GRAD_TILE_ELEMENTS = 2**20


def _h_and_slope(s, name):
    """`h(s)` and `h'(s)` for the kernel's activations."""
    if name == "relu":
        return s.clamp_min(0.0), (s > 0).to(s.dtype)
    if name == "relu2":
        r = s.clamp_min(0.0)
        return r * r, 2.0 * r
    if name == "relu6":
        return s.clamp(0.0, 6.0), ((s > 0) & (s < 6)).to(s.dtype)
    if name == "identity":
        return s, None
    raise KeyError(name)


def _attention_backward(q, k, v, grad, name, out_scale):
    """Gradients of `out_scale * sum_j h(q_i . k_j / sqrt(d)) v_j` for
    `(B, T, H, D)` inputs: the scores recomputed per query tile (never the
    whole T x S), as blocked GEMMs over all (batch, head) pairs:
    `dV = c h(S)^T dO`, `dS = c (dO V^T) * h'(S)`, `dQ = dS K / sqrt(d)`,
    `dK = dS^T Q / sqrt(d)`."""
    import torch

    b, t, nh, d = q.shape
    s = k.shape[1]
    sigma = d ** -0.5
    as_bh = lambda x: x.permute(0, 2, 1, 3).reshape(b * nh, x.shape[1], x.shape[3])
    qs, kk, vv = as_bh(q) * sigma, as_bh(k), as_bh(v)
    go = as_bh(grad) * out_scale
    dq, dk, dv = torch.empty_like(qs), torch.zeros_like(kk), torch.zeros_like(vv)
    # Tiles of (batch x head) pairs and queries holding ~GRAD_TILE_ELEMENTS scores.
    tile_bh = max(1, GRAD_TILE_ELEMENTS // (t * s))
    tile_q = t if tile_bh > 1 else max(1, min(t, GRAD_TILE_ELEMENTS // s))
    kt, vt = kk.transpose(1, 2), vv.transpose(1, 2)
    for j in range(0, b * nh, tile_bh):
        J = slice(j, j + tile_bh)
        for i in range(0, t, tile_q):
            I = slice(i, i + tile_q)
            qi, gi = qs[J, I], go[J, I]
            scores = torch.bmm(qi, kt[J])
            weights, slope = _h_and_slope(scores, name)
            dv[J].baddbmm_(weights.transpose(1, 2), gi)
            ds = torch.bmm(gi, vt[J])
            if slope is not None:
                ds.mul_(slope)
            torch.bmm(ds, kk[J], out=dq[J, I])
            dk[J].baddbmm_(ds.transpose(1, 2), qi)
    back = lambda x, n: x.reshape(b, nh, n, x.shape[-1]).permute(0, 2, 1, 3)
    return back(dq * sigma, t), back(dk, s), back(dv, s)


def _autograd_function():
    import torch

    class PointwiseAttentionFunction(torch.autograd.Function):
        """Forward: the fused kernel (no T x S tensor kept); backward:
        `_attention_backward` (scores recomputed per tile)."""

        @staticmethod
        def forward(ctx, query, key, value, name, out_scale):
            ctx.save_for_backward(query, key, value)
            ctx.name, ctx.out_scale = name, out_scale
            return attention(query, key, value, name, out_scale)

        @staticmethod
        def backward(ctx, grad):
            q, k, v = ctx.saved_tensors
            dq, dk, dv = _attention_backward(q, k, v, grad, ctx.name, ctx.out_scale)
            return dq, dk, dv, None, None

    return PointwiseAttentionFunction


_FUNCTION = []


def trainable_attention(query, key, value, activation_name, out_scale=1.0):
    """`attention(...)` that autograd can differentiate (training)."""
    if not _FUNCTION:
        _FUNCTION.append(_autograd_function())
    return _FUNCTION[0].apply(query, key, value, activation_name, float(out_scale))
