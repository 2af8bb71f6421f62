"""A static benchmark of the Triton kernels on sm_90a (H100 / H200), no GPU:
ReLU/L attention's kernels beside a softmax FlashAttention-2 reference, both
compiled by the same Triton for the same target, read from their SASS.

    python benchmarks/kernels_static.py              # -> benchmarks/results/kernels_static_sm90a.{md,json}
    python benchmarks/kernels_static.py --check      # only the reference's numerics (Triton's interpreter)

What it does:

1. **The softmax reference** (`_softmax_*` below; written here on the
   pattern of Triton's fused-attention tutorial, FlashAttention-2): the
   forward keeps a running max and normaliser per row (`exp2` with the
   log2(e) scale folded into the scores) and stores the log-sum-exp; the
   backward is a row pass `delta = rowsum(o * do)`, a dK/dV kernel over key
   blocks (4 dots per tile) and a dQ kernel over query blocks (3 dots per
   tile). Same `(B, T, H, D)` strided layout as ours, the main loop over full
   key blocks and one masked tail block, as ours. `--check` compares it with
   a float64 softmax attention in Triton's interpreter (a subprocess: the
   interpreter is chosen when kernels are defined); the full run does too,
   first, and stops if it is off.
2. **Compiled as launched** for sm_90a (`kernels.inspection.compile_for` for
   ours: the launch's specialisation, every autotuning config; the reference
   with the same arguments' alignment), bfloat16, head dims 64 and 128, no mask.
3. **The main loop's instruction mix** per kernel and config, from the SASS
   (cuobjdump): the loop is the backward branch whose body holds the most
   tensor-core instructions; its instructions are counted by class --
   tensor core (HGMMA / HMMA), MUFU (exp2, rcp, tanh ...), FP32 ALU, memory
   (global / shared loads and stores, cp.async, TMA, atomics), barriers /
   syncs, other (integer, address, predicate, moves, branches; most of it,
   in these loops, the uniform datapath's warpgroup-MMA descriptor
   arithmetic: UMOV / UIADD3 / ULEA) -- beside
   ptxas' registers, spills and the shared memory.
4. **A throughput model per main-loop iteration** on one H100/H200 SM
   (dense peak rates per clock: tensor cores 2048 bf16 multiply-adds, MUFU
   16 lanes, FP32 128 lanes, 4 warp-instructions issued):
   `tensor = issued MACs / 2048`, `mufu = MUFU warp-instructions x 32 / 16`,
   `fp32 = FP32 warp-instructions x 32 / 128`, `issue = all
   warp-instructions / 4` (each instruction counted once per warp of the
   CTA). Two bounds: **overlap** = max of the four (warpgroup MMA runs
   asynchronously beside the rest, the best case), **serial** = tensor +
   max(mufu, fp32, issue of the non-tensor instructions) (nothing overlaps
   the MMAs). Per kernel and L the spill-free config with the fewest
   cycles for the pass is taken (the autotuner's key holds T and S: at 197
   tokens a 32-row tile pads less than a 64-row one); a pass over L tokens
   costs `ceil(L / BQ) x ceil(L / BK)` iterations per
   head (ours: forward, one fused backward; the reference: forward, dK/dV
   and dQ kernels; the backward's row pass and tails are left out, alike
   for both). Not modelled: latency, occupancy, memory bandwidth, L2, the
   prologue / epilogue, and two things the tables show instead: the share
   of the tensor-core work issued as warp-level HMMA (`mma.sync`, which
   Triton falls back to where a dot's rows do not fill a warpgroup's 64;
   modelled at the warpgroup HGMMA rate, though on Hopper it runs slower) --
   all Triton kernels here run 0%, the Pallas ones at d = 128 and JAX's
   32 x 32 softmax tiles 50-100%, on both sides of a ratio alike -- and the
   memory fences (MEMBAR / ERRBAR / CCTL, counted as barriers: one issue
   slot each) around each of our Pallas backward's atomic dQ adds: Pallas'
   `atomic_add` lowers to acquire-release atomics at GPU scope, with no
   option to relax them (the Triton kernel's are relaxed). A fence's
   latency can cost far more than its slot; the measured dispatch times
   that backward against the deterministic one (no atomics) on a GPU. The
   GPU benchmark (`benchmarks/accelerator.py`) is the judge where a GPU is
   lent; these are modelled numbers.

5. **The Pallas kernels on CUDA** (JAX; `--skip-pallas` leaves them out):
   ours and JAX's own Pallas softmax attention
   (`jax.experimental.pallas.ops.gpu.attention.mha`, FlashAttention-2 with
   a backward of one kernel: a dK/dV loop, then a dQ loop), each lowered for
   CUDA at 4096 tokens, bfloat16, and its Triton IR compiled for sm_90a at
   the warps and stages the launch hands XLA (XLA compiles it with its own
   bundled Triton). Ours at its fixed `GPU_BLOCKS` tiles; JAX's at its
   default `BlockSizes` and three others, the best per L. A kernel of two
   loops costs both per pass. Same model, same tables.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634


# --- the softmax reference (FlashAttention-2) -------------------------------------------
@triton.jit
def _program(s_b, s_h, H, BLOCK: tl.constexpr, D: tl.constexpr):
    """This program's (batch x head) index, the head's base offset, its
    block of rows (program axis 0) and the head dim's columns."""
    bh = tl.program_id(1)
    base = (bh // H).to(tl.int64) * s_b + (bh % H).to(tl.int64) * s_h
    return bh, base, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)


