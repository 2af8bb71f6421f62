"""Would TMA make our Triton main loops leaner on sm_90? A static check, no GPU.

    python benchmarks/kernels_tma.py            # needs triton; ~1 min on 2 cores

Issue 40 asks for TMA descriptors (Triton's tensor-descriptor API) in the
main loops where the Triton version supports them on sm_90, else hoisted
address arithmetic. Triton 3.9 supports them. This script compiles, for
sm_90a and bfloat16, the main loops of our forward and fused backward
twice: as they ship (`kernels/triton.py`: pointer loads pipelined with
cp.async) and with the streamed tiles -- K and V in the forward, Q and dO in
the backward -- read through 4-D host `TensorDescriptor`s over the layer's
`(B, T, H, D)` views (TMA, zero-filled past the ends), everything else the
same (the library's own `_act`, `_mm`, `_load`, `_store`, the atomic dQ).
Both at the shipped autotuning configs (no mask, full blocks: the loop the
static benchmark models). It reports each main loop's instruction mix from
the SASS (`benchmarks/kernels_static.py`'s classes and model), registers and
spills, side by side, into `benchmarks/results/kernels_tma_sm90a.md`.

The TMA variants are checked against the shipped kernels in Triton's
interpreter first (`--check`, run automatically), so the comparison is
between two kernels that compute the same thing.

A third column, "TMA + warp_specialize": the same TMA loops as
`tl.range(..., warp_specialize=True)`, the one way Triton offers to split
loads from MMAs into producer / consumer warps (FlashAttention-3's
structure, which needs no CTA barrier between them). A config Triton fails
to compile that way is listed with its error. Each row counts the loop's
CTA barriers (`BAR.SYNC`) beside all its barrier-class instructions.
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from keras_reluvit.kernels.triton import _act  # noqa: E402
from keras_reluvit.kernels.triton import _act_grad  # noqa: E402
from keras_reluvit.kernels.triton import _batch_head  # noqa: E402
from keras_reluvit.kernels.triton import _load  # noqa: E402
from keras_reluvit.kernels.triton import _low  # noqa: E402
from keras_reluvit.kernels.triton import _mm  # noqa: E402
from keras_reluvit.kernels.triton import _store  # noqa: E402


@triton.jit
def _forward_tma(Q, KD, VD, OUT, sq_b, sq_t, sq_h, so_b, so_t, so_h, H, T, S, D, DV, o_fold,
                 ACT: tl.constexpr, UPCAST: tl.constexpr, BLOCK_Q: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, WS: tl.constexpr = False):
    # relu (positively homogeneous: the score scale is in o_fold), no mask.
    b, h = _batch_head(H)
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    q = _load(Q, b * sq_b + h * sq_h, rq, T, sq_t, rd, D, True, False)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    for start in tl.range(0, S, BLOCK_K, warp_specialize=WS):
        k = KD.load([b.to(tl.int32), start, h.to(tl.int32), 0]).reshape(BLOCK_K, BLOCK_D)
        v = VD.load([b.to(tl.int32), start, h.to(tl.int32), 0]).reshape(BLOCK_K, BLOCK_D)
        w = _act(_mm(q, tl.trans(k), None, "tf32", UPCAST), ACT)
        acc = _mm(_low(w, v.dtype, UPCAST), v, acc, "tf32", UPCAST)
    _store(OUT, acc * o_fold, b * so_b + h * so_h, rq, T, so_t, rd, D, False, UPCAST)


@triton.jit
def _backward_tma(QD, K, V, DOD, DQ, DK, DV_, sk_b, sk_s, sk_h, sdk_b, sdk_s, sdk_h, H, T, S, D,
                  o_fold, g_fold, ACT: tl.constexpr, UPCAST: tl.constexpr, BLOCK_Q: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, WS: tl.constexpr = False):
    # The fused backward (5 dots, dQ^T added atomically), relu, no mask,
    # T a multiple of BLOCK_Q; k / v / dk / dv share strides here.
    b, h = _batch_head(H)
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    rd = tl.arange(0, BLOCK_D)
    k = _load(K, b * sk_b + h * sk_h, rk, S, sk_s, rd, D, True, False)
    v = _load(V, b * sk_b + h * sk_h, rk, S, sk_s, rd, D, True, False)
    dq_base = (b * H + h) * BLOCK_D * T
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    for start in tl.range(0, T, BLOCK_Q, warp_specialize=WS):
        q = QD.load([b.to(tl.int32), start, h.to(tl.int32), 0]).reshape(BLOCK_Q, BLOCK_D)
        do = DOD.load([b.to(tl.int32), start, h.to(tl.int32), 0]).reshape(BLOCK_Q, BLOCK_D)
        s = _mm(k, tl.trans(q), None, "tf32", UPCAST)
        dv = _mm(_low(_act(s, ACT), q.dtype, UPCAST), do, dv, "tf32", UPCAST)
        ds = _low(_mm(v, tl.trans(do), None, "tf32", UPCAST) * _act_grad(s, ACT), q.dtype, UPCAST)
        dk = _mm(ds, q, dk, "tf32", UPCAST)
        rq = start + tl.arange(0, BLOCK_Q)
        tl.atomic_add(DQ + dq_base + rd[:, None] * T + rq[None, :],
                      _mm(tl.trans(k), ds, None, "tf32", UPCAST), sem="relaxed")
    _store(DK, dk * g_fold, b * sdk_b + h * sdk_h, rk, S, sdk_s, rd, D, False, UPCAST)
    _store(DV_, dv * o_fold, b * sdk_b + h * sdk_h, rk, S, sdk_s, rd, D, False, UPCAST)


def _inputs(torch, d, tokens, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, tokens, 3, 2, d, generator=g).to(dtype)
    do = torch.randn(2, tokens, 2, d, generator=g).to(dtype)
    return (*qkv.unbind(2), do)


def _descriptor(x, rows):
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, rows, 1, x.shape[-1]])


def tma_launch(fn, d, tokens, bq, bk, q, k, v, do, warmup=None, ws=False):
    """Runs (or with `warmup=dict(num_warps, num_stages)` compiles) one TMA
    variant: the forward's output, or the backward's (dQ^T, dK, dV); `ws`:
    its loop warp-specialised."""
    import torch

    b, t, h, _ = q.shape
    scale = d ** -0.5
    launch = (lambda kernel, grid: lambda *a, **kw: kernel.warmup(*a, grid=(1,), **warmup, **kw)) \
        if warmup else (lambda kernel, grid: kernel[grid])
    if fn == "fwd":
        o = torch.zeros(b, t, h, d, dtype=q.dtype)
        out = launch(_forward_tma, (triton.cdiv(t, bq), b * h))(
            q, _descriptor(k, bk), _descriptor(v, bk), o, *q.stride()[:3], *o.stride()[:3], h, t, t,
            d, d, scale / t, ACT=0, UPCAST=q.dtype == torch.bfloat16 and not warmup,
            BLOCK_Q=bq, BLOCK_K=bk, BLOCK_D=d, WS=ws)
        return out if warmup else o
    dqt = torch.zeros(b, h, d, t)
    dk, dv = torch.zeros(b, t, h, d, dtype=q.dtype), torch.zeros(b, t, h, d, dtype=q.dtype)
    out = launch(_backward_tma, (triton.cdiv(t, bk), b * h))(
        _descriptor(q, bq), k, v, _descriptor(do, bq), dqt, dk, dv, *k.stride()[:3],
        *dk.stride()[:3], h, t, t, d, scale / t, scale / t, ACT=0,
        UPCAST=q.dtype == torch.bfloat16 and not warmup, BLOCK_Q=bq, BLOCK_K=bk, BLOCK_D=d, WS=ws)
    return out if warmup else (dqt * scale / t, dk, dv)


def check():
    """The TMA variants against the shipped kernels (interpreter), bf16,
    d = 64, 128 tokens: largest difference relative to the output's scale."""
    import json

    import torch

    from keras_reluvit.kernels import triton as kt

    q, k, v, do = _inputs(torch, 64, 128, torch.bfloat16)
    errors = []
    y = kt.forward(q, k, v, 1.0 / 128, None, "relu", block_q=64, block_k=32)
    ours = tma_launch("fwd", 64, 128, 64, 32, q, k, v, do)
    errors.append(float((ours.float() - y.float()).abs().max() / y.float().abs().max()))
    dq, dk, dv, _ = kt.backward(q, k, v, 1.0 / 128, None, y, do, "relu", block_q=32, block_k=64)
    dqt, dk2, dv2 = tma_launch("bwd", 64, 128, 32, 64, q, k, v, do)
    for ref, got in ((dq, dqt.permute(0, 3, 1, 2)), (dk, dk2), (dv, dv2)):
        errors.append(float((got.float() - ref.float()).abs().max() / ref.float().abs().max()))
    print(json.dumps(dict(errors=errors)))
    return max(errors) < 2e-2


