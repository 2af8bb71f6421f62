"""A fused CPU kernel of pointwise attention for PyTorch inference.

Eager PyTorch runs `bmm -> relu -> bmm` as three passes over a T x S score
tensor, with BLAS threads that fight the caller's; torch's own softmax SDPA
is a fused C++ loop. This is the same structure for pointwise attention: a
`parallel_for` over (batch, head, query tile); per tile and block of keys,
one BLAS call for the scores `q k^T / sqrt(d)` into a cache-sized buffer,
the activation in place, one BLAS call adding `w v` scaled by `L^-alpha`
straight into the output. Key blocks are combined by that plain sum: no
softmax, no running max, no rescaling. It reads the `(B, T, H,
D)` projections in place (strided BLAS), so there are no transposes either.

Built once with `torch.utils.cpp_extension.load_inline` on first use, with
OpenMP so that `at::parallel_for` really runs on every core (a C++ compiler
and ninja are needed; ~1 minute, cached under
`~/.cache/torch_extensions`), against the MKL BLAS of PyTorch's x86 CPU
builds. Where it cannot be built the dispatch point uses the `torch_tiled`
path instead (a warning says why); `KERAS_RELUVIT_TORCH_FUSED=0` turns it off.
"""

import os
import threading
import warnings

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


def load():
    """The compiled extension module, or None where it cannot be built."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            module = None
            if os.environ.get("KERAS_RELUVIT_TORCH_FUSED", "1") != "0":
                try:
                    from torch.utils.cpp_extension import load_inline

                    module = load_inline("keras_reluvit_fused_v3", cpp_sources=_SOURCE,
                                         functions=["pointwise_attention"],
                                         extra_cflags=["-O3", "-fopenmp"],
                                         extra_ldflags=["-fopenmp"], verbose=False)
                except Exception as e:  # no compiler, no MKL symbols, ...
                    warnings.warn(f"keras_reluvit: the fused PyTorch CPU attention kernel "
                                  f"could not be built ({type(e).__name__}: {e}); using the "
                                  "tiled path.")
            _state["module"] = module
    return _state["module"]


def usable(query, activation_name):
    """Whether the fused kernel can compute this call (and is built)."""
    if activation_name not in ACTIVATIONS:
        return False
    if query.device.type != "cpu" or str(query.dtype) != "torch.float32":
        return False
    return load() is not None


def attention(query, key, value, activation_name, out_scale=1.0, tile_q=None, tile_k=TILE_K):
    """`out_scale * sum_j h(q_i . k_j / sqrt(d)) v_j`; `(B, T, H, D)` in and out."""
    module = load()
    if module is None:
        raise RuntimeError("the fused PyTorch kernel is not available on this machine.")
    tile_q = tile_q or tile_rows(query.shape[1])
    return module.pointwise_attention(query.contiguous(), key.contiguous(), value.contiguous(),
                                      ACTIVATIONS[activation_name], float(out_scale), int(tile_q),
                                      int(tile_k))
