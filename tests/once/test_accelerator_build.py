"""The Triton kernels, and the Triton IR that the Pallas kernel lowers to for
CUDA, compile ahead of time for an H100/H200 (sm_90) with Triton's own
compiler, without a GPU, and fit its shared memory; and Triton is never
loaded after TensorFlow (that order aborts the process): the dispatch says
so instead."""

import json
import os
import subprocess
import sys

import pytest
from helpers.triton_table import check

pytest.importorskip("triton")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    e.update(KERAS_BACKEND="torch", TRITON_DEFAULT_FP_FUSION="1")
    e.update(extra)
    return e


def test_triton_kernels_compile_for_sm90a_as_launched_without_spills():
    """The 16-bit class (bfloat16) of the table's representative subset
    (`triton_table.SUBSET`; the whole table: `triton_table.py --full`);
    float32 runs in the PyTorch lane (tests/test_accelerator_kernels.py), to
    share the compile time between CI's two lanes."""
    check("bf16")


# The Pallas kernel on CUDA: Pallas hands XLA a Triton IR module per kernel;
# captured as text (through a private jax function: jax 0.10's Pallas Triton
# lowering) and compiled for sm_90 with the kernel's warps and stages
# (tests/helpers/pallas_ir.py).
PALLAS_CUDA = r"""
import json, os, sys
import jax, jax.numpy as jnp
from keras_reluvit.kernels import pallas as pa

sys.path.insert(0, os.environ["HELPERS"])
from pallas_ir import compile_for_sm90
from keras_reluvit.kernels.inspection import mma_work

out = {}
# Each dtype, head dim (64, 80, 128, 256), mask kind and the deterministic backward;
# the largest tiles (float32, d = 128, a full mask) both ways.
VARIANTS = [("bfloat16", 64, None, 197, False), ("bfloat16", 128, "key", 785, False),
            ("float32", 128, "key", 785, True), ("float32", 256, None, 197, False),
            ("bfloat16", 80, None, 257, False), ("bfloat16", 64, "key", 785, True),
            ("float32", 128, "full", 197, True), ("float32", 128, "full", 197, False)]
for dtype, d, mask, t, deterministic in VARIANTS:
    q = jax.ShapeDtypeStruct((2, t, 2, d), jnp.dtype(dtype))
    r = jax.ShapeDtypeStruct((2, t, 2, 1), jnp.float32)
    m = {None: (), "key": (jax.ShapeDtypeStruct((2, 1, t), jnp.bool_),),
         "full": (jax.ShapeDtypeStruct((2, t, t), jnp.bool_),)}[mask]

    def loss(q, k, v, r, *m):
        y = pa.attention(q, k, v, "gelu", r, mask=m[0] if m else None,
                         deterministic=deterministic)
        return y.astype(jnp.float32).sum()

    for name, text, k, report in compile_for_sm90(
            jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), q, q, q, r, *m):
        # Memory ops without a mask operand (tt.load ptr[, mask[, other]];
        # tt.store ptr, value[, mask]): the kernels read and write the
        # layer's arrays in place, so every access must be masked.
        ops = [line.split(" : ")[0] for line in text.splitlines()
               if "tt.load " in line or "tt.store " in line]
        unmasked = [o for o in ops if o.count(",") < (2 if "tt.store" in o else 1)]
        out[f"{dtype}/{d}/{mask}/{name}"] = dict(dots=text.count("tt.dot "),
            atomics=text.count("tt.atomic_rmw"),
            cubin=len(k.asm["cubin"]), ptx_target=".target sm_90" in k.asm["ptx"],
            shared=k.metadata.shared, memory_ops=len(ops), unmasked=len(unmasked),
            warps=k.metadata.num_warps, mma=mma_work(k), spill_stores=report["spill_stores"])
print(json.dumps(out))
"""


