"""Fused pointwise attention for PyTorch on CUDA: Triton kernels.

The same algorithm as `keras_reluvit.kernels.pallas` (read its docstring):
one program per (query block, batch x head) loops over key blocks, computes
the score tile, `h`, the mask and `w v` on chip and sums the blocks' partial
outputs in float32 (no running max, no rescaling); the row factor
`r_i = exp(s_h) * L_i^-alpha` multiplies the accumulator once at the end.
Two dots per tile.

The backward pass, as FlashAttention-2's: one program per key block loops
over the query blocks, recomputes the scores *transposed* (`s^T = k q^T`:
no register tile is ever transposed), accumulates dK and dV on chip and adds
each query block's share of dQ atomically into a float32 buffer -- five dots
per tile; a short epilogue kernel casts dQ and computes the row factor's
gradient `sum_d dO * O / r`. `deterministic=True` (or PyTorch's
`torch.use_deterministic_algorithms`) takes the two-kernel path instead
(dK/dV, then dQ recomputing the scores: 4 + 3 dots, no atomics, bitwise
reproducible). Wrapped in a `torch.autograd.Function`.

Per tile, only what a tile needs: bounds masks on the last (partial) block
only, since zero-filled loads make every out-of-range key and query add
nothing (k = v = 0, q = dO = 0), so only the user's mask takes a `where`; a
key-padding mask is read as a vector; the score scale `1 / sqrt(d)` folds
into the epilogue for positively homogeneous `h` (relu, relu2, identity:
`h(c s) = c^p h(s)`) and is one multiply per score otherwise; a constant row
factor is a scalar argument (nothing allocated per call). Batch and head
offsets are 64-bit (a fused qkv view at B = 297, L = 3137 passes 2^31
elements). On a GPU the tiles, warps and pipeline stages are tuned per
shape over small spaces (`CONFIGS`) whose every entry compiles for sm_90a
without register spills (tests/once/test_accelerator_build.py prints the
table).

The kernels read the layer's `(B, T, H, D)` projections in place at any
batch / token / head stride (the q/k/v views of one fused qkv GEMM output
too), as long as the head dim is contiguous; token counts need not be a
multiple of the block. Head dims are padded to a power of two inside the
kernel (masked loads).

float32 inputs use TF32 tensor cores only where PyTorch's own matmuls may
(`torch.backends.cuda.matmul.allow_tf32 = True`), IEEE float32 otherwise --
exact, but on the FMA units, with register spills (see `CONFIGS`): for
speed, train in bfloat16 or allow TF32.

On a machine without a GPU the kernels run in Triton's interpreter on CPU
tensors when `TRITON_INTERPRET=1` is set before Triton is imported (that is
how the test suite checks them), and `kernels.inspection.compile_for`
compiles them ahead of time for a CUDA target (e.g. sm_90a), as launched,
with Triton's own compiler.
"""

import math

import triton
import triton.language as tl

# Activation codes the kernels take (a constexpr: one compiled variant each).
ACTIVATIONS = {"relu": 0, "relu2": 1, "relu6": 2, "identity": 3, "sigmoid": 4, "gelu": 5,
               "softplus": 6}
# Positively homogeneous activations, h(c s) = c^p h(s) for c > 0: their
# score scale is applied once per output row instead of once per score.
HOMOGENEOUS = {"relu": 1, "relu2": 2, "identity": 1}


def interpreting():
    """Whether these kernels were defined under TRITON_INTERPRET=1."""
    return not isinstance(_forward_kernel, triton.runtime.JITFunction)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _act(s, ACT: tl.constexpr):
    if ACT == 0:
        w = tl.maximum(s, 0.0)
    elif ACT == 1:
        w = tl.maximum(s, 0.0)
        w = w * w
    elif ACT == 2:
        w = tl.minimum(tl.maximum(s, 0.0), 6.0)
    elif ACT == 3:
        w = s
    elif ACT == 4:
        w = tl.sigmoid(s)
    elif ACT == 5:
        w = 0.5 * s * (1.0 + _tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)))
    else:
        w = tl.maximum(s, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(s)))
    return w


@triton.jit
def _act_grad(s, ACT: tl.constexpr):
    if ACT == 0:
        g = tl.where(s > 0.0, 1.0, 0.0)
    elif ACT == 1:
        g = 2.0 * tl.maximum(s, 0.0)
    elif ACT == 2:
        g = tl.where((s > 0.0) & (s < 6.0), 1.0, 0.0)
    elif ACT == 3:
        g = s * 0.0 + 1.0
    elif ACT == 4:
        sg = tl.sigmoid(s)
        g = sg * (1.0 - sg)
    elif ACT == 5:
        t = _tanh(0.7978845608028654 * (s + 0.044715 * s * s * s))
        g = 0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * 0.7978845608028654 * (
            1.0 + 0.134145 * s * s)
    else:
        g = tl.sigmoid(s)
    return g