@triton.jit
def _load2(A, B, offsets, rows, n, MASKED: tl.constexpr):
    """Two `(rows, D)` tiles at the same offsets; rows past `n` read as 0 when MASKED."""
    if MASKED:
        a = tl.load(A + offsets, mask=(rows < n)[:, None], other=0.0)
        b = tl.load(B + offsets, mask=(rows < n)[:, None], other=0.0)
    else:
        a = tl.load(A + offsets)
        b = tl.load(B + offsets)
    return a, b


@triton.jit
def _softmax_fwd_block(acc, m_i, l_i, q, K, V, offsets, rk, S, qk_scale, MASKED: tl.constexpr):
    k, v = _load2(K, V, offsets, rk, S, MASKED)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where((rk < S)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _softmax_fwd(Q, K, V, O, LSE, s_b, s_t, s_h, H, T, S, qk_scale,
                 D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    bh, base, rq, rd = _program(s_b, s_h, H, BLOCK_Q, D)
    q = tl.load(Q + base + rq[:, None] * s_t + rd[None, :], mask=(rq < T)[:, None], other=0.0)
    m_i = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_Q,), tl.float32)
    acc = tl.zeros((BLOCK_Q, D), tl.float32)
    full = S - S % BLOCK_K
    for start in range(0, full, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        acc, m_i, l_i = _softmax_fwd_block(acc, m_i, l_i, q, K, V,
                                           base + rk[:, None] * s_t + rd[None, :], rk, S,
                                           qk_scale, False)
    if full < S:
        rk = full + tl.arange(0, BLOCK_K)
        acc, m_i, l_i = _softmax_fwd_block(acc, m_i, l_i, q, K, V,
                                           base + rk[:, None] * s_t + rd[None, :], rk, S,
                                           qk_scale, True)
    acc = acc / l_i[:, None]
    tl.store(O + base + rq[:, None] * s_t + rd[None, :], acc.to(O.dtype.element_ty),
             mask=(rq < T)[:, None])
    tl.store(LSE + bh.to(tl.int64) * T + rq, m_i + tl.math.log2(l_i), mask=rq < T)


@triton.jit
def _softmax_delta(O, DO, DELTA, s_b, s_t, s_h, H, T, D: tl.constexpr, BLOCK_Q: tl.constexpr):
    bh, base, rq, rd = _program(s_b, s_h, H, BLOCK_Q, D)
    o, do = _load2(O, DO, base + rq[:, None] * s_t + rd[None, :], rq, T, True)
    tl.store(DELTA + bh.to(tl.int64) * T + rq, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1),
             mask=rq < T)