def compare():
    """Per shipped config: the shipped kernel's main loop and the TMA one's."""
    import torch

    from benchmarks import kernels_static as ks
    from keras_reluvit.kernels import inspection as kt
    from keras_reluvit.kernels.inspection import sass

    rows = []
    for d in (64, 128):
        q, k, v, do = _inputs(torch, d, 256, torch.bfloat16)
        for name, compiled, report in kt.compile_for(("cuda", 90, 32), dtype="bf16", head_dim=d,
                                                     tokens=256):
            kind = {"_forward_kernel": "fwd", "_backward_kernel": "bwd"}.get(name)
            if kind is None:
                continue
            const = {compiled.src.fn.arg_names[i[0]]: val for i, val in compiled.src.constants.items()}
            bq, bk = const["BLOCK_Q"], const["BLOCK_K"]
            dots = 2 if kind == "fwd" else 5
            meta = dict(num_warps=compiled.metadata.num_warps, num_stages=compiled.metadata.num_stages)

            def row(label, kernel, ptxas):
                # one cuobjdump per kernel; warp specialisation shows as
                # producer / consumer register reallocation (setmaxnreg:
                # USETMAXREG) and loops of its own
                code = sass(kernel)
                return dict(ks._row(label, kind, kernel, ptxas, bq, bk, dots * bq * bk * d,
                                    body=ks.main_loop(code)),
                            head_dim=d, mma_loops=len(ks.tensor_loops(code)),
                            setmaxnreg="USETMAXREG" in code)

            rows.append(row("shipped (cp.async)", compiled, report))
            for label, ws in (("TMA", False), ("TMA + warp_specialize", True)):
                try:
                    with kt.compiling(("cuda", 90, 32)) as log:
                        tma = tma_launch(kind, d, 256, bq, bk, q, k, v, do, warmup=meta, ws=ws)
                except Exception as error:  # noqa: BLE001 -- Triton's pass failures: reported
                    rows.append(dict(kind=label, kernel=kind, block_q=bq, block_k=bk, head_dim=d,
                                     warps=meta["num_warps"],
                                     error=f"{type(error).__name__}: {str(error).splitlines()[0]}"))
                    continue
                rows.append(row(label, tma, next(iter(kt.ptxas_reports(log.getvalue()).values()))[0]))
    return rows


