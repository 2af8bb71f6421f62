// The fused CPU kernel of pointwise attention for PyTorch (keras_reluvit/kernels/torch_cpu.py
// explains it); compiled by torch.utils.cpp_extension.load_inline on first use.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*,
                       const float*, const float*, const int*, const float*, const int*,
                       const float*, float*, const int*);
extern "C" int MKL_Set_Num_Threads_Local(int);

// In place over a score buffer: w = act(w) and, given ds, ds *= act'(w) (at the
// old w). Explicit 4-wide SIMD (GCC/Clang vector extensions: SSE2 on x86-64,
// NEON on arm64): gcc does not if-convert these selects itself, and a branch on
// the sign of a score mispredicts half the time (relu backward was ~1.5x
// slower on random-sign scores than on one-signed ones). NaN scores stay NaN.
typedef float f4 __attribute__((vector_size(16)));
typedef int32_t i4 __attribute__((vector_size(16)));

static void activate(int64_t act, float* w, float* ds, int64_t n) {
  if (act == 3) return;  // identity
  const f4 zero = {0.0f, 0.0f, 0.0f, 0.0f}, six = {6.0f, 6.0f, 6.0f, 6.0f};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    f4 x, g = zero;
    std::memcpy(&x, w + j, sizeof(f4));
    if (ds) std::memcpy(&g, ds + j, sizeof(f4));
    const i4 pos = x > zero;
    const i4 keep = pos | (x != x);        // x > 0 or NaN
    const f4 r = (f4)((i4)x & keep);        // max(x, 0), NaN kept
    f4 y;
    if (act == 0) {
      y = r;
      g = (f4)((i4)g & keep);
    } else if (act == 1) {
      y = r * r;
      g = g * (r + r);
    } else {
      const i4 big = x >= six;
      y = (f4)(((i4)r & ~big) | ((i4)six & big));
      g = (f4)((i4)g & pos & ~big);
    }
    std::memcpy(w + j, &y, sizeof(f4));
    if (ds) std::memcpy(ds + j, &g, sizeof(f4));
  }
  for (; j < n; ++j) {
    const float x = w[j];
    const bool on = x > 0.0f || x != x;
    const float r = on ? x : 0.0f;
    float slope = on ? 1.0f : 0.0f;
    if (act == 0) {
      w[j] = r;
    } else if (act == 1) {
      w[j] = r * r;
      slope = r + r;
    } else {
      w[j] = x >= 6.0f ? 6.0f : r;
      slope = x > 0.0f && x < 6.0f ? 1.0f : 0.0f;
    }
    if (ds) ds[j] *= slope;
  }
}

// Row-major C (m x n) = alpha op(A) op(B) + beta C through column-major BLAS.
static inline void gemm_rm(char ta, char tb, int m, int n, int k, float alpha, const float* a,
                           int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// A (B, L, H, D) float32 tensor as BLAS sees it: rows of D contiguous floats,
// `ld` floats apart (a q/k/v view of one qkv GEMM output, or a transposed
// (B, H, L, D) tensor, is read in place: no copies).
struct Rows {
  float* p;
  int64_t sb, sh;
  int ld;
  Rows(const torch::Tensor& t) : p(t.data_ptr<float>()), sb(t.stride(0)), sh(t.stride(2)),
                                 ld(static_cast<int>(t.size(1) == 1
                                    ? std::max(t.stride(1), t.size(3)) : t.stride(1))) {
    // (A length-1 axis may carry any stride; only one row is read there.)
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(t.dim() == 4 && (t.stride(3) == 1 || t.size(3) == 1) && ld >= t.size(3),
                "rows of the last axis must be contiguous and apart by >= its length");
  }
  float* at(int64_t b, int64_t t, int64_t h) const { return p + b * sb + t * ld + h * sh; }
};

// out[b, t, h] = out_scale * sum_s act(q[b, t, h] . k[b, s, h] / sqrt(d)) v[b, s, h]
torch::Tensor pointwise_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                  int64_t act, double out_scale, int64_t tile_q,
                                  int64_t tile_k) {
  const Rows Q(q), K(k), V(v);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t S = k.size(1), dv = v.size(3);
  auto out = torch::empty({B, T, H, dv}, q.options());
  const Rows O(out);
  const int64_t tiles = (T + tile_q - 1) / tile_q;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float oscale = static_cast<float>(out_scale);
  at::parallel_for(0, B * H * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(tile_q * tile_k);
    const int saved = MKL_Set_Num_Threads_Local(1);  // this worker's BLAS: one thread
    const int id = d, idv = dv;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bh = i / tiles, b = bh / H, h = bh % H, start = (i % tiles) * tile_q;
      const int rows = static_cast<int>(std::min(tile_q, T - start));
      const float* qi = Q.at(b, start, h);
      float* oi = O.at(b, start, h);
      float* wp = w.data();
      // Key blocks: partial outputs are simply summed into the output (no running
      // max, no rescaling), so each block of K and V stays in cache.
      for (int64_t k0 = 0; k0 < S; k0 += tile_k) {
        const int cols = static_cast<int>(std::min(tile_k, S - k0));
        const float* kb = K.at(b, k0, h);
        const float* vb = V.at(b, k0, h);
        // W = Q K^T / sqrt(d) (rows x cols); O (+)= out_scale act(W) V (rows x dv).
        gemm_rm('N', 'T', rows, cols, id, scale, qi, Q.ld, kb, K.ld, 0.0f, wp, cols);
        activate(act, wp, nullptr, static_cast<int64_t>(rows) * cols);
        gemm_rm('N', 'N', rows, idv, cols, oscale, wp, cols, vb, V.ld, k0 == 0 ? 0.0f : 1.0f,
                oi, O.ld);
      }
    }
    MKL_Set_Num_Threads_Local(saved);
  });
  return out;
}