@triton.jit
def _softmax_dkdv_block(dk, dv, k, v, Q, DO, offsets, LSE, DELTA, rq, T, qk_scale,
                        MASKED: tl.constexpr):
    q, do = _load2(Q, DO, offsets, rq, T, MASKED)
    if MASKED:
        lse = tl.load(LSE + rq, mask=rq < T, other=float("inf"))
        delta = tl.load(DELTA + rq, mask=rq < T, other=0.0)
    else:
        lse = tl.load(LSE + rq)
        delta = tl.load(DELTA + rq)
    p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])  # keys x queries
    dv += tl.dot(p_t.to(do.dtype), do)
    dp_t = tl.dot(v, tl.trans(do))
    ds_t = p_t * (dp_t - delta[None, :])
    dk += tl.dot(ds_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def _softmax_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, s_b, s_t, s_h, H, T, S, sm_scale, qk_scale,
                  D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    bh, base, rk, rd = _program(s_b, s_h, H, BLOCK_K, D)
    kv = base + rk[:, None] * s_t + rd[None, :]
    k, v = _load2(K, V, kv, rk, S, True)
    dk = tl.zeros((BLOCK_K, D), tl.float32)
    dv = tl.zeros((BLOCK_K, D), tl.float32)
    lse, delta = LSE + bh.to(tl.int64) * T, DELTA + bh.to(tl.int64) * T
    full = T - T % BLOCK_Q
    for start in range(0, full, BLOCK_Q):
        rq = start + tl.arange(0, BLOCK_Q)
        dk, dv = _softmax_dkdv_block(dk, dv, k, v, Q, DO, base + rq[:, None] * s_t + rd[None, :],
                                     lse, delta, rq, T, qk_scale, False)
    if full < T:
        rq = full + tl.arange(0, BLOCK_Q)
        dk, dv = _softmax_dkdv_block(dk, dv, k, v, Q, DO, base + rq[:, None] * s_t + rd[None, :],
                                     lse, delta, rq, T, qk_scale, True)
    tl.store(DK + kv, (dk * sm_scale).to(DK.dtype.element_ty), mask=(rk < S)[:, None])
    tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=(rk < S)[:, None])