def test_pallas_kernels_compile_for_sm90_and_fit_shared_memory():
    """What the CUDA lowering check (tests/test_accelerator_kernels.py)
    leaves to the GPU: the Pallas kernels' Triton IR through Triton's own
    pipeline to an sm_90 cubin. Shared memory within an A100's 164 KB (an
    H100/H200 has 227 KB): 128 x 128 blocks at float32, d = 128 needed
    320-384 KB before the CUDA block caps (`GPU_BLOCKS`). On CUDA the
    kernels read the (B, T, H, D) arrays in place, token counts and head
    dims not padded: every load and store in the IR carries a mask (an
    unmasked one would touch memory past the arrays on a GPU, which
    Pallas' interpreter, padding the arrays, would not show). XLA compiles
    the IR with the Triton it bundles, not this one: a strong check, not
    the same binary."""
    proc = subprocess.run([sys.executable, "-c", PALLAS_CUDA],
                          env=env(KERAS_BACKEND="jax",
                                  HELPERS=os.path.join(os.path.dirname(__file__), "..",
                                                       "helpers")),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # 5 variants x (fwd, bwd) + 3 deterministic ones x (fwd, dkdv, dq); the
    # two float32 d = 128 general-mask variants share their forward's name
    assert len(result) == 18, sorted(result)
    print("\n".join(f"{v}: {k['dots']} dots, {k['warps']} warps, {k['spill_stores']} bytes "
                    f"spilled, {k['shared']} B shared, MMA work x{k['mma']}"
                    for v, k in result.items()))
    for variant, k in result.items():
        assert k["cubin"] > 10_000 and k["ptx_target"], (variant, k)
        assert 0 < k["shared"] <= 164 * 1024, (variant, k)
        assert k["memory_ops"] >= 4 and k["unmasked"] == 0, (variant, k)
        # ptxas' report: no kernel spills (8 warps and the backward's caps,
        # `GPU_BLOCKS`; with 4 warps and 128 x 128 tiles the old dK/dV
        # kernel spilled 3172 bytes at bf16, d = 64).
        assert k["spill_stores"] == 0, (variant, k)
        # Dots per tile: the forward 2; the backward 5 in one pass, dQ
        # added atomically (FlashAttention-2); deterministic 4 + 3, no atomics.
        kind = variant.rsplit("_", 1)[1]
        assert k["dots"] == {"fwd": 2, "bwd": 5, "dkdv": 4, "dq": 3}[kind], (variant, k)
        assert (k["atomics"] > 0) == (kind == "bwd"), (variant, k)
        # The tensor-core work the SASS issues is the tiles' FLOPs (no 64-row
        # dot on 8 warps, no 16-row tile on 8 warps: GPU_BLOCKS / GPU_WARPS)
        # -- except, listed in docs/kernels.md, head dims above 128 (8 warps)
        # and the backward at 1024-byte rows (16 x 16 tiles, 1.4-1.5x: 32 x 16 spills).
        duplicated = ("float32/256/None/", "float32/128/full/pointwise_attention_bwd",
                      "float32/128/full/pointwise_attention_dkdv")
        if variant.startswith(duplicated):
            assert 1.0 < k["mma"] <= 3.0, (variant, k)
        else:
            assert k["mma"] == 1.0, (variant, k)
    deterministic = [v for v in result if v.endswith(("_dkdv", "_dq"))]
    assert len(deterministic) == 6, deterministic


GUARD = r"""
import sys
import tensorflow  # first: Triton may no longer load in this process
import keras_reluvit as kr
from keras_reluvit import kernels
assert "triton" not in sys.modules
try:
    kernels.triton_module()
except RuntimeError as e:
    print("ERROR:", e)
print("alive", "triton" in sys.modules)
"""


def test_triton_after_tensorflow_is_refused_not_an_abort():
    """(Here on the JAX backend: Keras' torch backend itself loads Triton,
    through torch._dynamo, and aborts if TensorFlow came first.)"""
    proc = subprocess.run([sys.executable, "-c", GUARD], env=env(KERAS_BACKEND="jax"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TensorFlow was imported before Triton" in proc.stdout
    assert "alive False" in proc.stdout


def test_triton_kernel_beside_tensorflow_when_keras_comes_first():
    """The PyTorch user's order: keras_reluvit, then tf.data / tfds."""
    code = ("import keras_reluvit, sys, tensorflow, numpy as np\n"
            "q = np.ones((1, 4, 1, 16), 'float32')\n"
            "with keras_reluvit.use_kernel('triton'):\n"
            "    print(float(keras_reluvit.pointwise_attention(q, q, q).sum()))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env(TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # relu(q.k / 4) = 4 for all 4 keys, times 1/L = 1/4: 4 per output entry.
    assert float(proc.stdout.strip().splitlines()[-1]) == pytest.approx(4 * 16 * 4.0)


@pytest.mark.full_only(
    "The accelerator benchmark's smoke run (~60 s): its kernels are checked against the "
    "generic path in test_accelerator_kernels / test_accelerator_build.")
def test_accelerator_benchmark_runs_end_to_end_in_smoke_mode(tmp_path):
    """benchmarks/accelerator.py at tiny sizes on this CPU (kernels
    interpreted): the kernel check passes and every row of both backends is
    measured, the table and its file are written. The real run needs a GPU
    (README)."""
    out = tmp_path / "table.md"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "accelerator.py")
    e = env()
    e.pop("KERAS_BACKEND")
    proc = subprocess.run([sys.executable, script, "--smoke", "--out", str(out)], env=e,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "## Errors" not in text, text
    check, timed = text.split("## Attention")
    check = [line for line in check.splitlines() if line.startswith(("| jax |", "| torch |"))]
    rows = [line for line in timed.splitlines() if line.startswith(("| jax |", "| torch |"))]
    # The check: 3 cases x 2 dtypes per backend, each within tolerance.
    assert len(check) == 12 and all(line.endswith("| yes |") for line in check), check
    # bf16 at 2 lengths and fp32 at one, x 2 modes per backend, plus one ViT row each.
    assert sum(r.startswith("| jax |") for r in rows) == 7
    assert sum(r.startswith("| torch |") for r in rows) == 7
    assert "(softmax sdpa)" in text and "(softmax xla)" in text
    # JAX's Pallas softmax control, where its blocks divide L (64 here): a time.
    control = [r.split("|")[11].strip() for r in rows
               if r.startswith("| jax | bfloat16 | 16 |") and "| 64 |" in r]
    assert len(control) == 2 and all(c.replace(".", "").isdigit() for c in control), control