// Gradients of out = out_scale * sum_s act(q . k_s / sqrt(d)) v_s for (B, T, H, D)
// tensors, the scores recomputed per (query tile, key block) in cache-sized buffers.
// One (batch, head) pair per task, so that the pair's dK and dV are accumulated by
// one thread, straight into the outputs.
std::vector<torch::Tensor> pointwise_attention_backward(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor go, int64_t act,
    double out_scale, int64_t tile_q, int64_t tile_k) {
  const Rows Q(q), K(k), V(v), G(go);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t S = k.size(1), dv = v.size(3);
  auto dq = torch::empty({B, T, H, d}, q.options());
  auto dk = torch::empty({B, S, H, d}, q.options());
  auto dvt = torch::empty({B, S, H, dv}, q.options());
  const Rows DQ(dq), DK(dk), DV(dvt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float c = static_cast<float>(out_scale);
  const int id = d, idv = dv;
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(tile_q * tile_k), dp(tile_q * tile_k);
    const int saved = MKL_Set_Num_Threads_Local(1);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t t0 = 0; t0 < T; t0 += tile_q) {
        const int rows = static_cast<int>(std::min(tile_q, T - t0));
        const float *qi = Q.at(b, t0, h), *gi = G.at(b, t0, h);
        float* dqi = DQ.at(b, t0, h);
        for (int64_t k0 = 0; k0 < S; k0 += tile_k) {
          const int cols = static_cast<int>(std::min(tile_k, S - k0));
          const float *kb = K.at(b, k0, h), *vb = V.at(b, k0, h);
          float *dkb = DK.at(b, k0, h), *dvb = DV.at(b, k0, h);
          float *wp = w.data(), *dpp = dp.data();
          // W = Q K^T / sqrt(d); dP = c dO V^T   (rows x cols)
          gemm_rm('N', 'T', rows, cols, id, scale, qi, Q.ld, kb, K.ld, 0.0f, wp, cols);
          gemm_rm('N', 'T', rows, cols, idv, c, gi, G.ld, vb, V.ld, 0.0f, dpp, cols);
          // dS = dP * act'(W); W = act(W)
          activate(act, wp, dpp, static_cast<int64_t>(rows) * cols);
          const float first_q = t0 == 0 ? 0.0f : 1.0f, first_k = k0 == 0 ? 0.0f : 1.0f;
          // dV_j (+)= c act(W)^T dO_i; dQ_i (+)= dS K_j / sqrt(d); dK_j (+)= dS^T Q_i / sqrt(d)
          gemm_rm('T', 'N', cols, idv, rows, c, wp, cols, gi, G.ld, first_q, dvb, DV.ld);
          gemm_rm('N', 'N', rows, id, cols, scale, dpp, cols, kb, K.ld, first_k, dqi, DQ.ld);
          gemm_rm('T', 'N', cols, id, rows, scale, dpp, cols, qi, Q.ld, first_q, dkb, DK.ld);
        }
      }
    }
    MKL_Set_Num_Threads_Local(saved);
  });
  return {dq, dk, dvt};
}