@triton.jit
def _softmax_dq_block(dq, q, do, lse, delta, K, V, offsets, rk, S, qk_scale,
                      MASKED: tl.constexpr):
    k, v = _load2(K, V, offsets, rk, S, MASKED)
    p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
    if MASKED:
        p = tl.where((rk < S)[None, :], p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    return dq + tl.dot(ds.to(k.dtype), k)


@triton.jit
def _softmax_dq(Q, K, V, DO, LSE, DELTA, DQ, s_b, s_t, s_h, H, T, S, sm_scale, qk_scale,
                D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    bh, base, rq, rd = _program(s_b, s_h, H, BLOCK_Q, D)
    qo = base + rq[:, None] * s_t + rd[None, :]
    q, do = _load2(Q, DO, qo, rq, T, True)
    lse = tl.load(LSE + bh.to(tl.int64) * T + rq, mask=rq < T, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * T + rq, mask=rq < T, other=0.0)
    dq = tl.zeros((BLOCK_Q, D), tl.float32)
    full = S - S % BLOCK_K
    for start in range(0, full, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        dq = _softmax_dq_block(dq, q, do, lse, delta, K, V, base + rk[:, None] * s_t + rd[None, :],
                               rk, S, qk_scale, False)
    if full < S:
        rk = full + tl.arange(0, BLOCK_K)
        dq = _softmax_dq_block(dq, q, do, lse, delta, K, V, base + rk[:, None] * s_t + rd[None, :],
                               rk, S, qk_scale, True)
    tl.store(DQ + qo, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(rq < T)[:, None])


# The reference's configs per kernel and head-dim class (BLOCK_Q, BLOCK_K, warps,
# stages): the tutorial's kind of tiles; none lays a 64-row dot on 8 warps.
SOFTMAX_CONFIGS = {
    ("fwd", False): [(128, 64, 8, 3), (64, 64, 4, 4), (128, 128, 8, 2)],
    ("fwd", True): [(128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2)],
    ("dkdv", False): [(32, 128, 8, 2), (64, 128, 8, 2), (32, 64, 4, 3)],
    ("dkdv", True): [(16, 128, 8, 2), (32, 128, 8, 1), (32, 64, 4, 2)],
    ("dq", False): [(128, 32, 8, 2), (128, 64, 8, 2), (64, 64, 4, 3)],
    ("dq", True): [(128, 16, 8, 2), (64, 32, 4, 2), (64, 16, 4, 2)],
}


def softmax_attention(q, k, v, do=None, blocks=None):
    """The reference on `(B, T, H, D)` tensors (the interpreter on a CPU):
    the output, and (dq, dk, dv) for the cotangent `do`."""
    import torch

    b, t, h, d = q.shape
    s = k.shape[1]
    bq, bk = blocks or (16, 16)
    sm_scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty((b * h, t), dtype=torch.float32)
    strides = (q.stride(0), q.stride(1), q.stride(2))
    _softmax_fwd[(triton.cdiv(t, bq), b * h)](q, k, v, out, lse, *strides, h, t, s,
                                              sm_scale * LOG2E, D=d, BLOCK_Q=bq, BLOCK_K=bk)
    if do is None:
        return out
    delta = torch.empty((b * h, t), dtype=torch.float32)
    _softmax_delta[(triton.cdiv(t, bq), b * h)](out, do, delta, *strides, h, t, D=d, BLOCK_Q=bq)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _softmax_dkdv[(triton.cdiv(s, bk), b * h)](q, k, v, do, lse, delta, dk, dv, *strides, h, t,
                                               s, sm_scale, sm_scale * LOG2E, D=d,
                                               BLOCK_Q=bq, BLOCK_K=bk)
    _softmax_dq[(triton.cdiv(t, bq), b * h)](q, k, v, do, lse, delta, dq, *strides, h, t, s,
                                             sm_scale, sm_scale * LOG2E, D=d,
                                             BLOCK_Q=bq, BLOCK_K=bk)
    return out, (dq, dk, dv)


def check():
    """The reference against a float64 softmax attention (Triton's
    interpreter): outputs and gradients, 37 tokens (a tail block), d = 16."""
    import torch

    torch.manual_seed(0)
    q, k, v, do = (torch.randn(2, 37, 2, 16) for _ in range(4))
    out, grads = softmax_attention(q, k, v, do)
    x = [a.double().requires_grad_() for a in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(a.transpose(1, 2) for a in x)).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, x, do.double())
    errors = [float((a.double() - b).abs().max() / b.abs().max())
              for a, b in zip([out, *grads], [ref.detach(), *ref_grads])]
    print(json.dumps(dict(errors=errors)))
    return max(errors) < 1e-4


# --- SASS: the main loop and its instruction classes -------------------------------------
CLASSES = (
    ("tensor", ("HGMMA", "HMMA")),
    ("mufu", ("MUFU",)),
    ("fp32", ("FADD", "FMUL", "FFMA", "FMNMX", "FSET", "FSETP", "FSEL", "FCHK", "FSWZADD",
              "F2F", "F2FP", "FRND", "HADD2", "HMUL2", "HFMA2", "HSET2", "HMNMX2")),
    ("memory", ("LDG", "LDGSTS", "LDS", "LDSM", "STS", "STG", "RED", "REDG", "ATOM", "ATOMG",
                "ATOMS", "UTMALDG", "UTMASTG", "UBLKCP", "LDGDEPBAR", "UTMAPF", "STSM", "LD",
                "ST")),
    ("barrier", ("BAR", "DEPBAR", "SYNCS", "WARPGROUP", "WARPSYNC", "MEMBAR", "ARRIVES",
                 "FENCE", "ERRBAR", "CCTL")),
)


def instructions(code):
    """`[(address, opcode, text)]` of a SASS listing (one kernel)."""
    out = []
    for line in code.splitlines():
        found = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)(.*?);",
                         line)
        if found:
            out.append((int(found.group(1), 16), found.group(2), found.group(3)))
    return out


def op_class(opcode):
    base = opcode.split(".")[0]
    for name, bases in CLASSES:
        if base in bases:
            return name
    return "other"


def main_loop(code):
    """The instructions of the innermost loop (a backward branch: its target
    to the branch) whose body holds the most tensor-core instructions; the
    whole kernel where no loop has any."""
    loops = tensor_loops(code)
    if not loops:
        return instructions(code)
    return max(loops, key=lambda body: sum(op_class(x[1]) == "tensor" for x in body))


def tensor_loops(code):
    """The innermost loops holding tensor-core instructions, in program order
    (JAX's Pallas softmax backward runs two in one kernel: dK/dV, then dQ)."""
    ins = instructions(code)
    loops = []
    for addr, op, text in ins:
        target = re.search(r"0x([0-9a-f]+)", text)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            body = [x for x in ins if lo <= x[0] <= addr]
            loops.append((lo, addr, body, sum(op_class(x[1]) == "tensor" for x in body)))
    inner = [loop for loop in loops if loop[3] and not any(
        o is not loop and loop[0] <= o[0] and o[1] <= loop[1] and o[3] for o in loops)]
    return [loop[2] for loop in sorted(inner)]


