"""Fused pointwise attention for PyTorch on CUDA: Triton kernels.

The same algorithm as `keras_reluvit.pallas_attention` (read its docstring):
one program per (query block, batch x head) loops over key blocks, computes
the score tile, `h`, the mask and `w v` on chip and sums the blocks' partial
outputs in float32 (no running max, no rescaling); the row factor
`r_i = exp(s_h) * L_i^-alpha` multiplies the accumulator once at the end. The
backward pass recomputes the scores per tile in two kernels (dK/dV over key
blocks, dQ over query blocks); the row factor's gradient is
`sum_d dO * O / r`. Wrapped in a `torch.autograd.Function`.

The kernels read the layer's `(B, T, H, D)` projections in place at any
batch / token / head stride (the q/k/v views of one fused qkv GEMM output
too), as long as the head dim is contiguous; token counts need not be a
multiple of the block (rows and keys past the end are masked: they add
nothing and are not counted in `L`, which the caller's row factor holds).
Head dims are padded to a power of two inside the kernel (masked loads).

float32 inputs use TF32 tensor cores only when PyTorch's own matmuls may
(`torch.backends.cuda.matmul.allow_tf32`), IEEE float32 otherwise.

On a machine without a GPU the kernels run in Triton's interpreter on CPU
tensors when `TRITON_INTERPRET=1` is set before Triton is imported (that is
how the test suite checks them), and `compile_for` compiles them ahead of
time for a CUDA target (e.g. sm_90) with Triton's own compiler.
"""

import math

import triton
import triton.language as tl

# Activation codes the kernels take (a constexpr: one compiled variant each).
ACTIVATIONS = {"relu": 0, "relu2": 1, "relu6": 2, "identity": 3, "sigmoid": 4, "gelu": 5,
               "softplus": 6}
_C = math.sqrt(2.0 / math.pi)


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
def _mm(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: Triton's CPU interpreter multiplies bfloat16 wrongly (3.9); the
    # products of bfloat16 values are exact in float32, so upcasting gives
    # what a GPU's bfloat16 tensor cores compute.
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _low(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """`x.to(dtype)` for a dot operand. Under UPCAST (the interpreter with
    bfloat16) it rounds to nearest even first: the interpreter converts by
    truncation, a GPU to nearest; truncation biases sums of many products."""
    if UPCAST:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _valid(rq, rk, T, S, M, sm_b, sm_t, sm_s, b, HAS_MASK: tl.constexpr):
    valid = (rq < T)[:, None] & (rk < S)[None, :]
    if HAS_MASK:
        m = tl.load(M + b * sm_b + rq[:, None] * sm_t + rk[None, :] * sm_s, mask=valid, other=0)
        valid = valid & (m != 0)
    return valid


@triton.jit
def _tile(P, b, h, s_b, s_h, rows, s_t, n_rows, cols, n_cols):
    """The (rows x cols) tile of head h of batch b; zeros past the ends."""
    return tl.load(P + b * s_b + h * s_h + rows[:, None] * s_t + cols[None, :],
                   mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :], other=0.0)


@triton.jit
def _put(P, x, b, h, s_b, s_h, rows, s_t, n_rows, cols, n_cols):
    tl.store(P + b * s_b + h * s_h + rows[:, None] * s_t + cols[None, :],
             x.to(P.dtype.element_ty), mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :])


@triton.jit
def _scaled_do(DO, R, b, h, so_b, so_h, rq, so_t, T, rdv, DV, sr_b, sr_t, sr_h, dtype,
               UPCAST: tl.constexpr):
    """`r dO` for a block of query rows, as a dot operand of `dtype`."""
    do = _tile(DO, b, h, so_b, so_h, rq, so_t, T, rdv, DV)
    r = tl.load(R + b * sr_b + h * sr_h + rq * sr_t, mask=rq < T, other=0.0)
    return _low(do.to(tl.float32) * r[:, None], dtype, UPCAST)


