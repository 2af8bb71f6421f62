"""The Triton kernels compile ahead of time for an H100/H200 (sm_90) with
Triton's own compiler, without a GPU; and Triton is never loaded after
TensorFlow (that order aborts the process): the dispatch says so instead."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

COMPILE = r"""
import json, os
from keras_reluvit import triton_attention as ta
assert not ta.interpreting()
out = {}
for dtype, mask, act, d in (("bf16", False, "relu", 64), ("fp32", True, "gelu", 128),
                            ("fp16", False, "sigmoid", 32)):
    kernels = ta.compile_for(("cuda", 90, 32), activation=act, dtype=dtype, mask=mask, head_dim=d)
    out[f"{dtype}/{mask}/{act}/{d}"] = {
        name: dict(cubin=len(k.asm["cubin"]), ptx_target=".target sm_90" in k.asm["ptx"],
                   shared=k.metadata.shared, warps=k.metadata.num_warps)
        for name, k in kernels.items()}
print(json.dumps(out))
"""


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    e.update(KERAS_BACKEND="torch", TRITON_DEFAULT_FP_FUSION="1")
    e.update(extra)
    return e


def test_triton_kernels_compile_for_sm90_without_a_gpu():
    proc = subprocess.run([sys.executable, "-c", COMPILE], env=env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result) == 3
    for variant, kernels in result.items():
        assert sorted(kernels) == ["dkdv_kernel", "dq_kernel", "forward_kernel"], variant
        for name, k in kernels.items():
            assert k["cubin"] > 10_000 and k["ptx_target"], (variant, name, k)
            assert 0 < k["shared"] <= 227 * 1024, (variant, name, k)  # fits an H100's SMEM


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


def test_accelerator_benchmark_runs_end_to_end_in_smoke_mode(tmp_path):
    """benchmarks/accelerator.py at tiny sizes on this CPU (kernels
    interpreted): every row of both backends is measured, the table and
    its file are written. The real run needs a GPU (README)."""
    out = tmp_path / "table.md"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "accelerator.py")
    e = env()
    e.pop("KERAS_BACKEND")
    proc = subprocess.run([sys.executable, script, "--smoke", "--out", str(out)], env=e,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "## Errors" not in text, text
    rows = [line for line in text.splitlines() if line.startswith("| jax |")
            or line.startswith("| torch |")]
    # 2 lengths x 2 dtypes x 2 modes per backend, plus one ViT row each.
    assert sum(r.startswith("| jax |") for r in rows) == 9
    assert sum(r.startswith("| torch |") for r in rows) == 9
    assert "softmax sdpa flash" in text and "softmax xla" in text