def mix(body):
    counts = {name: 0 for name, _ in CLASSES}
    counts["other"] = 0
    for _, op, _ in body:
        counts[op_class(op)] += 1
    counts["total"] = len(body)
    return counts


def issued_macs(body, warps):
    """Tensor-core multiply-adds a CTA of `warps` warps issues in `body`."""
    from keras_reluvit.kernels.inspection import tensor_core_macs

    return tensor_core_macs(" ".join(op for _, op, _ in body), warps)


# Dense peak rates per SM per clock on an H100 / H200 (sm_90).
RATES = dict(tensor_bf16=2048, mufu=16, fp32=128, issue=4)


def model(counts, macs, warps):
    """Cycles per main-loop iteration on one SM: the overlap and serial bounds."""
    w = warps
    tensor = macs / RATES["tensor_bf16"]
    mufu = counts["mufu"] * w * 32 / RATES["mufu"]
    fp32 = counts["fp32"] * w * 32 / RATES["fp32"]
    issue = counts["total"] * w / RATES["issue"]
    rest_issue = (counts["total"] - counts["tensor"]) * w / RATES["issue"]
    return dict(tensor=tensor, mufu=mufu, fp32=fp32, issue=issue,
                overlap=max(tensor, mufu, fp32, issue),
                serial=tensor + max(mufu, fp32, rest_issue))


# --- compiling ----------------------------------------------------------------------------
def loop_facts(body, warps):
    """Two things the model does not cost, shown beside it: the share of the
    loop's tensor-core work issued as warp-level HMMA (`mma.sync`) rather
    than warpgroup HGMMA, and its CTA barriers (`BAR.SYNC`)."""
    macs = issued_macs(body, warps)
    hmma = issued_macs([x for x in body if x[1].startswith("HMMA")], warps)
    return (hmma / macs if macs else 0.0), sum(op.startswith("BAR.SYNC") for _, op, _ in body)


def _row(kind, kernel, compiled, report, bq, bk, tile_macs, body=None):
    from keras_reluvit.kernels.inspection import sass

    warps = compiled.metadata.num_warps
    body = main_loop(sass(compiled)) if body is None else body
    counts = mix(body)
    macs = issued_macs(body, warps)
    hmma_share, cta_barriers = loop_facts(body, warps)
    return dict(kind=kind, kernel=kernel, block_q=bq, block_k=bk, warps=warps,
                stages=compiled.metadata.num_stages, registers=report.get("registers"),
                spill_stores=report.get("spill_stores"), shared=compiled.metadata.shared,
                tile_macs=tile_macs, issued_macs=macs, hmma_share=hmma_share,
                cta_barriers=cta_barriers, mix=counts,
                model=model(counts, macs, warps))


def ours(d, tokens):
    """Our forward, fused backward ("bwd": 5 dots, dQ added atomically) and
    deterministic backward ("dkdv" 4 dots + "dq" 3 dots), every autotuning
    config, as launched."""
    from keras_reluvit.kernels import inspection as kt

    rows = []
    for deterministic in (False, True):
        for name, compiled, report in kt.compile_for(("cuda", 90, 32), dtype="bf16", head_dim=d,
                                                     tokens=tokens, deterministic=deterministic,
                                                     with_forward=not deterministic):
            if name == "_dq_rows_kernel":
                continue
            const = {compiled.src.fn.arg_names[i[0]]: v
                     for i, v in compiled.src.constants.items()}
            bq, bk = const["BLOCK_Q"], const["BLOCK_K"]
            kernel, dots = {"_forward_kernel": ("fwd", 2), "_dq_kernel": ("dq", 3),
                            "_backward_kernel": ("dkdv", 4) if deterministic else ("bwd", 5)}[name]
            rows.append(_row("relu", kernel, compiled, report, bq, bk, dots * bq * bk * d))
    return rows