@triton.jit
def _forward_kernel(Q, K, V, R, M, O,
                    sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                    so_b, so_t, so_h, sr_b, sr_t, sr_h, sm_b, sm_t, sm_s,
                    H, T, S, D, DV, scale,
                    ACT: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
                    UPCAST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    q = _tile(Q, b, h, sq_b, sq_h, rq, sq_t, T, rd, D)
    acc = tl.zeros((BLOCK_Q, BLOCK_DV), dtype=tl.float32)
    for start in range(0, S, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        k = _tile(K, b, h, sk_b, sk_h, rk, sk_s, S, rd, D)
        s = _mm(q, tl.trans(k), PRECISION, UPCAST) * scale
        valid = _valid(rq, rk, T, S, M, sm_b, sm_t, sm_s, b, HAS_MASK)
        w = tl.where(valid, _act(s, ACT), 0.0)
        v = _tile(V, b, h, sv_b, sv_h, rk, sv_s, S, rdv, DV)
        acc += _mm(_low(w, v.dtype, UPCAST), v, PRECISION, UPCAST)
    r = tl.load(R + b * sr_b + h * sr_h + rq * sr_t, mask=rq < T, other=0.0)
    _put(O, acc * r[:, None], b, h, so_b, so_h, rq, so_t, T, rdv, DV)


@triton.jit
def _dkdv_kernel(Q, K, V, R, M, DO, DK, DV_,
                 sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                 so_b, so_t, so_h, sr_b, sr_t, sr_h, sm_b, sm_t, sm_s,
                 H, T, S, D, DV, scale,
                 ACT: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # dK, dV of one key block, looping over query blocks; DK and DV_ are
    # contiguous (B, S, H, D) and (B, S, H, Dv).
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    k = _tile(K, b, h, sk_b, sk_h, rk, sk_s, S, rd, D)
    v = _tile(V, b, h, sv_b, sv_h, rk, sv_s, S, rdv, DV)
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_DV), dtype=tl.float32)
    for start in range(0, T, BLOCK_Q):
        rq = start + tl.arange(0, BLOCK_Q)
        q = _tile(Q, b, h, sq_b, sq_h, rq, sq_t, T, rd, D)
        dor = _scaled_do(DO, R, b, h, so_b, so_h, rq, so_t, T, rdv, DV, sr_b, sr_t, sr_h,
                         q.dtype, UPCAST)
        s = _mm(q, tl.trans(k), PRECISION, UPCAST) * scale
        valid = _valid(rq, rk, T, S, M, sm_b, sm_t, sm_s, b, HAS_MASK)
        w = tl.where(valid, _act(s, ACT), 0.0)
        g = tl.where(valid, _act_grad(s, ACT), 0.0)
        dv += _mm(tl.trans(_low(w, q.dtype, UPCAST)), dor, PRECISION, UPCAST)
        ds = _mm(dor, tl.trans(v), PRECISION, UPCAST) * g * scale
        dk += _mm(tl.trans(_low(ds, q.dtype, UPCAST)), q, PRECISION, UPCAST)
    _put(DK, dk, b, h, S * H * D, D, rk, H * D, S, rd, D)
    _put(DV_, dv, b, h, S * H * DV, DV, rk, H * DV, S, rdv, DV)


@triton.jit
def _dq_kernel(Q, K, V, R, M, DO, DQ,
               sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
               so_b, so_t, so_h, sr_b, sr_t, sr_h, sm_b, sm_t, sm_s,
               H, T, S, D, DV, scale,
               ACT: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
               UPCAST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # dQ of one query block, looping over key blocks; DQ is contiguous (B, T, H, D).
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    q = _tile(Q, b, h, sq_b, sq_h, rq, sq_t, T, rd, D)
    dor = _scaled_do(DO, R, b, h, so_b, so_h, rq, so_t, T, rdv, DV, sr_b, sr_t, sr_h,
                     q.dtype, UPCAST)
    dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    for start in range(0, S, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        k = _tile(K, b, h, sk_b, sk_h, rk, sk_s, S, rd, D)
        v = _tile(V, b, h, sv_b, sv_h, rk, sv_s, S, rdv, DV)
        s = _mm(q, tl.trans(k), PRECISION, UPCAST) * scale
        valid = _valid(rq, rk, T, S, M, sm_b, sm_t, sm_s, b, HAS_MASK)
        g = tl.where(valid, _act_grad(s, ACT), 0.0)
        ds = _mm(dor, tl.trans(v), PRECISION, UPCAST) * g * scale
        dq += _mm(_low(ds, k.dtype, UPCAST), k, PRECISION, UPCAST)
    _put(DQ, dq, b, h, T * H * D, D, rq, H * D, T, rd, D)


# --- launchers -----------------------------------------------------------------
def _pow2(n, lo=16):
    return max(lo, 1 << max(0, (n - 1).bit_length()))


def blocks(t, s, d, backward=False, itemsize=2):
    """`(block_q, block_k)` for T queries, S keys, head dim d and an element
    size: shared memory stays <= ~150 KB on sm_90 (checked by compiling:
    tests/once/test_accelerator_build.py; an H100/H200 has 227 KB, an A100
    164 KB). 16-bit: 128 x 64 forward, 64 x 64 backward (64 x 64 both for
    d > 64); float32: 64 x 64 forward and 64 x 32 backward (64 x 32 both for
    d > 64). Smaller for short sequences (at least 16: `tl.dot`'s minimum)."""
    if itemsize <= 2:
        bq, bk = (64, 64) if backward or d > 64 else (128, 64)
    else:
        bq, bk = (64, 32) if backward or d > 64 else (64, 64)
    return min(bq, _pow2(t)), min(bk, _pow2(s))


MAX_HEAD_DIM = 128


def _precision(dtype):
    import torch

    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _inner_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _common(q, k, v, r, mask, activation, backward, block_q, block_k):
    """What the three kernels' launches share: sizes, the mask pointer and
    strides, the q/k/v strides, the constexprs and the blocks."""
    import torch

    b, t, nh, d = q.shape
    s, dv = k.shape[1], v.shape[-1]
    dbq, dbk = blocks(t, s, max(d, dv), backward=backward, itemsize=q.element_size())
    if mask is None:
        m, mstrides = r, (0, 0, 0)  # a placeholder pointer, never read
    else:
        m = mask.expand(b, t, s)
        m = m.view(torch.uint8)
        mstrides = m.stride()
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    meta = dict(ACT=ACTIVATIONS[activation], HAS_MASK=mask is not None,
                PRECISION=_precision(q.dtype),
                UPCAST=interpreting() and q.dtype == torch.bfloat16,
                BLOCK_Q=block_q or dbq, BLOCK_K=block_k or dbk,
                BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv))
    sizes = (nh, t, s, d, dv, 1.0 / math.sqrt(d))
    return b, t, s, nh, d, dv, m, mstrides, strides, sizes, meta


def forward(q, k, v, r, mask, activation, block_q=None, block_k=None):
    """`(B, T, H, Dv)` outputs; r: float32 `(B, T, H)` row factors."""
    import torch

    b, t, s, nh, d, dv, m, mstrides, strides, sizes, meta = _common(
        q, k, v, r, mask, activation, False, block_q, block_k)
    out = torch.empty((b, t, nh, dv), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(t, meta["BLOCK_Q"]), b * nh)
    _forward_kernel[grid](q, k, v, r, m, out, *strides, *out.stride()[:3], *r.stride(),
                          *mstrides, *sizes, **meta)
    return out


def backward(q, k, v, r, mask, do, activation, block_q=None, block_k=None):
    import torch

    b, t, s, nh, d, dv, m, mstrides, strides, sizes, meta = _common(
        q, k, v, r, mask, activation, True, block_q, block_k)
    do = do.contiguous()
    dq = torch.empty((b, t, nh, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, s, nh, d), dtype=k.dtype, device=q.device)
    dvv = torch.empty((b, s, nh, dv), dtype=v.dtype, device=q.device)
    common = (*strides, *do.stride()[:3], *r.stride(), *mstrides, *sizes)
    _dkdv_kernel[(triton.cdiv(s, meta["BLOCK_K"]), b * nh)](q, k, v, r, m, do, dk, dvv,
                                                             *common, **meta)
    _dq_kernel[(triton.cdiv(t, meta["BLOCK_Q"]), b * nh)](q, k, v, r, m, do, dq, *common,
                                                           **meta)
    return dq, dk, dvv


def _function():
    import torch

    class PointwiseAttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, r, mask, activation, block_q, block_k):
            out = forward(q, k, v, r, mask, activation, block_q, block_k)
            ctx.save_for_backward(q, k, v, r, out)
            ctx.mask, ctx.activation, ctx.blocks = mask, activation, (block_q, block_k)
            return out

        @staticmethod
        def backward(ctx, do):
            q, k, v, r, out = ctx.saved_tensors
            dq, dk, dv = backward(q, k, v, r, ctx.mask, do, ctx.activation, *ctx.blocks)
            dr = None
            if ctx.needs_input_grad[3]:
                # o = r * u, so dr = sum_d do * u = sum_d do * o / r (r > 0).
                dr = (do.float() * out.float()).sum(-1) / r
            return dq, dk, dv, dr, None, None, None, None

    return PointwiseAttentionFunction


_FUNCTION = []


def attention(query, key, value, activation="relu", factor=None, mask=None, block_q=None,
              block_k=None):
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
        block_q, block_k: tile sizes (powers of two >= 16); default `blocks`.
    """
    import torch

    check(query, activation)
    query, key, value = (_inner_contiguous(x) for x in (query, key, value))
    b, t, nh, _ = query.shape
    if factor is None or isinstance(factor, (int, float)):
        r = torch.full((b, t, nh), 1.0 if factor is None else float(factor),
                       dtype=torch.float32, device=query.device)
    else:
        r = factor.to(torch.float32).expand(b, t, nh, 1)[..., 0]
    if mask is not None:
        mask = torch.as_tensor(mask, device=query.device).to(torch.bool)
        while mask.dim() < 3:
            mask = mask.unsqueeze(0)
        mask = mask.expand(b, t, key.shape[1])
    if not _FUNCTION:
        _FUNCTION.append(_function())
    return _FUNCTION[0].apply(query, key, value, r, mask, activation, block_q, block_k)


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


def compile_for(target=("cuda", 90, 32), activation="relu", dtype="bf16", mask=False,
                head_dim=64):
    """Compiles the three kernels ahead of time with Triton's own compiler
    for a GPU target (no GPU needed; not under TRITON_INTERPRET): returns
    `{kernel name: compiled kernel}` (each has `.asm["cubin"]` for CUDA)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreting():
        raise RuntimeError("compile_for needs Triton's compiler; unset TRITON_INTERPRET.")
    precision = "tf32" if dtype == "fp32" else "ieee"
    const = dict(ACT=ACTIVATIONS[activation], HAS_MASK=bool(mask), PRECISION=precision,
                 UPCAST=False, BLOCK_D=_pow2(head_dim), BLOCK_DV=_pow2(head_dim))
    compiled = {}
    for fn, backward in ((_forward_kernel, False), (_dkdv_kernel, True), (_dq_kernel, True)):
        bq, bk = blocks(4096, 4096, head_dim, backward, 4 if dtype == "fp32" else 2)
        consts = dict(const, BLOCK_Q=bq, BLOCK_K=bk)
        sig = {}
        for name in fn.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name == "R":
                sig[name] = "*fp32"
            elif name == "M":
                sig[name] = "*u8"
            elif name == "scale":
                sig[name] = "fp32"
            elif name.isupper() or name == "DV_":
                sig[name] = f"*{dtype}"
            else:
                sig[name] = "i32"
        for name in ("H", "T", "S", "D", "DV"):
            sig[name] = "i32"
        src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v
                                             for k, v in consts.items()})
        compiled[fn.__name__.strip("_")] = triton.compile(src, target=GPUTarget(*target))
    return compiled
