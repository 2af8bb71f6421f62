"""The static kernel benchmark's parts (benchmarks/kernels_static.py): its
softmax FlashAttention-2 reference computes softmax attention (against
PyTorch's float64 SDPA, in Triton's interpreter), and its SASS reading and
throughput model count what a hand-made listing holds."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

# The shape of cuobjdump's listing: a main loop (0x0100-0x0200) with two
# warpgroup MMAs, an exp, FP32 and memory work, inside an outer loop
# (0x0080-0x0300) that holds one more MMA, and the end-of-kernel self-branch.
LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0080*/                   IMAD R2, R3, R4, R5 ;
        /*0100*/                   LDS.128 R8, [R2] ;
        /*0110*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0120*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0130*/                   MUFU.EX2 R9, R9 ;
        /*0140*/                   FFMA R10, R9, R11, R12 ;
        /*0150*/                   FMNMX R13, R10, R14, !PT ;
        /*0160*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0170*/                   IADD3 R2, R2, 0x80, RZ ;
        /*0180*/                   ISETP.GE.AND P0, PT, R2, R7, PT ;
        /*0200*/              @!P0 BRA 0x100 ;
        /*0280*/                   HGMMA.64x32x16.F32.BF16 R40, gdesc[UR4], RZ, gsb0 ;
        /*0300*/               @P1 BRA 0x80 ;
        /*0310*/                   STG.E.128 desc[UR4][R20.64], R24 ;
        /*0320*/                   EXIT ;
        /*0330*/                   BRA 0x330;
"""


def test_main_loop_mix_and_model_of_a_listing():
    from benchmarks import kernels_static as ks

    body = ks.main_loop(LISTING)
    assert [addr for addr, _, _ in body] == [0x100, 0x110, 0x120, 0x130, 0x140, 0x150, 0x160,
                                            0x170, 0x180, 0x200]  # the inner loop
    counts = ks.mix(body)
    assert counts == dict(tensor=2, mufu=1, fp32=2, memory=1, barrier=1, other=3, total=10)
    macs = ks.issued_macs(body, warps=8)  # two warpgroups each issue both
    assert macs == 2 * 64 * 64 * 16 * 2
    m = ks.model(counts, macs, warps=8)
    assert m["tensor"] == macs / 2048                  # 128 cycles
    assert m["mufu"] == 1 * 8 * 32 / 16                # 16
    assert m["fp32"] == 2 * 8 * 32 / 128               # 4
    assert m["issue"] == 10 * 8 / 4                    # 20
    assert m["overlap"] == 128 and m["serial"] == 128 + (10 - 2) * 8 / 4
    # an HMMA (warp-level) loop: 16 x 8 x 16 per instruction and warp
    hmma = "        /*0010*/   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n" \
           "        /*0020*/   @P0 BRA 0x10 ;\n"
    assert ks.issued_macs(ks.main_loop(hmma), warps=4) == 16 * 8 * 16 * 4
    assert ks.loop_facts(body, warps=8) == (0.0, 1)  # no HMMA, one BAR.SYNC
    mixed = "        /*0010*/   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ, gsb0 ;\n" \
            "        /*0020*/   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n" \
            "        /*0030*/   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n" \
            "        /*0040*/   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n" \
            "        /*0050*/   MEMBAR.ALL.GPU ;\n" \
            "        /*0060*/   @P0 BRA 0x10 ;\n"
    # 4 warps: one warpgroup issues the HGMMA once (32768 MACs), each warp the HMMA (4 x 2048)
    share, barriers = ks.loop_facts(ks.main_loop(mixed), warps=4)
    assert share == 4 * 2048 / (64 * 32 * 16 + 4 * 2048) and barriers == 2  # a fence is not one


def test_the_softmax_reference_equals_sdpa_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", KERAS_BACKEND="torch")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "kernels_static.py"),
                           "--check"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])["errors"]
    assert len(errors) == 4 and max(errors) < 1e-4, errors  # output, dq, dk, dv


def test_the_model_picks_each_lengths_config_as_the_autotuner_would():
    from benchmarks import kernels_static as ks

    def row(kind, kernel, bq, bk, cycles, spill=0):
        return dict(kind=kind, kernel=kernel, block_q=bq, block_k=bk, warps=8, spill_stores=spill,
                    model=dict(overlap=cycles, serial=2 * cycles))

    # Equal cycles per tile element; at 197 tokens a 32-row tile pads 197 to 224, a 64-row one
    # to 256; a faster config that spills is never taken.
    rows = [row("relu", "bwd", 64, 128, 1280), row("relu", "bwd", 32, 128, 640),
            row("relu", "bwd", 128, 128, 1000, spill=8)]
    assert ks.best(rows, "relu", "bwd", 197, 197, "overlap")["block_q"] == 32
    assert ks.pass_cycles(rows[1], 197, 197, "overlap") == 7 * 2 * 640
    assert ks.best(rows, "relu", "bwd", 1024, 1024, "overlap")["block_q"] in (32, 64)
    rows += [row(k, n, 64, 64, 100) for k, n in (("relu", "fwd"), ("relu", "dkdv"), ("relu", "dq"))]
    rows += [row("softmax", n, 64, 64, c) for n, c in (("fwd", 150), ("dkdv", 100), ("dq", 100))]
    (e,) = ks.ratios(rows, [197])
    relu_bwd = 7 * 2 * 640
    assert e["overlap"]["fwd"] == 1.5
    assert e["overlap"]["fwd_bwd"] == (16 * 350) / (16 * 100 + relu_bwd)
    assert e["overlap"]["fwd_bwd_deterministic"] == 350 / 300
    assert e["overlap"]["tiles"]["relu bwd"] == "32x128/8w"


def test_a_kernel_of_two_loops_is_modelled_as_their_sum():
    """JAX's Pallas softmax backward runs a dK/dV loop, then a dQ loop, in one
    kernel: both are found, in program order, and a pass costs both."""
    from benchmarks import kernels_static as ks

    two = ("        /*0010*/   HGMMA.64x64x16.F32.BF16 R4, gdesc[UR4], R4 ;\n"
           "        /*0020*/   HGMMA.64x64x16.F32.BF16 R4, gdesc[UR4], R4 ;\n"
           "        /*0030*/   @P0 BRA 0x10 ;\n"
           "        /*0040*/   IADD3 R2, R2, 0x1, RZ ;\n"
           "        /*0050*/   HGMMA.64x32x16.F32.BF16 R8, gdesc[UR4], R8 ;\n"
           "        /*0060*/   @P1 BRA 0x50 ;\n")
    loops = ks.tensor_loops(two)
    assert [[addr for addr, _, _ in body] for body in loops] == [[0x10, 0x20, 0x30], [0x50, 0x60]]
    assert ks.main_loop(two) == loops[0]  # the one with the most MMAs
    parts = [dict(block_q=32, block_k=64, model=dict(overlap=10.0)),
             dict(block_q=64, block_k=16, model=dict(overlap=3.0))]
    row = dict(parts[0], loops=parts)
    assert ks.pass_cycles(row, 128, 128, "overlap") == 4 * 2 * 10 + 2 * 8 * 3