def reference(d, tokens):
    """The softmax reference's forward, dK/dV and dQ kernels, every config."""
    import torch

    from keras_reluvit.kernels import inspection as kt

    b, h = 2, 6
    qkv = torch.zeros(b, tokens, 3, h, d, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    o = torch.zeros(b, tokens, h, d, dtype=torch.bfloat16)
    lse = torch.zeros(b * h, tokens)
    strides = (q.stride(0), q.stride(1), q.stride(2))
    scale = 1.0 / math.sqrt(d)
    launches = {
        "fwd": (_softmax_fwd, lambda bq, bk: (q, k, v, o, lse, *strides, h, tokens, tokens,
                                               scale * LOG2E), 2),
        "dkdv": (_softmax_dkdv, lambda bq, bk: (q, k, v, o, lse, lse, o, o, *strides, h,
                                                 tokens, tokens, scale, scale * LOG2E), 4),
        "dq": (_softmax_dq, lambda bq, bk: (q, k, v, o, lse, lse, o, *strides, h, tokens,
                                             tokens, scale, scale * LOG2E), 3),
    }
    rows = []
    for kernel, (fn, args, dots) in launches.items():
        for bq, bk, warps, stages in SOFTMAX_CONFIGS[(kernel, d > 64)]:
            with kt.compiling(("cuda", 90, 32)) as log:
                compiled = fn.warmup(*args(bq, bk), D=d, BLOCK_Q=bq, BLOCK_K=bk,
                                     num_warps=warps, num_stages=stages, grid=(1,))
            report = next(iter(kt.ptxas_reports(log.getvalue()).values()))[0]
            rows.append(_row("softmax", kernel, compiled, report, bq, bk, dots * bq * bk * d))
    return rows


def pass_cycles(row, t, s, bound):
    """Main-loop cycles of one pass over (t queries, s keys) of one head (a
    kernel of several loops, JAX's Pallas softmax backward: their sum)."""
    return sum(math.ceil(t / p["block_q"]) * math.ceil(s / p["block_k"]) * p["model"][bound]
               for p in row.get("loops", [row]))


def best(rows, kind, kernel, t, s, bound):
    """The spill-free config with the fewest modelled cycles for a pass over
    (t, s): the autotuner's choice (its key holds T and S), so a tile that
    fits 197 tokens with less padding wins there."""
    found = [r for r in rows if r["kind"] == kind and r["kernel"] == kernel and r["spill_stores"] == 0]
    return min(found, key=lambda r: (pass_cycles(r, t, s, bound), r["warps"]))


def ratios(rows, lengths, relu="relu", softmax="softmax", softmax_bwd=("dkdv", "dq")):
    """Per L: the modelled softmax / ReLU-L time of the forward, forward +
    our fused backward, forward + our deterministic backward (dK/dV + dQ);
    the softmax backward is the sum of its `softmax_bwd` kernels."""
    out = []
    for n in lengths:
        entry = dict(L=n)
        for bound in ("overlap", "serial"):
            picked = {(kind, kernel): best(rows, kind, kernel, n, n, bound)
                      for kind, kernel in [(relu, "fwd"), (relu, "bwd"), (relu, "dkdv"), (relu, "dq"),
                                           (softmax, "fwd")] + [(softmax, k) for k in softmax_bwd]}
            c = {key: pass_cycles(row, n, n, bound) for key, row in picked.items()}
            soft = c[softmax, "fwd"] + sum(c[softmax, k] for k in softmax_bwd)
            entry[bound] = dict(
                fwd=c[softmax, "fwd"] / c[relu, "fwd"],
                fwd_bwd=soft / (c[relu, "fwd"] + c[relu, "bwd"]),
                fwd_bwd_deterministic=soft / (c[relu, "fwd"] + c[relu, "dkdv"] + c[relu, "dq"]),
                tiles={f"{kind} {kernel}": tile_name(row) for (kind, kernel), row in picked.items()})
        out.append(entry)
    return out


def tile_name(row):
    return " + ".join(f"{p['block_q']}x{p['block_k']}" for p in row.get("loops", [row])) + \
        f"/{row['warps']}w"


# --- the Pallas kernels (JAX on CUDA) -------------------------------------------------------
# Lowered for CUDA by Pallas' Triton backend, its Triton IR compiled here with Triton's own
# compiler (XLA compiles it with the Triton it bundles) at the warps and stages the launch
# hands XLA. Our kernel's blocks are not autotuned (`GPU_BLOCKS` / `GPU_WARPS`); JAX's
# softmax (`jax.experimental.pallas.ops.gpu.attention.mha`) takes `BlockSizes`: its
# defaults first, then a few others, the best per L taken as for the Triton kernels.
PALLAS_TOKENS = 4096  # a multiple of every block (JAX's kernel needs it); loops stay loops
JAX_FWD_BLOCKS = [(128, 128), (64, 64), (128, 64), (64, 128)]
JAX_BWD_BLOCKS = [(32, 32, 32, 32), (64, 64, 64, 64), (32, 64, 64, 32), (64, 32, 32, 64)]


def pallas_compiled(loss, args):
    """`[(kernel name, compiled, ptxas report)]`: the Triton modules Pallas
    hands XLA when `loss(q, k, v)` and its gradient are lowered for CUDA,
    each compiled for sm_90a with its launch's warps and stages
    (tests/helpers/pallas_ir.py, which the Pallas build test shares)."""
    import jax

    sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))
    from pallas_ir import compile_for_sm90

    return [(name, compiled, report) for name, _, compiled, report in
            compile_for_sm90(jax.value_and_grad(loss, argnums=(0, 1, 2)), *args)]