@triton.jit
def _mm(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """`a @ b (+ acc)` in float32. UPCAST: Triton's CPU interpreter multiplies
    bfloat16 wrongly (3.9); the products of bfloat16 values are exact in
    float32, so upcasting gives what a GPU's bfloat16 tensor cores compute."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)


@triton.jit
def _low(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """`x.to(dtype)` for a dot operand. Under UPCAST (the interpreter with
    bfloat16) it rounds to nearest even first: the interpreter converts by
    truncation, a GPU to nearest; truncation biases sums of many products."""
    if UPCAST:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _load(P, base, rows, n_rows, s_t, cols, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The (rows x cols) tile at `P + base`, zeros past the ends; the bounds
    masks only where asked (ROWS: a last, partial block; COLS: a head dim
    below its power of two)."""
    ptrs = P + base + rows[:, None] * s_t + cols[None, :]
    if ROWS and COLS:
        x = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :], other=0.0)
    elif ROWS:
        x = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    elif COLS:
        x = tl.load(ptrs, mask=(cols < n_cols)[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _store(P, x, base, rows, n_rows, s_t, cols, n_cols, COLS: tl.constexpr,
           UPCAST: tl.constexpr):
    # Rounded to nearest as a GPU converts (the interpreter truncates).
    ptrs = P + base + rows[:, None] * s_t + cols[None, :]
    x = _low(x, P.dtype.element_ty, UPCAST)
    if COLS:
        tl.store(ptrs, x.to(P.dtype.element_ty),
                 mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :])
    else:
        tl.store(ptrs, x.to(P.dtype.element_ty), mask=(rows < n_rows)[:, None])


@triton.jit
def _row_values(R, base, rows, n_rows, s_t, LAST: tl.constexpr):
    """Row factors of a block of query rows (1 past the end)."""
    if LAST:
        r = tl.load(R + base + rows * s_t, mask=rows < n_rows, other=1.0)
    else:
        r = tl.load(R + base + rows * s_t)
    return r


@triton.jit
def _attend(M, base, rq, T, sm_t, rk, S, sm_s, MASK: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """The attend mask of a tile, (queries x keys), or (keys x queries) with
    KEYS_FIRST. MASK 1: one row of keys per batch element (key padding),
    read as a vector; 2: a general (T x S) mask."""
    if MASK == 1:
        m = tl.load(M + base + rk * sm_s, mask=rk < S, other=0) != 0
        if KEYS_FIRST:
            valid = m[:, None] & (rq >= 0)[None, :]
        else:
            valid = (rq >= 0)[:, None] & m[None, :]
    elif KEYS_FIRST:
        valid = tl.load(M + base + rk[:, None] * sm_s + rq[None, :] * sm_t,
                        mask=(rk < S)[:, None] & (rq < T)[None, :], other=0) != 0
    else:
        valid = tl.load(M + base + rq[:, None] * sm_t + rk[None, :] * sm_s,
                        mask=(rq < T)[:, None] & (rk < S)[None, :], other=0) != 0
    return valid


@triton.jit
def _batch_head(H):
    """This program's batch element and head, as 64-bit integers: offsets
    `b * stride_b` pass 2^31 elements on large inputs."""
    return (tl.program_id(1) // H).to(tl.int64), (tl.program_id(1) % H).to(tl.int64)


# Zero-filled loads make bounds masks on the scores unnecessary: a key past
# the end has k = 0 and v = 0, so whatever h(0) is it adds nothing to any
# output or gradient; a query row past the end has q = 0 and dO = 0 and is
# never stored. Only the user's mask needs a `where`.
@triton.jit
def _forward_block(acc, q, K, V, M, k_base, v_base, m_base, sk_s, sv_s, sm_t, sm_s, rq, T, rk,
                   S, rd, D, rdv, DV, scale, ACT: tl.constexpr, POW: tl.constexpr,
                   MASK: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr, PAD_D: tl.constexpr,
                   PAD_DV: tl.constexpr, LAST: tl.constexpr):
    k = _load(K, k_base, rk, S, sk_s, rd, D, LAST, PAD_D)
    v = _load(V, v_base, rk, S, sv_s, rdv, DV, LAST, PAD_DV)
    s = _mm(q, tl.trans(k), None, PRECISION, UPCAST)
    if POW == 0:  # else h(c s) = c^POW h(s): the scale is folded into the epilogue
        s = s * scale
    w = _act(s, ACT)
    if MASK != 0:
        w = tl.where(_attend(M, m_base, rq, T, sm_t, rk, S, sm_s, MASK, False), w, 0.0)
    return _mm(_low(w, v.dtype, UPCAST), v, acc, PRECISION, UPCAST)


@triton.jit
def _forward_kernel(Q, K, V, R, M, O,
                    sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                    so_b, so_t, so_h, sr_b, sr_t, sr_h, sm_b, sm_t, sm_s,
                    H, T, S, D, DV, scale, o_fold, g_fold,
                    ACT: tl.constexpr, POW: tl.constexpr, MASK: tl.constexpr,
                    ROW: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                    PAD_D: tl.constexpr,
                    PAD_DV: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # One program per (query block, batch x head): query blocks vary fastest,
    # so programs running together share their K and V in L2.
    b, h = _batch_head(H)
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    q = _load(Q, b * sq_b + h * sq_h, rq, T, sq_t, rd, D, True, PAD_D)
    k_base, v_base, m_base = b * sk_b + h * sk_h, b * sv_b + h * sv_h, b * sm_b
    acc = tl.zeros((BLOCK_Q, BLOCK_DV), dtype=tl.float32)
    full = S - S % BLOCK_K
    for start in range(0, full, BLOCK_K):
        acc = _forward_block(acc, q, K, V, M, k_base, v_base, m_base, sk_s, sv_s, sm_t, sm_s,
                             rq, T, start + tl.arange(0, BLOCK_K), S, rd, D, rdv, DV, scale, ACT,
                             POW, MASK, PRECISION, UPCAST, PAD_D, PAD_DV, False)
    if full < S:
        acc = _forward_block(acc, q, K, V, M, k_base, v_base, m_base, sk_s, sv_s, sm_t, sm_s,
                             rq, T, full + tl.arange(0, BLOCK_K), S, rd, D, rdv, DV, scale, ACT,
                             POW, MASK, PRECISION, UPCAST, PAD_D, PAD_DV, True)
    if ROW:
        acc = acc * (_row_values(R, b * sr_b + h * sr_h, rq, T, sr_t, True) * o_fold)[:, None]
    else:
        acc = acc * o_fold
    _store(O, acc, b * so_b + h * so_h, rq, T, so_t, rdv, DV, PAD_DV, UPCAST)


@triton.jit
def _backward_block(dk, dv, k, v, Q, DO, R, M, DQ, q_base, o_base, r_base, m_base, dq_base,
                    sq_t, so_t, sr_t, sm_t, sm_s, rq, T, rk, S, rd, D, rdv, DV, scale,
                    ACT: tl.constexpr, POW: tl.constexpr, MASK: tl.constexpr,
                    ROW: tl.constexpr,
                    FUSE_DQ: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                    PAD_D: tl.constexpr, PAD_DV: tl.constexpr, LAST: tl.constexpr):
    # Keys first: the transposed products come straight out of the dots
    # (s^T = k q^T, dP^T = v (r dO)^T), never a transposed register tile.
    q = _load(Q, q_base, rq, T, sq_t, rd, D, LAST, PAD_D)
    do = _load(DO, o_base, rq, T, so_t, rdv, DV, LAST, PAD_DV)
    if ROW:
        do = do.to(tl.float32) * _row_values(R, r_base, rq, T, sr_t, LAST)[:, None]
    do = _low(do, q.dtype, UPCAST)
    s = _mm(k, tl.trans(q), None, PRECISION, UPCAST)             # 1: (keys, queries)
    if POW == 0:
        s = s * scale
    w = _act(s, ACT)
    g = _act_grad(s, ACT)
    if MASK != 0:
        valid = _attend(M, m_base, rq, T, sm_t, rk, S, sm_s, MASK, True)
        w = tl.where(valid, w, 0.0)
        g = tl.where(valid, g, 0.0)
    dv = _mm(_low(w, q.dtype, UPCAST), do, dv, PRECISION, UPCAST)  # 2
    ds = _mm(v, tl.trans(do), None, PRECISION, UPCAST) * g        # 3
    ds = _low(ds, q.dtype, UPCAST)
    dk = _mm(ds, q, dk, PRECISION, UPCAST)                         # 4
    if FUSE_DQ:  # 5: dQ^T += k^T dS^T, into float32 (B, H, BLOCK_D, T)
        dq = _mm(tl.trans(k), ds, None, PRECISION, UPCAST)
        ptrs = DQ + dq_base + rd[:, None] * T + rq[None, :]
        if LAST:
            tl.atomic_add(ptrs, dq, mask=(rq < T)[None, :], sem="relaxed")
        else:
            tl.atomic_add(ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _backward_kernel(Q, K, V, R, M, DO, DQ, DK, DV_,
                     sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                     so_b, so_t, so_h, sr_b, sr_t, sr_h, sm_b, sm_t, sm_s,
                     sdk_b, sdk_s, sdk_h, sdv_b, sdv_s, sdv_h,
                     H, T, S, D, DV, scale, o_fold, g_fold,
                     ACT: tl.constexpr, POW: tl.constexpr, MASK: tl.constexpr,
                     ROW: tl.constexpr, FUSE_DQ: tl.constexpr, PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
                     BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_DV: tl.constexpr):
    # dK and dV of one key block over all query blocks, and (FUSE_DQ) each
    # query block's share of dQ added atomically: 5 dots per tile, as FA2.
    b, h = _batch_head(H)
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    k = _load(K, b * sk_b + h * sk_h, rk, S, sk_s, rd, D, True, PAD_D)
    v = _load(V, b * sv_b + h * sv_h, rk, S, sv_s, rdv, DV, True, PAD_DV)
    q_base, o_base, r_base = b * sq_b + h * sq_h, b * so_b + h * so_h, b * sr_b + h * sr_h
    dq_base = (b * H + h) * BLOCK_D * T
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_DV), dtype=tl.float32)
    full = T - T % BLOCK_Q
    for start in range(0, full, BLOCK_Q):
        dk, dv = _backward_block(dk, dv, k, v, Q, DO, R, M, DQ, q_base, o_base, r_base,
                                 b * sm_b, dq_base, sq_t, so_t, sr_t, sm_t, sm_s,
                                 start + tl.arange(0, BLOCK_Q), T, rk, S, rd, D, rdv, DV, scale,
                                 ACT, POW, MASK, ROW, FUSE_DQ, PRECISION, UPCAST, PAD_D, PAD_DV,
                                 False)
    if full < T:
        dk, dv = _backward_block(dk, dv, k, v, Q, DO, R, M, DQ, q_base, o_base, r_base,
                                 b * sm_b, dq_base, sq_t, so_t, sr_t, sm_t, sm_s,
                                 full + tl.arange(0, BLOCK_Q), T, rk, S, rd, D, rdv, DV, scale,
                                 ACT, POW, MASK, ROW, FUSE_DQ, PRECISION, UPCAST, PAD_D, PAD_DV,
                                 True)
    dk = dk * g_fold  # the score scale (and a constant row factor): once, not per tile
    dv = dv * o_fold
    _store(DK, dk, b * sdk_b + h * sdk_h, rk, S, sdk_s, rd, D, PAD_D, UPCAST)
    _store(DV_, dv, b * sdv_b + h * sdv_h, rk, S, sdv_s, rdv, DV, PAD_DV, UPCAST)


@triton.jit
def _row_gradient(DO, O, R, DR, o_base, so_t, r_base, sr_t, dr_base, sdr_t, rq, T, rdv, DV,
                  PAD_DV: tl.constexpr):
    """`dr = sum_d dO * O / r` (o = r u, so dr = sum_d dO u) for a block of
    query rows: the row factor's gradient, in the epilogue of a dQ kernel."""
    do = _load(DO, o_base, rq, T, so_t, rdv, DV, True, PAD_DV).to(tl.float32)
    o = _load(O, o_base, rq, T, so_t, rdv, DV, True, PAD_DV).to(tl.float32)
    dr = tl.sum(do * o, axis=1) / _row_values(R, r_base, rq, T, sr_t, True)
    tl.store(DR + dr_base + rq * sdr_t, dr, mask=rq < T)


@triton.jit
def _dq_rows_kernel(DQA, DO, O, R, DQ, DR,
                    so_b, so_t, so_h, sr_b, sr_t, sr_h, sdq_b, sdq_t, sdq_h,
                    sdr_b, sdr_t, sdr_h, H, T, D, DV, g_fold, NEED_DR: tl.constexpr,
                    UPCAST: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # After the fused backward: dQ from its float32 (B, H, BLOCK_D, T)
    # accumulator, scaled and cast into (B, T, H, D), and the row factor's
    # gradient; one pass over the rows.
    b, h = _batch_head(H)
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    acc = tl.load(DQA + (b * H + h) * BLOCK_D * T + rq[:, None] + rd[None, :] * T,
                  mask=(rq < T)[:, None], other=0.0)
    _store(DQ, acc * g_fold, b * sdq_b + h * sdq_h, rq, T, sdq_t, rd, D, PAD_D, UPCAST)
    if NEED_DR:
        _row_gradient(DO, O, R, DR, b * so_b + h * so_h, so_t, b * sr_b + h * sr_h, sr_t,
                      b * sdr_b + h * sdr_h, sdr_t, rq, T, tl.arange(0, BLOCK_DV), DV, PAD_DV)


@triton.jit
def _dq_block(dq, q, do, K, V, M, k_base, v_base, m_base, sk_s, sv_s, sm_t, sm_s, rq, T, rk,
              S, rd, D, rdv, DV, scale, ACT: tl.constexpr, POW: tl.constexpr,
              MASK: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr, PAD_D: tl.constexpr,
              PAD_DV: tl.constexpr, LAST: tl.constexpr):
    k = _load(K, k_base, rk, S, sk_s, rd, D, LAST, PAD_D)
    v = _load(V, v_base, rk, S, sv_s, rdv, DV, LAST, PAD_DV)
    s = _mm(q, tl.trans(k), None, PRECISION, UPCAST)
    if POW == 0:
        s = s * scale
    g = _act_grad(s, ACT)
    if MASK != 0:
        g = tl.where(_attend(M, m_base, rq, T, sm_t, rk, S, sm_s, MASK, False), g, 0.0)
    ds = _mm(do, tl.trans(v), None, PRECISION, UPCAST) * g
    return _mm(_low(ds, q.dtype, UPCAST), k, dq, PRECISION, UPCAST)


@triton.jit
def _dq_kernel(Q, K, V, R, M, DO, O, DQ, DR,
               sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
               so_b, so_t, so_h, sr_b, sr_t, sr_h, sm_b, sm_t, sm_s,
               sdq_b, sdq_t, sdq_h, sdr_b, sdr_t, sdr_h,
               H, T, S, D, DV, scale, o_fold, g_fold,
               ACT: tl.constexpr, POW: tl.constexpr, MASK: tl.constexpr,
               ROW: tl.constexpr, NEED_DR: tl.constexpr, PRECISION: tl.constexpr,
               UPCAST: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
               BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_DV: tl.constexpr):
    # The deterministic path's dQ (no atomics: bitwise reproducible): one
    # query block over all key blocks, recomputing the scores; 3 dots.
    b, h = _batch_head(H)
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    q = _load(Q, b * sq_b + h * sq_h, rq, T, sq_t, rd, D, True, PAD_D)
    do = _load(DO, b * so_b + h * so_h, rq, T, so_t, rdv, DV, True, PAD_DV)
    if ROW:
        do = do.to(tl.float32) * _row_values(R, b * sr_b + h * sr_h, rq, T, sr_t, True)[:, None]
    do = _low(do, q.dtype, UPCAST)
    k_base, v_base, m_base = b * sk_b + h * sk_h, b * sv_b + h * sv_h, b * sm_b
    dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    full = S - S % BLOCK_K
    for start in range(0, full, BLOCK_K):
        dq = _dq_block(dq, q, do, K, V, M, k_base, v_base, m_base, sk_s, sv_s, sm_t, sm_s, rq,
                       T, start + tl.arange(0, BLOCK_K), S, rd, D, rdv, DV, scale, ACT, POW,
                       MASK, PRECISION, UPCAST, PAD_D, PAD_DV, False)
    if full < S:
        dq = _dq_block(dq, q, do, K, V, M, k_base, v_base, m_base, sk_s, sv_s, sm_t, sm_s, rq,
                       T, full + tl.arange(0, BLOCK_K), S, rd, D, rdv, DV, scale, ACT, POW,
                       MASK, PRECISION, UPCAST, PAD_D, PAD_DV, True)
    _store(DQ, dq * g_fold, b * sdq_b + h * sdq_h, rq, T, sdq_t, rd, D, PAD_D, UPCAST)
    if NEED_DR:
        _row_gradient(DO, O, R, DR, b * so_b + h * so_h, so_t, b * sr_b + h * sr_h, sr_t,
                      b * sdr_b + h * sdr_h, sdr_t, rq, T, rdv, DV, PAD_DV)


# --- tiles, autotuning, launches ------------------------------------------------
def _pow2(n, lo=16):
    return max(lo, 1 << max(0, (n - 1).bit_length()))


def _config(bq, bk, warps, stages):
    return triton.Config(dict(BLOCK_Q=bq, BLOCK_K=bk), num_warps=warps, num_stages=stages)


# The autotuning spaces, per kernel, element kind (16-bit; float32 as TF32;
# float32 as IEEE) and head dims up to 64 / above (80, 128): tiles x warps x
# stages. The rules: each 16-bit and TF32 entry compiles for sm_90a without
# register spills for every mask kind (tests/once/test_accelerator_build.py
# and tests/test_accelerator_kernels.py print the table), the two marked
# TF32 exceptions aside (no tile of that kernel avoids spills); the
# tensor-core work its SASS issues equals the tile's FLOPs (no 64-row dot on
# 8 warps); IEEE float32 (FMA units) gets one small tile per kernel and is
# not in the compiled table. The first entry is the default where nothing
# is tuned (the interpreter, explicit blocks). What each tile measured:
# docs/kernels.md, "How the tiles were chosen".
CONFIGS = {
    ("forward", "16-bit", False): [_config(128, 64, 8, 3), _config(64, 64, 4, 4)],
    ("forward", "16-bit", True): [_config(128, 32, 8, 3), _config(64, 32, 4, 3)],
    ("backward", "16-bit", False): [_config(64, 128, 8, 2), _config(32, 128, 8, 2),
                                    _config(32, 64, 4, 3)],
    ("backward", "16-bit", True): [_config(16, 128, 8, 2), _config(32, 128, 8, 1)],
    ("dq", "16-bit", False): [_config(64, 64, 4, 3), _config(128, 64, 8, 3),
                              _config(128, 32, 8, 2)],
    ("dq", "16-bit", True): [_config(128, 16, 8, 2), _config(64, 16, 4, 2)],
    ("forward", "tf32", False): [_config(64, 64, 4, 3), _config(128, 64, 8, 2),
                                 _config(64, 32, 4, 3)],
    ("forward", "tf32", True): [_config(64, 32, 4, 3)],
    ("backward", "tf32", False): [_config(32, 128, 8, 2)],
    ("backward", "tf32", True): [_config(16, 128, 8, 1), _config(16, 64, 4, 1)],  # spills: above
    ("dq", "tf32", False): [_config(64, 32, 4, 2), _config(128, 32, 8, 2)],
    ("dq", "tf32", True): [_config(128, 16, 8, 2), _config(64, 16, 4, 1)],  # spills with a mask
    ("forward", "ieee", False): [_config(32, 32, 4, 2)],
    ("forward", "ieee", True): [_config(32, 32, 4, 2)],
    ("backward", "ieee", False): [_config(16, 32, 4, 2)],
    ("backward", "ieee", True): [_config(16, 32, 4, 2)],
    ("dq", "ieee", False): [_config(32, 32, 4, 2)],
    ("dq", "ieee", True): [_config(16, 32, 4, 2)],
}
ROWS_CONFIG = _config(64, 16, 4, 1)  # the dQ epilogue: no dots, no pipeline


def _kind(dtype):
    """"16-bit", or float32's "tf32" / "ieee" (`_precision`)."""
    import torch

    return "16-bit" if dtype in (torch.bfloat16, torch.float16) else _precision(dtype)


def blocks(kernel, t, s, head_dim, dtype):
    """`(block_q, block_k)` a kernel ("forward", "backward", "dq") takes
    where nothing is tuned: its space's first entry, cut to the powers of
    two of T and S (at least 16, `tl.dot`'s minimum)."""
    first = CONFIGS[(kernel, _kind(dtype), head_dim > 64)][0].kwargs
    return min(first["BLOCK_Q"], _pow2(t)), min(first["BLOCK_K"], _pow2(s))


def _fits(configs, named_args, **kwargs):
    """The autotuner's pruning: no tile over the powers of two of T and S
    (a 128-query tile for 50 queries only adds padding); at least the
    smallest config."""
    t, s = _pow2(named_args["T"]), _pow2(named_args["S"])
    kept = [c for c in configs if c.kwargs["BLOCK_Q"] <= t and c.kwargs["BLOCK_K"] <= s]
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_Q"] * c.kwargs["BLOCK_K"])]


_TUNED = {}


def _kernel(kernel, q, head_dim, t, s, block_q, block_k):
    """`(kernel to launch, its extra launch arguments)`: on a GPU the
    autotuner over the kernel's space (per T, S, head dims, dtype and
    variant; chosen once per shape and cached); in the interpreter or with
    explicit blocks the plain kernel with those blocks."""
    fn = {"forward": _forward_kernel, "backward": _backward_kernel, "dq": _dq_kernel}[kernel]
    key = (kernel, _kind(q.dtype), head_dim > 64)
    space = CONFIGS[key]
    if interpreting() or block_q or block_k:
        dq, dk = blocks(kernel, t, s, head_dim, q.dtype)
        first = space[0]
        return fn, dict(BLOCK_Q=block_q or dq, BLOCK_K=block_k or dk,
                        num_warps=first.num_warps, num_stages=first.num_stages)
    if key not in _TUNED:
        _TUNED[key] = triton.autotune(
            configs=space, key=["T", "S", "D", "DV", "ACT", "MASK", "ROW"]
            + (["FUSE_DQ"] if kernel == "backward" else []),
            prune_configs_by={"early_config_prune": _fits},
            reset_to_zero=["DQ"] if kernel == "backward" else None)(fn)
    return _TUNED[key], {}


def _launch(fn, grid, args, meta):
    fn[grid](*args, **meta)  # kernels.inspection compiles instead (compile_for)


MAX_HEAD_DIM = 128


def _precision(dtype):
    import torch

    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _inner_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _operands(q, k, v, r, mask, activation):
    """What the launches share: the row factor (a tensor, or a constant
    passed by value: nothing allocated per call), the mask and its strides,
    the q/k/v strides, the constexprs and the scalars `(scale, o_fold,
    g_fold)`: the score scale c = 1/sqrt(d) per score where h is not
    positively homogeneous (else h(c s) = c^p h(s) and c^p joins the
    epilogue's factors: `o_fold` for the output and dV, `g_fold` for dQ and
    dK, each with a constant row factor folded in)."""
    import torch

    b, t, nh, d = q.shape
    s, dv = k.shape[1], v.shape[-1]
    if isinstance(r, float):
        r_ptr, r_const, rstrides = q, r, (0, 0, 0)  # a placeholder pointer, never read
    else:
        r_ptr, r_const, rstrides = r, 1.0, r.stride()
    if mask is None:
        m, mstrides, kind = q, (0, 0, 0), 0
    elif mask.shape[1] == 1:  # one row of keys per batch element: read as a vector
        m = mask.expand(b, 1, s).view(torch.uint8)
        mstrides, kind = (m.stride(0), 0, m.stride(2)), 1
    else:
        m = mask.expand(b, t, s).view(torch.uint8)
        mstrides, kind = m.stride(), 2
    power = HOMOGENEOUS.get(activation, 0)
    scale = 1.0 / math.sqrt(d)
    fold = scale**power if power else 1.0
    scalars = (scale, r_const * fold, r_const * (fold if power else scale))
    meta = dict(ACT=ACTIVATIONS[activation], POW=power, MASK=kind, ROW=r_ptr is not q,
                PRECISION=_precision(q.dtype),
                UPCAST=interpreting() and q.dtype == torch.bfloat16,
                PAD_D=_pow2(d) != d, PAD_DV=_pow2(dv) != dv, BLOCK_D=_pow2(d),
                BLOCK_DV=_pow2(dv))
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    return r_ptr, scalars, rstrides, m, mstrides, strides, meta


def forward(q, k, v, r, mask, activation, block_q=None, block_k=None):
    """`(B, T, H, Dv)` outputs; r: a float or float32 `(B, T, H)` row
    factors; mask: None or boolean `(B, 1 or T, S)`."""
    import torch

    b, t, nh, d = q.shape
    s, dv = k.shape[1], v.shape[-1]
    r_ptr, scalars, rstrides, m, mstrides, strides, meta = _operands(q, k, v, r, mask,
                                                                     activation)
    out = torch.empty((b, t, nh, dv), dtype=q.dtype, device=q.device)
    fn, config = _kernel("forward", q, max(d, dv), t, s, block_q, block_k)
    _launch(fn, lambda c: (triton.cdiv(t, c["BLOCK_Q"]), b * nh),
            (q, k, v, r_ptr, m, out, *strides, *out.stride()[:3], *rstrides, *mstrides,
             nh, t, s, d, dv, *scalars), dict(meta, **config))
    return out


def backward(q, k, v, r, mask, out, do, activation, block_q=None, block_k=None,
             deterministic=False, row_gradient=True):
    """`(dq, dk, dv, dr)`; dr (the row factors' gradient) only for a factor
    tensor. Fused (5 dots per tile, dQ added atomically in float32), or
    with `deterministic` the two-kernel path (dK/dV, then dQ; no atomics:
    bitwise reproducible)."""
    import torch

    b, t, nh, d = q.shape
    s, dv = k.shape[1], v.shape[-1]
    r_ptr, scalars, rstrides, m, mstrides, strides, meta = _operands(q, k, v, r, mask,
                                                                     activation)
    do = do.contiguous()  # the same strides as `out` (the row gradient reads both)
    dk = torch.empty((b, s, nh, d), dtype=k.dtype, device=q.device)
    dvv = torch.empty((b, s, nh, dv), dtype=v.dtype, device=q.device)
    dq = torch.empty((b, t, nh, d), dtype=q.dtype, device=q.device)
    need_dr = meta["ROW"] and row_gradient
    dr = torch.empty((b, t, nh), dtype=torch.float32, device=q.device) if need_dr else dk
    sizes = (nh, t, s, d, dv, *scalars)
    common = (*strides, *do.stride()[:3], *rstrides, *mstrides)
    fn, config = _kernel("backward", q, max(d, dv), t, s, block_q, block_k)
    grid = lambda c: (triton.cdiv(s, c["BLOCK_K"]), b * nh)  # noqa: E731
    if deterministic:
        _launch(fn, grid, (q, k, v, r_ptr, m, do, dk, dk, dvv, *common, *dk.stride()[:3],
                           *dvv.stride()[:3], *sizes), dict(meta, FUSE_DQ=False, **config))
        fn, config = _kernel("dq", q, max(d, dv), t, s, block_q, block_k)
        _launch(fn, lambda c: (triton.cdiv(t, c["BLOCK_Q"]), b * nh),
                (q, k, v, r_ptr, m, do, out, dq, dr, *common, *dq.stride()[:3],
                 *(dr.stride() if need_dr else (0, 0, 0)), *sizes),
                dict(meta, NEED_DR=need_dr, **config))
        return dq, dk, dvv, dr if need_dr else None
    acc = torch.zeros((b, nh, meta["BLOCK_D"], t), dtype=torch.float32, device=q.device)
    _launch(fn, grid, (q, k, v, r_ptr, m, do, acc, dk, dvv, *common, *dk.stride()[:3],
                       *dvv.stride()[:3], *sizes), dict(meta, FUSE_DQ=True, **config))
    rows = ROWS_CONFIG
    _launch(_dq_rows_kernel, (triton.cdiv(t, rows.kwargs["BLOCK_Q"]), b * nh),
            (acc, do, out, r_ptr, dq, dr, *do.stride()[:3], *rstrides, *dq.stride()[:3],
             *(dr.stride() if need_dr else (0, 0, 0)), nh, t, d, dv, scalars[2]),
            dict(NEED_DR=need_dr, UPCAST=meta["UPCAST"], PAD_D=meta["PAD_D"], PAD_DV=meta["PAD_DV"],
                 BLOCK_Q=rows.kwargs["BLOCK_Q"], BLOCK_D=meta["BLOCK_D"],
                 BLOCK_DV=meta["BLOCK_DV"], num_warps=rows.num_warps,
                 num_stages=rows.num_stages))
    return dq, dk, dvv, dr if need_dr else None


def _function():
    import torch

    class PointwiseAttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, r, mask, activation, block_q, block_k, deterministic):
            out = forward(q, k, v, r, mask, activation, block_q, block_k)
            constant = isinstance(r, float)
            ctx.save_for_backward(q, k, v, out, *(() if constant else (r,)))
            ctx.r = r if constant else None
            ctx.mask, ctx.activation, ctx.blocks = mask, activation, (block_q, block_k)
            ctx.deterministic = deterministic
            return out

        @staticmethod
        def backward(ctx, do):
            q, k, v, out, *r = ctx.saved_tensors
            r = r[0] if r else ctx.r
            dq, dk, dv, dr = backward(q, k, v, r, ctx.mask, out, do, ctx.activation, *ctx.blocks,
                                      deterministic=ctx.deterministic,
                                      row_gradient=ctx.needs_input_grad[3])
            return dq, dk, dv, dr, None, None, None, None, None

    return PointwiseAttentionFunction


_FUNCTION = []


def attention(query, key, value, activation="relu", factor=None, mask=None, block_q=None,
              block_k=None, deterministic=None):
    """Fused pointwise attention on torch tensors, `(B, T, H, D)` in and out.

    Args:
        query, key, value: `(B, T, H, D)`, `(B, S, H, D)`, `(B, S, H, Dv)`
            CUDA tensors of one dtype (float32, float16 or bfloat16; CPU
            tensors under `TRITON_INTERPRET=1`). Any strides with a
            contiguous last axis.
        activation: a name of `ACTIVATIONS`.
        factor: the row factor `exp(s_h) * L_i^-alpha`: None (1), a float or
            a tensor broadcastable to `(B, T, H, 1)` (differentiable).
        mask: optional boolean, broadcastable to `(B, T, S)`; True = attend.
            A mask with one row per batch element (`(B, 1, S)`, key
            padding) is read as a vector of keys.
        block_q, block_k: tile sizes (powers of two >= 16); default: tuned
            per shape on a GPU (`CONFIGS`), `blocks` in the interpreter.
        deterministic: the backward without atomics (two kernels, dQ
            recomputing the scores: 7 dots per tile instead of 5; bitwise
            reproducible gradients). Default: PyTorch's
            `torch.use_deterministic_algorithms` setting.
    """
    import torch

    check(query, activation, value)
    query, key, value = (_inner_contiguous(x) for x in (query, key, value))
    b, t, nh, _ = query.shape
    if factor is None or isinstance(factor, (int, float)):
        r = 1.0 if factor is None else float(factor)
    else:
        r = factor.to(torch.float32).expand(b, t, nh, 1)[..., 0]
    if mask is not None:
        mask = torch.as_tensor(mask, device=query.device).to(torch.bool)
        while mask.dim() < 3:
            mask = mask.unsqueeze(0)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if not _FUNCTION:
        _FUNCTION.append(_function())
    return _FUNCTION[0].apply(query, key, value, r, mask, activation, block_q, block_k,
                              bool(deterministic))


def check(query, activation, value=None):
    """Raises a ValueError naming why these tensors cannot take the kernel
    (`value`: its head dim is checked too; it may differ from the query's)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"The Triton kernel computes {sorted(ACTIVATIONS)}, not {activation!r}.")
    for what, x in (("query/key", query), ("value", value)):
        if x is not None and x.shape[-1] > MAX_HEAD_DIM:
            raise ValueError(
                f"The Triton kernel takes head dims up to {MAX_HEAD_DIM}; the {what} head dim is "
                f"{x.shape[-1]} (KERAS_RELUVIT_KERNEL=auto uses the generic path).")
    if query.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"The Triton kernel runs on CUDA tensors; these are on {query.device.type!r}. "
            "Set TRITON_INTERPRET=1 before Triton is imported to run it in Triton's "
            "interpreter on CPU tensors (slow; for checking), or use another kernel "
            "(KERAS_RELUVIT_KERNEL=auto).")