def markdown(rows):
    lines = [f"Triton {triton.__version__}, sm_90a, bfloat16, relu, no mask, 256 tokens; each main "
             "loop's SASS counted as in `kernels_static.py` (modelled, not measured).", "",
             "| d | kernel | tile / warps | loads | regs | spill | tensor | FP32 | memory "
             "| barrier (of it BAR.SYNC) | other | total | cycles/iter overlap | serial "
             "| loops with MMAs | setmaxnreg |", "|" + "---|" * 16]
    for r in rows:
        head = (f"| {r['head_dim']} | {r['kernel']} | {r['block_q']}x{r['block_k']} / "
                f"{r['warps']} | {r['kind']} ")
        if "error" in r:
            lines.append(head + f"| not compiled: {r['error'][:120]} |" + " |" * 11)
            continue
        m, c = r["model"], r["mix"]
        lines.append(head + f"| {r['registers']} | {r['spill_stores']} "
                     f"| {c['tensor']} | {c['fp32']} | {c['memory']} "
                     f"| {c['barrier']} ({r['cta_barriers']}) | {c['other']} "
                     f"| {c['total']} | {m['overlap']:.0f} | {m['serial']:.0f} "
                     f"| {r['mma_loops']} | {'yes' if r['setmaxnreg'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only the interpreter check")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args()
    if args.check:
        sys.exit(0 if check() else 1)
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("Unset TRITON_INTERPRET: this compiles for sm_90a.")
    proc = subprocess.run([sys.executable, __file__, "--check"], capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600)
    print(proc.stdout.strip())
    if proc.returncode:
        sys.exit(f"The TMA variants differ from the shipped kernels: {proc.stdout}{proc.stderr[-2000:]}")
    rows = compare()
    text = markdown(rows)
    print(text)
    from benchmarks.common import write

    write(args.out, "kernels_tma_sm90a", text, dict(triton=triton.__version__, rows=rows))


if __name__ == "__main__":
    main()