def _pallas_args(d):
    import jax
    import jax.numpy as jnp

    q = jax.ShapeDtypeStruct((1, PALLAS_TOKENS, 2, d), jnp.bfloat16)
    return q, q, q


def pallas_ours(d):
    """Our Pallas kernels on CUDA, bfloat16, no mask: forward, the fused
    backward, the deterministic dK/dV and dQ; their `GPU_BLOCKS` tiles."""
    import jax.numpy as jnp

    from keras_reluvit.kernels import pallas as pa

    q = _pallas_args(d)[0]
    blocks = pa.GPU_BLOCKS[pa._row_class(pa._row_bytes(q, q, None))]
    rows = []
    for deterministic in (False, True):
        def loss(q, k, v):
            y = pa.attention(q, k, v, "relu", 1.0 / PALLAS_TOKENS, deterministic=deterministic)
            return y.astype(jnp.float32).sum()

        for name, compiled, report in pallas_compiled(loss, _pallas_args(d)):
            kernel = name.rsplit("_", 1)[1]
            if deterministic and kernel == "fwd":
                continue
            bq, bk = blocks["dq" if kernel == "dq" else "bwd" if kernel in ("bwd", "dkdv") else "fwd"]
            dots = {"fwd": 2, "bwd": 5, "dkdv": 4, "dq": 3}[kernel]
            rows.append(_row("pallas relu", kernel, compiled, report, bq, bk, dots * bq * bk * d))
    return rows


def pallas_softmax(d):
    """JAX's Pallas softmax attention (`ops.gpu.attention.mha`), bfloat16:
    its forward, and its backward (one kernel: a dK/dV loop over query
    blocks, then a dQ loop over key blocks; 4 + 3 dots), per `BlockSizes`."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention as ja

    from keras_reluvit.kernels.inspection import sass

    rows = []
    for (bq, bk), bwd in zip(JAX_FWD_BLOCKS, JAX_BWD_BLOCKS):
        sizes = ja.BlockSizes(bq, bk, *bwd)

        def loss(q, k, v):
            return ja.mha(q, k, v, None, sm_scale=d ** -0.5, block_sizes=sizes).astype(jnp.float32).sum()

        for name, compiled, report in pallas_compiled(loss, _pallas_args(d)):
            if "preprocess" in name:
                continue  # the backward's row pass (delta), not modelled for either
            if "backward" not in name:
                rows.append(_row("pallas softmax", "fwd", compiled, report, bq, bk, 2 * bq * bk * d))
                continue
            loops = tensor_loops(sass(compiled))
            assert len(loops) == 2, f"{name}: {len(loops)} tensor-core loops, expected dK/dV and dQ"
            parts = [_row("pallas softmax", f"bwd: {k} loop", compiled, report, a, b, dots * a * b * d,
                          body=body)
                     for (k, a, b, dots), body in zip(
                         (("dkdv", bwd[0], bwd[1], 4), ("dq", bwd[2], bwd[3], 3)), loops)]
            rows += parts
            rows.append(dict(parts[0], kernel="bwd", loops=parts, hidden=True))
    return rows


def markdown(result):
    lines = [f"Triton {result['triton']}, target sm_90a (H100 / H200), bfloat16, no mask; "
             "modelled, not measured (benchmarks/kernels_static.py says how).", ""]
    for d, part in result["head_dims"].items():
        lines += _section(f"### Head dim {d}", part, "the Triton kernels")
    for d, part in result.get("pallas", {}).items():
        lines += _section(f"### Pallas on CUDA, head dim {d}", part,
                          f"the Pallas kernels (lowered for CUDA, compiled at {PALLAS_TOKENS} tokens; "
                          "the softmax side is JAX's `ops.gpu.attention.mha`)")
    return "\n".join(lines)


def _section(title, part, what):
    lines = [title, "",
              "| kind | kernel | tile | warps | regs | spill | smem KB | MMA issued / tile "
              "| of it on HMMA | tensor | MUFU | FP32 | memory | barrier (of it BAR.SYNC) | other "
              "| cycles/iter overlap | serial | cycles per 1k tile MACs |",
              "|" + "---|" * 18]
    for r in part["rows"]:
        if r.get("hidden"):
            continue
        m, c = r["model"], r["mix"]
        lines.append(
            f"| {r['kind']} | {r['kernel']} | {r['block_q']}x{r['block_k']} | {r['warps']} "
            f"| {r['registers']} | {r['spill_stores']} | {r['shared'] / 1024:.0f} "
            f"| {r['issued_macs'] / r['tile_macs']:.2f} | {r['hmma_share']:.0%} "
            f"| {c['tensor']} | {c['mufu']} "
            f"| {c['fp32']} | {c['memory']} | {c['barrier']} ({r['cta_barriers']}) | {c['other']} "
            f"| {m['overlap']:.0f} | {m['serial']:.0f} "
            f"| {1000 * m['overlap'] / r['tile_macs']:.2f} |")
    lines += ["", f"Modelled softmax / ReLU-L time of {what} (above 1: ReLU/L faster), per kernel the "
              "spill-free config with the fewest modelled cycles at that L (the autotuner's "
              "key holds T and S); fwd+bwd with our fused backward (5 dots, "
              "atomic dQ) and with our deterministic one (4 + 3 dots, as the reference):",
              "", "| L | fwd (overlap) | fwd+bwd (overlap) | deterministic (overlap) "
              "| fwd (serial) | fwd+bwd (serial) | deterministic (serial) |",
              "|---|---|---|---|---|---|---|"]
    for e in part["ratios"]:
        o, r = e["overlap"], e["serial"]
        lines.append(f"| {e['L']} | {o['fwd']:.2f} | {o['fwd_bwd']:.2f} "
                     f"| {o['fwd_bwd_deterministic']:.2f} | {r['fwd']:.2f} "
                     f"| {r['fwd_bwd']:.2f} | {r['fwd_bwd_deterministic']:.2f} |")
    names = list(part["ratios"][0]["overlap"]["tiles"])
    lines += ["", "The configs picked (overlap bound; block_q x block_k / warps):", "",
              "| L | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for e in part["ratios"]:
        lines.append(f"| {e['L']} | " + " | ".join(e["overlap"]["tiles"][k] for k in names) + " |")
    lines.append("")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only check the softmax reference's numerics (interpreter)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--lengths", default="197,785,1024,3137,4096")
    parser.add_argument("--skip-pallas", action="store_true", help="leave out the Pallas kernels (JAX)")
    args = parser.parse_args()
    if args.check:
        sys.exit(0 if check() else 1)
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("Unset TRITON_INTERPRET: this compiles for sm_90a.")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__, "--check"], env=env, capture_output=True,
                          text=True, timeout=600)
    print(proc.stdout.strip())
    if proc.returncode:
        sys.exit(f"The softmax reference is off: {proc.stdout}{proc.stderr[-2000:]}")
    lengths = [int(x) for x in args.lengths.split(",")]
    result = dict(triton=triton.__version__, rates=RATES, head_dims={})
    for d in (64, 128):
        rows = ours(d, 197) + reference(d, 197)
        result["head_dims"][d] = dict(rows=rows, ratios=ratios(rows, lengths))
    if not args.skip_pallas:
        result["pallas"] = {}
        for d in (64, 128):
            rows = pallas_ours(d) + pallas_softmax(d)
            result["pallas"][d] = dict(rows=rows, ratios=ratios(
                rows, lengths, "pallas relu", "pallas softmax", ("bwd",)))
    text = markdown(result)
    print(text)
    from benchmarks.common import write

    write(args.out, "kernels_static_sm90a", text, result)


if __name__ == "__main__":
    main()
